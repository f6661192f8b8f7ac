"""The Program keeps its instruction stream in numpy columns and the profile makes
Instruction records only when read; the profiler's column view computed straight from the
Program must equal the one built from those records, and the records must follow the
Program (times from 0, bytes shared out over DMA pieces)."""

from __future__ import annotations

import numpy as np
import pytest

import nkikit as nki
import nkikit.language as nl
import nkikit.typing as nt
from nkikit.profiler.columns import Columns

from . import kernels as K

F32 = nl.float32
BF16 = nl.bfloat16

CASES = [
    (K.matmul_small, (nt.tensor[[256, 256], BF16], nt.tensor[[256, 512], BF16])),
    (K.spmd_exp[2], (nt.tensor[[256, 512], F32],)),
    (K.transpose_and_matmul, (nt.tensor[[128, 128], F32], nt.tensor[[128, 512], F32])),
    (K.hbm_round_trip, (nt.tensor[[128, 256], F32],)),
    (K.unrolled_matmuls, (nt.tensor[[512, 128], F32], nt.tensor[[128, 128], F32])),
]


def _assert_same(a: Columns, b: Columns) -> None:
    for name in Columns.__dataclass_fields__:
        if name == "memo":
            continue
        x, y = getattr(a, name), getattr(b, name)
        if isinstance(x, dict):
            assert x.keys() == y.keys(), name
            for k in x:
                assert np.array_equal(x[k], y[k]), (name, k)
        elif isinstance(x, np.ndarray):
            assert x.dtype.kind == y.dtype.kind and np.array_equal(x, y), name
        else:
            assert x == y, name


@pytest.mark.parametrize("kernel, specs", CASES)
def test_columns_from_the_program_equal_the_records(kernel, specs):
    program = nki.compile(kernel, *specs, target="trn2")
    prof = program.profile()
    records = list(prof.instructions)
    assert len(records) == len(program)
    _assert_same(prof.instructions.columns(), Columns.build(records))
    assert min(r.start_ns for r in records) == 0.0
    assert prof.total_us == pytest.approx(program.total_us)


def test_records_follow_the_program():
    program = nki.compile(K.load_act_store, nt.tensor[[128, 512], F32], target="trn2")
    prof = program.profile()
    t0 = float(program.start.min())
    for i in (0, len(program) - 1):
        r = prof.instructions[i]
        assert r.id == i and r.engine == program.engine[i]
        assert r.start_ns == pytest.approx(program.start[i] - t0)
        assert r.deps == program.deps[i] and isinstance(r.deps, tuple)
    # a DMA of 128 partitions is 16 pieces of 8; each carries its share of the bytes
    loads = [r for r in prof.instructions if r.opcode.startswith("DMA_HBM")]
    assert len(loads) == 16 and {r.partitions for r in loads} == {8}
    assert sum(r.hbm_read_bytes for r in loads) == 128 * 512 * 4
    assert prof.instructions[-1] == prof.instructions[len(program) - 1]
    with pytest.raises(IndexError):
        prof.instructions[len(program)]
