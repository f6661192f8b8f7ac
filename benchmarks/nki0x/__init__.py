"""NKI 0.x size benchmark (see run.py)."""
