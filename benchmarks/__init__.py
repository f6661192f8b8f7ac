"""Speed benchmarks (``python -m benchmarks.sim``) and the peer implementations they compare with."""
