"""``nki.simulate_ranks(kernel, inputs_per_rank)``: run a kernel as several ranks, each on
its own inputs, and return every rank's results (the per-rank form of ``nki.simulate``).

A kernel with collectives called the ordinary way runs every rank of its world on the one
set of inputs given and returns rank 0's results (``nkikit/sim/ranks.py``); this entry point
is for data that differs per rank (a sharded tensor, a rank's own slice).  Every rank's
inputs must specialize the kernel alike (same shapes, dtypes and non-tensor arguments): the
ranks run one program.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..arrays import TensorSpec, as_kind_of, as_numpy
from ..errors import NkiError, hide_internal_frames
from ..sim import low_precision_storage
from ..trace.jit import gc_paused
from .jit import Kernel0x, jit, precise_fp


def simulate_ranks(kernel, inputs_per_rank: Sequence[Mapping], lnc: int = 1) -> list:
    """Run ``kernel`` (launched on ``lnc`` logical cores) as ranks ``0 .. n - 1``, rank ``r``
    called with the keyword arguments ``inputs_per_rank[r]``; returns each rank's return
    value (numpy arrays, or torch tensors for torch inputs).  Arrays the kernel writes in
    place are written per rank.  ``n`` must cover every rank the kernel's replica groups
    name."""
    from ..sim import simulate_all_ranks

    k: Kernel0x = jit(kernel)
    if int(lnc) > 1:
        k = k[int(lnc)]
    if not inputs_per_rank:
        raise ValueError("simulate_ranks: give the inputs of at least one rank")
    try:
        specs = [k.specialize(**dict(kw)) for kw in inputs_per_rank]
        ir = specs[0][0]
        for r, (other, _) in enumerate(specs):
            if other is not ir:
                raise ValueError(
                    f"simulate_ranks: rank {r}'s inputs specialize {ir.name} differently from "
                    "rank 0's (shapes, dtypes and non-tensor arguments must agree)"
                )
        arrays = []
        for _, bound in specs:
            row = []
            for t in ir.params:
                v = bound.arguments[t.name]
                if isinstance(v, TensorSpec):
                    raise TypeError(f"argument {t.name!r} is abstract; pass an array")
                row.append(as_numpy(v, t.dtype))
            arrays.append(row)
        with gc_paused(), low_precision_storage(ir, precise=precise_fp()) as store:
            outs = simulate_all_ranks(ir, [store(row) for row in arrays])
    except NkiError as e:
        raise hide_internal_frames(e) from None

    def build(s, results):
        if s is None:
            return None
        if isinstance(s, int):
            return results[s]
        if isinstance(s, dict):
            return {key: build(x, results) for key, x in s.items()}
        return type(s)(build(x, results) for x in s)

    values = []
    for (_, bound), o in zip(specs, outs):
        like = next((bound.arguments[t.name] for t in ir.params), None)
        values.append(build(ir.return_structure, [as_kind_of(x, like) for x in o]))
    return values
