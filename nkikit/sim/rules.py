"""Simulation rules: one numpy implementation per IR primitive, in ``RULES``.

A rule gets the op, its inputs (fp32 arrays for tiles, Python floats for immediates; arrays
in their storage dtype for the primitives whose record says they move raw bits, ``raw``)
and a :class:`Ctx`, and returns one array per output (None: that output is not written by
the interpreter).  Everything a rule needs beyond its inputs comes through the context:
the op's mask, the loop and program values, the call's seed, the destination's old value
(PSUM accumulation, a shuffle that keeps partitions) and atomic read-modify-write.  So the
interpreter's loop never asks which primitive it runs; rounding to the output dtype and
masking the write are its job.  The fast simulator (``fast/``) calls the same rules.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

import numpy as np

from .. import dtypes
from ..errors import NkiError
from ..ir import prims
from ..ir.affine import Sym, axis_env
from ..ir.core import Op
from . import mx
from .activations import activate, warn_out_of_range
from .alu import alu, reduce


class Ctx(Protocol):
    """What a rule may look at besides its inputs.

    ``valid``: the op's mask over its tile (its first input's for the primitives that mask
    their input), or None; ``env``: the values of the loop variables and program ids in
    scope; ``seed``: the kernel call's seed."""

    valid: np.ndarray | None
    env: Mapping[Sym, int]
    seed: int

    def dst(self, i: int) -> np.ndarray:
        """The old value of output ``i``, read as an input would be (fp32; storage dtype
        for ``raw`` primitives), unmasked."""
        ...

    @property
    def rank(self) -> int:
        """The rank running the kernel (0 unless ``sim/ranks.py`` runs several)."""
        ...

    def exchange(self, value: np.ndarray, members: tuple[int, ...]) -> dict[int, np.ndarray]:
        """Deposit ``value`` with the ranks ``members`` (this one included) at this op and
        return every member's value, once all have arrived (``sim/ranks.py``)."""
        ...

    def rmw(self, i: int, op: str, value: np.ndarray) -> np.ndarray | None:
        """Atomic ``dst = op(dst, value)`` of output ``i`` in fp32: the new value to write,
        or None when the update was applied in place (an indirect destination, where rows
        sharing an index apply one after another)."""
        ...


Rule = Callable[[Op, list, Ctx], list]
RULES: dict[str, Rule] = {}


def rule(name: str):
    def deco(fn: Rule) -> Rule:
        RULES[name] = fn
        return fn

    return deco


def _free_reduce(name: str, x: np.ndarray, valid) -> np.ndarray:
    axes = tuple(range(1, x.ndim))
    return reduce(name, x, axes, True, valid).reshape(x.shape[0], 1)


@rule("dma_copy")
def _dma(op, ins, ctx):
    rmw = op.attrs["rmw_op"]
    return [ins[0]] if rmw is None else [ctx.rmw(0, rmw, ins[0])]


@rule("tensor_copy")
def _copy(op, ins, ctx):
    return [ins[0]]


@rule("partition_broadcast")
def _pbcast(op, ins, ctx):
    return [np.broadcast_to(ins[0], op.outs[0].shape)]


@rule("memset")
def _memset(op, ins, ctx):
    return [np.full(op.outs[0].shape, op.attrs["value"], dtype=np.float32)]


@rule("iota")
def _iota(op, ins, ctx):
    shape = op.outs[0].shape
    env = {**ctx.env, **axis_env(shape)}  # loop variables and program ids as well as the axes
    return [np.broadcast_to(np.asarray(op.attrs["expr"].evaluate(env)), shape).astype(np.float64)]


@rule("nc_matmul")
def _matmul(op, ins, ctx):
    # (partitions, free) operands; an indirect operand's tile splits its free axis into
    # snake groups (trace/indirection.py), which flatten back in order
    s, m = (x if x.ndim == 2 else x.reshape(x.shape[0], -1) for x in ins)
    y = np.matmul(s.T, m, dtype=np.float32)
    if op.attrs["accumulate"]:  # PSUM accumulates in fp32: old + new, one rounding
        return [ctx.dst(0).reshape(y.shape) + y]
    return [y]


@rule("nc_matmul_mx")
def _matmul_mx(op, ins, ctx):
    # raw: containers and scales arrive as their bits, the free dims flattened by the front end
    st, mv, st_scale, mv_scale = (np.asarray(x).reshape(x.shape[0], -1) for x in ins)
    y = mx.matmul(st, mv, st_scale, mv_scale, op.ins[0].dtype, op.ins[1].dtype)
    if op.attrs["accumulate"]:  # PSUM accumulates in fp32: old + new, one rounding
        return [np.asarray(ctx.dst(0), dtype=np.float32).reshape(y.shape) + y]
    return [y]


