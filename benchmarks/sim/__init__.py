"""Simulator speed benchmark: NKI kernels, their numpy equivalents, and the runner."""
