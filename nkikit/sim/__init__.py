"""The numpy simulator of the IR.

Two executors with the same contract and bit-identical results: ``interp`` (the reference
interpreter, one instruction at a time) and ``fast`` (the kernel compiled once to a
straight-line numpy program).  ``simulate`` picks one by the ``NKIKIT_SIM`` environment
variable: ``fast`` (the default), ``reference``, or ``check`` (run both, raise
``SimulatorMismatch`` unless outputs and written arguments are bit-identical; for CI).
``low_precision_storage`` holds bf16 and fp8 tensors as unrounded fp32 for a run, as AWS's
simulator does under ``NKI_PRECISE_FP=0``.
A kernel with collectives runs as every rank of its world, each with its own memory, meeting
at the collectives (``ranks.py``); ``simulate_all_ranks`` gives each rank its own arguments.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np

from .. import dtypes
from ..errors import NkiError
from .ranks import simulate_ranks, simulate_world, world_size

SIMULATORS = ("reference", "fast", "check")


class SimulatorMismatch(AssertionError):
    """The fast simulator disagreed with the reference interpreter (a bug in nkikit)."""


def simulate(kernel, args: list[np.ndarray], *, seed: int = 0) -> list[np.ndarray]:
    """Run ``kernel`` on ``args`` with the simulator ``NKIKIT_SIM`` names."""
    mode = os.environ.get("NKIKIT_SIM", "fast") or "fast"
    if mode == "fast":
        from .fast import simulate as run
    elif mode == "reference":
        from .interp import simulate as run
    elif mode == "check":
        return check_simulate(kernel, args, seed=seed)
    else:
        raise ValueError(f"NKIKIT_SIM={mode!r}: expected one of {', '.join(SIMULATORS)}")
    if world_size(kernel) > 1:
        return simulate_world(kernel, args, run, seed=seed)
    return run(kernel, args, seed=seed)


def _on_every_rank(run):
    """``run`` (one rank's simulator) for any kernel: a kernel with collectives runs as every
    rank of its world on the same arguments, returning rank 0's outputs (``ranks.py``)."""

    def on_world(kernel, args, *, seed: int = 0):
        if world_size(kernel) > 1:
            return simulate_world(kernel, args, run, seed=seed)
        return run(kernel, args, seed=seed)

    return on_world


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal dtype, shape and values, NaN equal to NaN (the differential-testing contract)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype.kind in "iub":
        return bool(np.array_equal(a, b))
    return bool(
        np.array_equal(np.asarray(a, np.float64), np.asarray(b, np.float64), equal_nan=True)
    )


def check_simulate(kernel, args: list[np.ndarray], *, seed: int = 0) -> list[np.ndarray]:
    """Run both simulators (the fast one on copies of ``args``) and return the reference's
    outputs; raise ``SimulatorMismatch`` if anything differs, including which one raised."""
    from .fast import simulate as fast_one
    from .interp import Interpreter

    def ref_one(kernel, args, *, seed, rank=0, world=None):
        # the class, not interp.simulate: tests may route that name here
        return Interpreter(kernel, seed=seed, rank=rank, world=world).run(args)

    ref_simulate, fast_simulate = _on_every_rank(ref_one), _on_every_rank(fast_one)

    copies = [a.copy() for a in args]
    try:
        ref = ref_simulate(kernel, args, seed=seed)
    except Exception as e:
        try:
            fast_simulate(kernel, copies, seed=seed)
        except type(e):
            raise e from None
        raise SimulatorMismatch(
            f"{kernel.name}: the reference raised {e!r}, the fast path did not"
        ) from e
    got = fast_simulate(kernel, copies, seed=seed)
    for i, (r, g) in enumerate(zip(ref, got)):
        if not same_bits(r, g):
            raise SimulatorMismatch(f"{kernel.name}: output {i} differs between the simulators")
    for t, a, c in zip(kernel.params, args, copies):
        if not same_bits(a, c):
            raise SimulatorMismatch(f"{kernel.name}: argument {t.name!r} written differently")
    return ref


def written_params(kernel) -> frozenset[str]:
    """Names of the parameters some instruction of ``kernel`` writes.  The simulators never
    write any other argument and never return a view of one, so a caller needs to copy
    only these to protect its arrays."""
    return kernel.derived("written_params", _written_params)


def _written_params(kernel) -> frozenset[str]:
    written = {o.tensor.root.uid for op, _ in kernel.ops() for o in op.outs}
    return frozenset(t.name for t in kernel.params if t.uid in written)


def simulate_all_ranks(
    kernel, args_per_rank: list[list[np.ndarray]], *, seed: int = 0
) -> list[list[np.ndarray]]:
    """Run ``kernel`` as ranks ``0 .. len(args_per_rank) - 1`` (rank ``r`` on
    ``args_per_rank[r]``, written in place) with the simulator ``NKIKIT_SIM`` names; returns
    every rank's outputs.  ``check`` runs both simulators (the fast one on copies) and raises
    ``SimulatorMismatch`` unless every rank's outputs and arguments are bit-identical."""
    from .fast import simulate as fast_one
    from .interp import simulate as ref_one

    mode = os.environ.get("NKIKIT_SIM", "fast") or "fast"
    if mode not in SIMULATORS:
        raise ValueError(f"NKIKIT_SIM={mode!r}: expected one of {', '.join(SIMULATORS)}")
    if mode != "check":
        run = fast_one if mode == "fast" else ref_one
        return simulate_ranks(kernel, args_per_rank, run, seed=seed)
    copies = [[a.copy() for a in args] for args in args_per_rank]
    ref = simulate_ranks(kernel, args_per_rank, ref_one, seed=seed)
    got = simulate_ranks(kernel, copies, fast_one, seed=seed)
    for r, (ro, go) in enumerate(zip(ref, got)):
        for i, (a, b) in enumerate(zip(ro, go)):
            if not same_bits(a, b):
                raise SimulatorMismatch(
                    f"{kernel.name}: output {i} of rank {r} differs between the simulators"
                )
        for t, a, c in zip(kernel.params, args_per_rank[r], copies[r]):
            if not same_bits(a, c):
                raise SimulatorMismatch(
                    f"{kernel.name}: argument {t.name!r} of rank {r} written differently"
                )
    return ref


@contextmanager
def low_precision_storage(kernel, *, precise: bool) -> Iterator[Callable[[list], list]]:
    """How the simulators hold ``kernel``'s bf16 and fp8 tensors during the block: rounded to
    their dtype (``precise``, ``NKI_PRECISE_FP=1``, the default) or as unrounded fp32
    (``NKI_PRECISE_FP=0``, AWS's simulator option [reference/nki-0x.md §6.1]; outputs of
    those dtypes come back as float32 arrays).  The block gets ``store``: a list of arguments
    as the simulators hold them (fp32 copies of bf16 / fp8 arrays in the wide mode, whose
    written ones are copied back into the caller's arrays, rounded once, when the block
    ends).  Held as fp32, such a tensor's bits cannot be reinterpreted: a kernel that views
    one as another dtype (``.view(dtype)``, ``.ap(dtype=...)``) is refused with
    ``err_unsupported_api`` at the view's line."""
    if precise:
        yield lambda args: args
        return
    for t in kernel.tensors:
        base = t.base
        if base is None or dtypes.name(t.dtype) == dtypes.name(base.dtype):
            continue
        if t.dtype in dtypes.WIDENED or base.dtype in dtypes.WIDENED:
            raise NkiError(
                "err_unsupported_api",
                t.loc or kernel.loc,
                api=f"a {dtypes.name(base.dtype)} tensor seen as {dtypes.name(t.dtype)} "
                "under NKI_PRECISE_FP=0",
                why="that mode holds bf16 and fp8 tensors as fp32 values, which have no "
                "bf16/fp8 bits to reinterpret; unset NKI_PRECISE_FP (or set it to 1)",
            )
    stored: list[tuple[list, list]] = []  # (the caller's arguments, the simulators')

    def store(args: list) -> list:
        held = [dtypes.widen(a) for a in args]
        stored.append((args, held))
        return held

    with dtypes.wide_storage():
        yield store
    written = written_params(kernel)
    for args, held in stored:
        for t, a, w in zip(kernel.params, args, held):
            if w is not a and t.name in written:
                np.copyto(a, w, casting="unsafe")