@rule("quantize_mx")
def _quantize_mx(op, ins, ctx):
    dst, dst_scale = op.outs
    src = np.asarray(ins[0])
    data, rows = mx.quantize(src.reshape(src.shape[0], -1), dst.dtype)
    scale = mx.place_scales(np.asarray(ctx.dst(1)), rows, dtypes.storage_dtype(dst_scale.dtype))
    return [data, scale]


@rule("nc_transpose")
def _transpose(op, ins, ctx):
    return [ins[0].T]


@rule("activation")
def _activation(op, ins, ctx):
    data, bias, scale = ins
    arg = (
        data * scale + bias if (scale != 1.0 if isinstance(scale, float) else True) else data + bias
    )
    warn_out_of_range(op.attrs["op"], arg, op.loc, ctx.valid)
    y = activate(op.attrs["op"], arg)
    outs = [y]
    if op.attrs.get("reduce_op"):
        outs.append(_free_reduce(op.attrs["reduce_op"], np.asarray(y, dtype=np.float32), ctx.valid))
    return outs


def _column_of(x, p: int):
    """A scalar operand as a (P, 1) fp32 column (an immediate broadcasts to every partition)."""
    return np.broadcast_to(np.asarray(x, dtype=np.float32).reshape(-1, 1), (p, 1))


@rule("activate2")
def _activate2(op, ins, ctx):
    # (data op0 imm0) op1 imm1 in fp32, a bypass stage skipped, then the activation function
    # with relu_param (prelu's slope) [nki-0x.md §4.10 activate2]
    data, imm0, imm1, relu = ins
    a = op.attrs
    v = np.asarray(data, dtype=np.float32)
    if a["op0"] != "bypass":
        v = np.asarray(alu(a["op0"], v, imm0, a["reverse0"]), dtype=np.float32)
    if a["op1"] != "bypass":
        v = np.asarray(alu(a["op1"], v, imm1, a["reverse1"]), dtype=np.float32)
    warn_out_of_range(a["op"], v, op.loc, ctx.valid)
    y = activate(a["op"], v, relu)
    outs = [y]
    if len(op.outs) > 1:
        outs.append(_free_reduce(a["reduce_op"], np.asarray(y, dtype=np.float32), ctx.valid))
    return outs


@rule("exponential")
def _exponential(op, ins, ctx):
    # exp(src - max_value) in fp32, and the row sum of that fp32 result [nki-0x.md §4.6]
    src, max_value = ins
    with np.errstate(over="ignore", invalid="ignore"):
        y = np.exp(np.asarray(np.asarray(src, dtype=np.float32) - max_value, dtype=np.float32))
    outs = [y]
    if len(op.outs) > 1:
        outs.append(_free_reduce("add", y, ctx.valid))
    return outs


@rule("tensor_scalar_cumulative")
def _cumulative(op, ins, ctx):
    # reg = op1(op0(src[i], imm0), reg); dst[i] = reg, the register held in fp32 and rounded
    # at every step as the hardware's is [nki-0x.md §4.6 tensor_scalar_cumulative]
    src, imm0, init = ins
    p = src.shape[0]
    x = np.asarray(src, dtype=np.float32).reshape(p, -1)
    v = np.asarray(alu(op.attrs["op0"], x, _column_of(imm0, p)), dtype=np.float32)
    op1 = op.attrs["op1"]
    reg = _column_of(init, p).astype(np.float32)
    out = np.empty_like(v)
    for i in range(v.shape[1]):
        reg = np.asarray(alu(op1, v[:, i : i + 1], reg), dtype=np.float32)
        out[:, i : i + 1] = reg
    outs = [out.reshape(op.outs[0].shape)]
    if len(op.outs) > 1:
        outs.append(reg)
    return outs


@rule("tensor_tensor")
def _tt(op, ins, ctx):
    return [alu(op.attrs["op"], ins[0], ins[1])]


@rule("tensor_scalar")
def _ts(op, ins, ctx):
    a = op.attrs
    y = alu(a["op0"], ins[0], ins[1], a["reverse0"])
    if a.get("op1"):
        y = alu(a["op1"], y, ins[2], a["reverse1"])
    outs = [y]
    if a.get("reduce_op"):
        outs.append(_free_reduce(a["reduce_op"], np.asarray(y, dtype=np.float32), ctx.valid))
    return outs


