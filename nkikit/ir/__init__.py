"""The IR: data model (core), affine indices, printer and verifier."""
