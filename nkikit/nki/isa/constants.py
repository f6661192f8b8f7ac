"""``nki.isa.constants``: the ISA's enums (the NKI Library imports them from here)."""

from ...isa import dge_mode, engine, matmul_perf_mode, nc_version, oob_mode, reduce_cmd

__all__ = ["dge_mode", "engine", "matmul_perf_mode", "nc_version", "oob_mode", "reduce_cmd"]