@rule("scalar_tensor_tensor")
def _stt(op, ins, ctx):
    a = op.attrs
    y = alu(a["op0"], ins[0], ins[1], a["reverse0"])
    return [alu(a["op1"], y, ins[2], a["reverse1"])]


@rule("tensor_reduce")
def _reduce(op, ins, ctx):
    a = op.attrs
    y = reduce(a["op"], ins[0], a["axes"], True, ctx.valid)
    if a["negate"]:
        y = -y
    return [y]


@rule("tensor_partition_reduce")
def _preduce(op, ins, ctx):
    name = op.attrs["op"]
    if name != "average":
        return [reduce(name, ins[0], 0, True, ctx.valid)]
    # nl.average: the add reduction, divided in fp32 by the partitions it reads (those the
    # mask keeps, per element) [nki-0x.md §4.9]
    total = np.asarray(reduce("add", ins[0], 0, True, ctx.valid), dtype=np.float32)
    if ctx.valid is None:
        return [total / np.float32(ins[0].shape[0])]
    count = np.broadcast_to(ctx.valid, ins[0].shape).sum(axis=0, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        return [total / count.astype(np.float32)]


@rule("tensor_tensor_scan")
def _scan(op, ins, ctx):
    d0, d1, init = ins
    op0, op1 = op.attrs["op0"], op.attrs["op1"]
    p = d0.shape[0]
    d0 = d0.reshape(p, -1)
    d1 = d1.reshape(p, -1)
    out = np.empty_like(d0, dtype=np.float32)
    r = np.broadcast_to(
        np.asarray(init, dtype=np.float32).reshape(-1, 1)
        if not isinstance(init, float)
        else np.float32(init),
        (p, 1),
    ).astype(np.float32)
    # step by step: the hardware rounds the running value to fp32 at every element
    for i in range(d0.shape[1]):
        r = alu(op1, alu(op0, d0[:, i : i + 1], r), d1[:, i : i + 1]).astype(np.float32)
        out[:, i : i + 1] = r
    return [out.reshape(op.outs[0].shape)]


@rule("reciprocal")
def _recip(op, ins, ctx):
    with np.errstate(divide="ignore"):
        return [1.0 / ins[0]]


@rule("select")
def _select(op, ins, ctx):
    c, x, y = ins
    return [np.where(c != 0, x, y)]


@rule("range_select")
def _range_select(op, ins, ctx):
    data, b0, b1 = ins
    a = op.attrs
    idx = (
        np.arange(data.shape[-1], dtype=np.float32).reshape((1,) * (data.ndim - 1) + (-1,))
        + a["range_start"]
    )
    keep = (alu(a["comp_op0"], idx, b0) != 0) & (alu(a["comp_op1"], idx, b1) != 0)
    y = np.where(keep, data, np.float32(a["on_false"]))
    outs = [y]
    if len(op.outs) > 1:
        outs.append(_free_reduce(a["reduce_op"], y, ctx.valid))
    return outs


@rule("select_reduce")
def _select_reduce(op, ins, ctx):
    p, t, f = ins
    cond = (p != 0) ^ op.attrs["reverse"]
    y = np.where(cond, t, f)
    outs = [y]
    if len(op.outs) > 1:
        outs.append(_free_reduce(op.attrs["reduce_op"], np.asarray(y, dtype=np.float32), ctx.valid))
    return outs


@rule("bn_stats")
def _bn_stats(op, ins, ctx):
    x = ins[0].reshape(ins[0].shape[0], -1).astype(np.float64)
    valid = ctx.valid
    v = (
        np.ones_like(x, dtype=bool)
        if valid is None
        else np.broadcast_to(valid, ins[0].shape).reshape(x.shape)
    )
    out = np.empty((x.shape[0], 6), dtype=np.float64)
    for half in (0, 1):
        xs, vs = x[:, half::2], v[:, half::2]
        n = vs.sum(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = np.where(vs, xs, 0).sum(axis=1) / np.maximum(n, 1)
            m2 = np.where(vs, (xs - mean[:, None]) ** 2, 0).sum(axis=1)
        out[:, 3 * half] = n
        out[:, 3 * half + 1] = mean
        out[:, 3 * half + 2] = m2
    return [out]


@rule("bn_aggr")
def _bn_aggr(op, ins, ctx):
    s = ins[0].reshape(ins[0].shape[0], -1, 3).astype(np.float64)
    n, mean, m2 = s[..., 0], s[..., 1], s[..., 2]
    total = n.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        mu = (n * mean).sum(axis=1) / total
        var = (m2 + n * (mean - mu[:, None]) ** 2).sum(axis=1) / total
    return [np.stack([mu, var], axis=1)]


@rule("max8")
def _max8(op, ins, ctx):
    x = ins[0].reshape(ins[0].shape[0], -1)
    return [-np.sort(-x, axis=1)[:, :8]]


@rule("nc_find_index8")
def _find8(op, ins, ctx):
    # a value repeated in vals takes the value's successive occurrences in data, in
    # ascending order across the columns (the first copy the first occurrence, the second
    # the next, ...); a copy with no occurrence left, like a value not in data, gets the
    # all-ones sentinel [ISA nc_match_replace8, nc_find_index8]
    x = ins[0].reshape(ins[0].shape[0], -1)
    vals = ins[1].reshape(ins[1].shape[0], -1)[:, :8]
    out = np.full(vals.shape, np.iinfo(np.uint32).max, dtype=np.float64)
    for j in range(vals.shape[1]):
        hit = x == vals[:, j : j + 1]
        # how many earlier columns hold the same value: this column takes the next occurrence
        rank = (vals[:, :j] == vals[:, j : j + 1]).sum(axis=1, keepdims=True)
        nth = hit & (np.cumsum(hit, axis=1) == rank + 1)
        found = nth.any(axis=1)
        out[found, j] = nth.argmax(axis=1)[found]
    return [out]


@rule("nc_match_replace8")
def _replace8(op, ins, ctx):
    # vals are matched last column first (i = 7, ..., 0), each replacing the first occurrence
    # still in the data: a value repeated in vals pairs its first occurrence with its highest
    # column [ISA nc_match_replace8, the opposite of nc_find_index8's order]
    x = ins[0].reshape(ins[0].shape[0], -1).copy()
    vals = ins[1].reshape(ins[1].shape[0], -1)[:, :8]
    idx = np.zeros(vals.shape, dtype=np.float64)
    rows = np.arange(x.shape[0])
    for j in reversed(range(vals.shape[1])):
        hit = x == vals[:, j : j + 1]
        found = hit.any(axis=1)
        pos = hit.argmax(axis=1)
        x[rows[found], pos[found]] = op.attrs["imm"]
        idx[:, j] = pos
    outs = [x.reshape(op.outs[0].shape)]
    if len(op.outs) > 1:
        outs.append(idx)
    return outs


@rule("nc_stream_shuffle")
def _shuffle(op, ins, ctx):
    # within every 32-partition quadrant, partition i takes the quadrant's partition mask[i]
    # (the same mask for every quadrant); 255 keeps the destination's partition [ISA]
    dst = ctx.dst(0).copy()
    # partition by partition: the two sides may lay out their free elements in other shapes
    rows = dst.reshape(dst.shape[0], -1)
    src = np.asarray(ins[0]).reshape(ins[0].shape[0], -1)
    mask = op.attrs["shuffle_mask"]
    for i in range(rows.shape[0]):
        m = mask[i % 32] if i % 32 < len(mask) else 255
        if m != 255:
            rows[i] = src[(i // 32) * 32 + m]
    return [dst]


@rule("local_gather")
def _local_gather(op, ins, ctx):
    # each GpSimd core (16 partitions) reads its partitions' indices column by column (the
    # first num_valid_indices of index[16c:16c+16].flatten(order="F")), and every partition of
    # the core takes, for each of them, num_elem_per_idx elements of its own src row starting
    # at that element offset [ISA local_gather, its NumPy model in the SDK test].  Out-of-row
    # offsets are undefined on hardware; the simulator reads the row's nearest element.
    src, index = ins
    p = src.shape[0]
    per = op.attrs["num_elem_per_idx"]
    used = prims.local_gather_indices(index.shape, op.attrs["num_valid_indices"])
    flat_src = src.reshape(p, -1)
    idx = index.reshape(index.shape[0], -1).astype(np.int64)
    out = np.zeros((p, used * per), dtype=src.dtype)
    chunk = np.arange(per)
    for g in range(0, p, 16):
        offsets = idx[g : g + 16].flatten(order="F")[:used]
        at = np.clip(offsets[:, None] + chunk[None, :], 0, flat_src.shape[1] - 1).reshape(-1)
        out[g : g + 16] = flat_src[g : g + 16][:, at]
    return [out]


@rule("nc_n_gather")
def _n_gather(op, ins, ctx):
    data, indices = ins
    p = data.shape[0]
    flat = data.reshape(p, -1)
    idx = indices.reshape(p, -1).astype(np.int64)
    bad = (idx < 0) | (idx >= flat.shape[1])
    if bad.any():
        at = tuple(int(i[0]) for i in np.nonzero(bad))
        raise NkiError(
            "err_tensor_access_out_of_bound",
            op.loc,
            tensor=op.ins[0].tensor.name,
            dim=1,
            index=f"{int(idx[at])} (indices hold it for partition {at[0]}, column {at[1]})",
            size=flat.shape[1],
        )
    return [np.take_along_axis(flat, idx, axis=1)]


@rule("sequence_bounds")
def _sequence_bounds(op, ins, ctx):
    # per element: the first position of its segment id and one past the last one; padding
    # (id 0) gets start n and end -1 [nki-0x.md §4.7].  Reading: a segment is every element
    # with that id (the reference's example, with contiguous ids, cannot tell this apart from
    # "the contiguous run"; both agree on the sorted ids segment_ids are).
    ids = np.asarray(ins[0]).reshape(ins[0].shape[0], -1)
    p, n = ids.shape
    out = np.empty((p, 2, n), dtype=np.float64)
    pos = np.arange(n)
    for r in range(p):
        row = ids[r]
        start = np.full(n, n, dtype=np.int64)
        end = np.full(n, -1, dtype=np.int64)
        for sid in np.unique(row[row != 0]):
            if sid != sid:
                continue  # a NaN id equals no id, itself included: below
            at = pos[row == sid]
            start[at], end[at] = at[0], at[-1] + 1
        lone = pos[row != row]  # each NaN id is a segment of its one element
        start[lone], end[lone] = lone, lone + 1
        out[r, 0], out[r, 1] = start, end
    return [out.reshape(op.outs[0].shape)]


@rule("topk")
def _topk(op, ins, ctx):
    # each 16-partition group holds n elements "snake"-wise: element e at partition e % 16,
    # column e // 16.  Every partition of the group receives the group's K largest values in
    # ascending order and their element numbers e [nki-0x.md §4.8 topk].  Readings where the
    # reference is silent: each partition of a group gets the same result; among equal values
    # the lower element number ranks higher (so it comes later in the ascending output).
    src = np.asarray(ins[0], dtype=np.float32)
    p = src.shape[0]
    flat = src.reshape(p, -1)
    n, k = op.attrs["n"], op.attrs["k"]
    e = np.arange(n)
    vals = np.empty((p, k), dtype=np.float32)
    idx = np.empty((p, k), dtype=np.float64)
    for g in range(0, p, 16):
        group = flat[g : g + 16]
        x = group[e % 16, e // 16]
        best = np.lexsort((e, -x))[:k][::-1]
        vals[g : g + 16] = x[best]
        idx[g : g + 16] = best
    return [vals.reshape(op.outs[0].shape), idx.reshape(op.outs[1].shape)]


@rule("nonzero_with_count")
def _nonzero_with_count(op, ins, ctx):
    # one GpSimd core per 16 partitions reads and writes only its first partition; the rest
    # of dst keeps its value [nki-0x.md §4.8 nonzero_with_count]
    src = ins[0]
    p = src.shape[0]
    flat = src.reshape(p, -1)
    n = flat.shape[1]
    out = ctx.dst(0).reshape(p, -1).copy()
    offset, pad = op.attrs["index_offset"], op.attrs["padding_val"]
    for q in range(0, p, 16):
        (hits,) = np.nonzero(flat[q])
        row = np.full(n + 1, pad, dtype=np.int64)
        row[: hits.size] = hits + offset
        row[n] = hits.size
        out[q] = row.astype(out.dtype)
    return [out]


@rule("affine_select")
def _affine_select(op, ins, ctx):
    shape = op.outs[0].shape
    pred = op.attrs["pred"].evaluate({**ctx.env, **axis_env(shape)})
    keep = np.broadcast_to(np.asarray(pred, dtype=bool), shape)
    return [np.where(keep, ins[0], np.float32(op.attrs["on_false"]))]


@rule("device_print")
def _print(op, ins, ctx):
    print(op.attrs["prefix"], np.asarray(ins[0]))
    return []


# the rules of registers, rank_id and the collectives (they ask the context for the rank)
from . import collective_rules as _collective_rules  # noqa: E402, F401

# the random number instructions and NkiScalar arithmetic (state carried in IR tensors)
from . import state_rules as _state_rules  # noqa: E402, F401
