"""What a traced kernel hands back: a kernel must produce something, and should write all of it.

Two checks on a traced, verified kernel (both dialects, ``JitKernel.specialize_for``):

- a kernel that returns nothing (or only ``None``s) and writes none of its arguments is an
  error at its ``def`` line (``err_kernel_has_no_output``): the usual cause is a forgotten
  ``return out``, and its result would otherwise be ``None`` or an empty object array;
- an output whose writes, over every loop iteration and program of the launch, stop short of
  its edges (or start past 0) is left partly unwritten, so part of what the caller gets is the
  poison of a fresh buffer (NaN). That is an :class:`~nkikit.errors.NkiWarning` at the
  ``def`` line; when an index depends on ``nl.program_id(k)`` the warning names the launch
  grid that would cover the output (the usual cause: ``kernel(...)`` where ``kernel[2](...)``
  was meant).

The coverage check is a bounding box of the written index ranges (``Affine.bounds``): it finds
an output written short of an edge, not a hole in the middle. Writes it cannot bound (indirect
or through a reshaped view, or in a loop with a run-time trip count) make it skip that output.
"""

from __future__ import annotations

import linecache
from dataclasses import dataclass, field, replace

from ..errors import ErrKernelHasNoOutput, SourceLoc, warn_at
from ..ir.affine import Axis, ProgramId, Sym
from ..ir.core import Access, Kernel, Loop, Op, Tensor


def check_outputs(kernel: Kernel) -> None:
    """Raise ``ErrKernelHasNoOutput`` for a kernel with no effect; warn about outputs that are
    not fully written (see the module docstring)."""
    loc = def_line(kernel.loc)
    if not kernel.outputs and not any(p.mutable for p in kernel.params):
        raise ErrKernelHasNoOutput(
            loc,
            kernel=kernel.name,
            returned="nothing" if kernel.return_structure is None else "no tensor",
        )
    for out, extent in _written_extents(kernel).items():
        message = _coverage_message(kernel, out, extent)
        if message is not None and loc is not None:
            warn_at(loc, message)


def def_line(loc: SourceLoc | None) -> SourceLoc | None:
    """The ``def`` line of the function whose first line (``co_firstlineno``: its first
    decorator) is ``loc``, so that a message points at the signature, not at ``@nki.jit``."""
    if loc is None:
        return None
    for line in range(loc.line, loc.line + 50):
        text = linecache.getline(loc.file, line).lstrip()
        if not text:
            break
        if text.startswith(("def ", "async def ")):
            return replace(loc, line=line)
    return loc


@dataclass
class _Extent:
    """Per dimension of an output: the lowest and highest index written, and the program-id
    terms (axis -> coefficient) of the writes that reach the highest."""

    lo: list[int]
    hi: list[int]
    pids: list[dict[int, int]] = field(default_factory=list)
    bounded: bool = True


def _written_extents(kernel: Kernel) -> dict[Tensor, _Extent]:
    outputs = {t.uid: t for t in kernel.outputs if t.base is None}
    extents: dict[Tensor, _Extent] = {}
    grid: dict[Sym, int] = {ProgramId(i): g for i, g in enumerate(kernel.grid)}

    def visit(body: list, ranges: dict[Sym, int], run_time_trip: bool) -> None:
        # an unrolled kernel writes its output through a few index tuples, again and again:
        # their extents in this loop context are worked out once (the ops keep them alive)
        seen: dict[tuple, list] = {}  # (id(index), shape) -> _extents
        for s in body:
            ts = type(s)
            if ts is Loop:
                inner = {**ranges, s.var: s.var.trip}
                visit(s.body, inner, run_time_trip or s.device is not None)
                continue
            if ts is not Op:
                continue
            for a in s.outs:
                root = a.tensor
                if root.base is not None:
                    root = root.root
                if root.uid not in outputs:
                    continue
                e = extents.get(root)
                if e is None:
                    n = len(root.shape)
                    e = extents[root] = _Extent([10**18] * n, [-1] * n)
                    e.pids = [{} for _ in range(n)]
                if a.tensor is not root or a.indirect is not None or run_time_trip or 0 in a.shape:
                    e.bounded = False
                    continue
                key = (id(a.index), a.shape)
                dims = seen.get(key)
                if dims is None:
                    dims = seen[key] = _extents(a, len(root.shape), ranges)
                for d, (lo, hi, pids) in enumerate(dims):
                    e.lo[d] = min(e.lo[d], lo)
                    if hi > e.hi[d]:
                        e.hi[d], e.pids[d] = hi, pids
                    elif hi == e.hi[d]:
                        e.pids[d] = {**e.pids[d], **pids}

    visit(kernel.body, grid, False)
    return {t: e for t, e in extents.items() if e.bounded}


def _extents(a: Access, n: int, ranges: dict[Sym, int]) -> list[tuple[int, int, dict[int, int]]]:
    """Per dimension of the first ``n`` of access ``a``: the lowest and highest index it
    reaches with loop symbols in ``ranges``, and the program-id terms (axis -> coefficient)."""
    out = []
    for x in a.index[:n]:
        sizes = {
            sym: (a.shape[sym.k] if isinstance(sym, Axis) else ranges.get(sym, 1))
            for sym, _ in x.terms
        }
        lo, hi = x.bounds(sizes)
        out.append((lo, hi, {sym.axis: c for sym, c in x.terms if isinstance(sym, ProgramId)}))
    return out


def _coverage_message(kernel: Kernel, out: Tensor, e: _Extent) -> str | None:
    for d, size in enumerate(out.shape):
        if e.lo[d] <= 0 and e.hi[d] >= size - 1:
            continue
        text = (
            f"kernel {kernel.name} writes output {out.name!r} (shape {list(out.shape)}) only at "
            f"indices [{e.lo[d]}, {e.hi[d]}] of dimension {d}; the rest of it is never written "
            "and reads as poison (NaN)"
        )
        grows = {k: c for k, c in e.pids[d].items() if c > 0}
        written = e.hi[d] - e.lo[d] + 1
        if e.hi[d] < size - 1 and not grows and kernel.unlaunched_program_ids:
            # launched without a grid, nl.program_id read 0: if the writes are one equal share
            # of the output, that many programs would cover it
            axis = kernel.unlaunched_program_ids[0]
            if e.lo[d] == 0 and size % written == 0:
                grid = ", ".join(["1"] * axis + [str(size // written)])
                text += (
                    f"; launched with grid (1,); the kernel indexes program_id({axis}), which is "
                    f"0 without a grid, and covers 1/{size // written} of it; did you mean "
                    f"{kernel.name}[{grid}]?"
                )
            return text
        if e.hi[d] < size - 1 and grows:
            axis, step = min(grows.items())
            launched = kernel.grid or (1,)
            dims = max(len(launched), axis + 1)
            have = [launched[i] if i < len(launched) else 1 for i in range(dims)]
            need = list(have)
            need[axis] = have[axis] - (-(size - 1 - e.hi[d]) // step)
            grid = ", ".join(str(g) for g in need)
            text += (
                f"; launched with grid {tuple(have)}; the kernel indexes program_id({axis}) up to "
                f"{need[axis] - 1} to write all of it; did you mean {kernel.name}[{grid}]?"
            )
        return text
    return None
