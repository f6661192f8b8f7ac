"""The benchmark's algorithms written for other systems (Triton's CPU interpreter)."""
