"""Calibration of nkikit's cost model against published NKI measurements (nki.md §5)."""
