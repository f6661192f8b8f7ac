"""Random NKI Beta-1 kernels, legal and illegal, checked against a numpy model of the same
computation: a fuzzer for the front end, the verifier and the simulator together.

``random_kernels()`` is a hypothesis strategy that writes a small kernel as Python source --
loads of random (sometimes out-of-range) slices of its inputs, elementwise operations,
reductions over random axes, matmuls and transposes of random shapes, in random dtypes, and now
and then a misuse (an argument of the wrong type, an axis the tile does not have, ...) -- and
computes, step by step, what a numpy model says it must return, or which line must be rejected.

``check_random_kernel(case)`` runs it and asserts the front end's contract (issue #12):

- a legal kernel returns what the model returns (within the tolerance of its dtypes);
- an illegal kernel raises an ``NkiError`` located at its bad line: never another exception
  type (an internal error) and never a silent run (e.g. an out-of-bounds slice clamped away).

Its outcome (``"match"`` or the NKI error name) lets a test count what it exercised.  The
source is compiled under a file name of its own (registered with ``linecache``), so the kernel
has lines an error can point at, and a failure prints the whole kernel.
"""

from __future__ import annotations

import hashlib
import linecache
from dataclasses import dataclass, field

import numpy as np
from hypothesis import strategies as st

from .. import dtypes
from ..errors import NkiError
from .inputs import random_inputs

PMAX = 128
MOVING_FMAX = 512
STATIONARY_FMAX = 128
DTYPES = ("float32", "bfloat16", "float16")
# rounding error allowed per step, relative to the result's scale: a few ulps of the dtype
_ULPS = {"float32": 2.0**-20, "bfloat16": 2.0**-6, "float16": 2.0**-9}


@dataclass
class Tile:
    """What the model knows about one tile of the kernel: its variable name, the value it
    must hold (float64, already rounded to its dtype), its dtype and memory."""

    name: str
    value: np.ndarray
    dtype: str
    psum: bool = False

    @property
    def shape(self) -> tuple[int, int]:
        return self.value.shape  # type: ignore[return-value]


@dataclass
class RandomKernel:
    """A generated kernel: its source lines, its inputs, and what the model expects --
    ``expected`` (the output, for a legal kernel) or ``bad_line`` (the 1-based line of the
    source an ``NkiError`` must point at) with the error names the step may raise."""

    lines: list[str]
    inputs: list[np.ndarray]
    expected: np.ndarray | None = None
    bad_line: int | None = None
    errors: tuple[str, ...] = ()
    what: str = ""
    rtol: float = 0.0
    window: tuple[int, int] = (0, 0)
    steps: list[str] = field(default_factory=list)

    @property
    def source(self) -> str:
        return "\n".join(self.lines) + "\n"

    def build(self):
        """The kernel as an ``nki.jit`` function, compiled from ``source``."""
        import nkikit as nki
        import nkikit.isa as nisa
        import nkikit.language as nl

        text = self.source
        # named by its text: a replayed example gets the same file name (hypothesis compares
        # the locations of the failures it replays)
        filename = f"<nkikit-random-kernel-{hashlib.sha1(text.encode()).hexdigest()[:12]}>"
        # a cache entry without an mtime: linecache.checkcache keeps it
        linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
        scope = {"nl": nl, "nisa": nisa, "np": np}
        exec(compile(text, filename, "exec"), scope)  # noqa: S102 - our own generated source
        return nki.jit(scope["kernel"])

    def __repr__(self) -> str:
        shapes = ", ".join(f"{a.shape} {dtypes.name(a.dtype)}" for a in self.inputs)
        want = f"error at line {self.bad_line} ({self.what})" if self.bad_line else "a match"
        numbered = "\n".join(f"{i + 1:3d}  {line}" for i, line in enumerate(self.lines))
        return f"RandomKernel(inputs: {shapes}; expects {want})\n{numbered}"


def _round(x: np.ndarray, dtype: str) -> np.ndarray:
    """``x`` rounded once to ``dtype`` (through fp32, as an engine writes), as float64."""
    f = np.asarray(x, dtype=np.float32)
    return dtypes.cast(f, dtypes.as_dtype(dtype)).astype(np.float64)


class _Builder:
    """Draws the steps of one kernel, keeping the model's tiles."""

    def __init__(self, draw, inputs: list[np.ndarray], illegal: bool) -> None:
        self.draw = draw
        self.inputs = inputs
        self.names = "abc"[: len(inputs)]
        self.tiles: list[Tile] = []
        self.body: list[str] = []
        self.illegal = illegal
        self.bad: tuple[int, tuple[str, ...], str] | None = None  # (body index, names, what)
        self.ulps = 0.0

    # -- helpers ----------------------------------------------------------------------------
    def new(self, value: np.ndarray, dtype: str, psum: bool = False) -> Tile:
        t = Tile(f"t{len(self.tiles)}", _round(value, dtype), dtype, psum)
        self.tiles.append(t)
        self.ulps += _ULPS[dtype]
        return t

    def fail(self, line: str, errors: tuple[str, ...], what: str) -> None:
        self.body.append(line)
        self.bad = (len(self.body) - 1, errors, what)

    def pick(self) -> Tile:
        return self.draw(st.sampled_from(self.tiles))

    # -- steps ------------------------------------------------------------------------------
    def load(self) -> None:
        draw = self.draw
        k = draw(st.integers(0, len(self.inputs) - 1))
        x, name = self.inputs[k], self.names[k]
        rows, cols = x.shape
        legal = not self.illegal or draw(st.booleans())
        if legal:
            p0 = draw(st.integers(0, rows - 1))
            p1 = draw(st.integers(p0 + 1, min(rows, p0 + PMAX)))
            f0 = draw(st.integers(0, cols - 1))
            f1 = draw(st.integers(f0 + 1, cols))
            # sometimes write a bound from the end, as numpy allows
            s0 = str(p0 - rows) if draw(st.booleans()) else str(p0)
            s1 = str(f1 - cols) if f1 < cols and draw(st.booleans()) else str(f1)
            t = self.new(x[p0:p1, f0:f1], dtypes.name(x.dtype))
            self.body.append(f"{t.name} = nl.load({name}[{s0}:{p1}, {f0}:{s1}])")
            return
        kind = draw(st.sampled_from(["stop", "start", "neg", "empty", "parts", "int"]))
        if kind == "stop":  # a stop past the end (numpy would clamp it)
            line = f"nl.load({name}[0:{min(rows, PMAX)}, 0:{cols + draw(st.integers(1, 64))}])"
            errors = ("err_tensor_access_out_of_bound",)
        elif kind == "start":  # a start at or past the end (numpy: an empty slice)
            f0 = cols + draw(st.integers(0, 64))
            line = f"nl.load({name}[0:{min(rows, PMAX)}, {f0}:{f0 + 8}])"
            errors = ("err_tensor_access_out_of_bound",)
        elif kind == "neg":  # a negative start before the beginning
            line = f"nl.load({name}[-{rows + draw(st.integers(1, 64))}:, :])"
            errors = ("err_tensor_access_out_of_bound",)
        elif kind == "empty":
            f0 = draw(st.integers(0, cols - 1))
            line = f"nl.load({name}[0:1, {f0}:{f0}])"
            errors = ("err_invalid_argument",)
        elif kind == "parts":  # more partitions than a tile has
            if rows <= PMAX:
                line = f"nl.load({name}[{rows}, :])"
                errors = ("err_tensor_access_out_of_bound",)
            else:
                line = f"nl.load({name}[0:{rows}, :])"
                errors = ("err_num_partition_exceed_arch_limit",)
        else:  # an integer index past the end
            line = f"nl.load({name}[{rows + draw(st.integers(0, 8))}, 0:1])"
            errors = ("err_tensor_access_out_of_bound",)
        self.fail(f"t_bad = {line}", errors, f"load: {kind}")

    def unary(self) -> None:
        t = self.pick()
        fns = {"tanh": np.tanh, "abs": np.abs, "negative": np.negative, "square": np.square}
        if np.abs(t.value).max(initial=0) < 4:
            fns["exp"] = np.exp
        fn = self.draw(st.sampled_from(sorted(fns)))
        dtype = t.dtype if not t.psum else "float32"
        out = self.new(fns[fn](t.value.astype(np.float32)), dtype)
        self.body.append(f"{out.name} = nl.{fn}({t.name})")

    def binary(self) -> None:
        draw = self.draw
        a, b = self.pick(), self.pick()
        op = draw(st.sampled_from(["add", "subtract", "multiply", "maximum"]))
        line = f"nl.{op}({a.name}, {b.name})"
        (pa, fa), (pb, fb) = a.shape, b.shape
        if not self.illegal and (pa != pb or (fa != fb and 1 not in (fa, fb))):
            return  # the shapes do not combine: keep this one for an illegal step
        if pa != pb:
            return self.fail(f"t_bad = {line}", ("err_num_partition_mismatch",), "binary: P")
        if fa != fb and 1 not in (fa, fb):
            return self.fail(f"t_bad = {line}", ("err_invalid_argument",), "binary: free")
        if a.psum and b.psum and fa == fb and a is not b:
            return self.fail(f"t_bad = {line}", ("err_unsupported_memory",), "binary: 2 PSUM")
        if a.psum and b.psum:
            return  # one tile in PSUM twice, or a (P, 1) operand: legal but not modeled here
        fn = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply}.get(op, np.maximum)
        dtype = dtypes.name(dtypes.promote(dtypes.as_dtype(a.dtype), dtypes.as_dtype(b.dtype)))
        out = self.new(fn(a.value.astype(np.float32), b.value.astype(np.float32)), dtype)
        self.body.append(f"{out.name} = {line}")

    def scalar(self) -> None:
        draw = self.draw
        t = self.pick()
        c = draw(st.sampled_from([0.5, -1.25, 3.0, 0.0, -0.0, 2]))
        op = draw(st.sampled_from(["add", "multiply", "subtract"]))
        fn = {"add": np.add, "multiply": np.multiply, "subtract": np.subtract}[op]
        out = self.new(fn(t.value.astype(np.float32), np.float32(c)), t.dtype)
        self.body.append(f"{out.name} = nl.{op}({t.name}, {c!r})")

    def reduce(self) -> None:
        draw = self.draw
        t = self.pick()
        op = draw(st.sampled_from(["sum", "max", "min"]))
        legal = ["1", "-1", "(1,)", "[1]", "None"]
        bad = ["0", "2", "5", "-3", "'1'", "1.5", "(1, 1)", "(0, 1)"]
        axis = draw(st.sampled_from(legal + (bad if self.illegal else [])))
        line = f"nl.{op}({t.name}, axis={axis}, keepdims=True)"
        if axis in bad:
            return self.fail(f"t_bad = {line}", ("err_invalid_argument",), f"reduce axis={axis}")
        fn = {"sum": np.sum, "max": np.max, "min": np.min}[op]
        out = self.new(fn(t.value.astype(np.float32), axis=1, keepdims=True), t.dtype)
        self.body.append(f"{out.name} = {line}")

    def matmul(self) -> None:
        a, b = self.pick(), self.pick()
        (k1, m), (k2, n) = a.shape, b.shape
        line = f"nl.matmul({a.name}, {b.name}, transpose_x=True)"
        if not self.illegal and (k1 != k2 or m > STATIONARY_FMAX or n > MOVING_FMAX):
            return
        if k1 != k2:
            return self.fail(f"t_bad = {line}", ("err_num_partition_mismatch",), "matmul: K")
        if m > STATIONARY_FMAX or n > MOVING_FMAX:
            return self.fail(
                f"t_bad = {line}", ("err_size_of_dimension_exceed_arch_limit",), "matmul: M/N"
            )
        # a 16-bit operand beside an fp32 one is promoted; fp16 with bf16 are multiplied as is
        out = self.new(a.value.T @ b.value, "float32", psum=True)
        self.body.append(f"{out.name} = {line}")

    def transpose(self) -> None:
        t = self.pick()
        p, f = t.shape
        line = f"nl.transpose({t.name})"
        if not self.illegal and f > PMAX:
            return
        if f > PMAX:
            return self.fail(
                f"t_bad = {line}", ("err_size_of_dimension_exceed_arch_limit",), "transpose: F"
            )
        out = self.new(t.value.T, t.dtype, psum=True)
        self.body.append(f"{out.name} = {line}")

    def misuse(self) -> None:
        """One call with an argument nkikit must name as wrong."""
        t = self.pick()
        p, f = t.shape
        x = t.name
        cases = [
            (f"nl.exp({x}, dtype='float99')", "err_unsupported_dtype"),
            (f"nl.exp({x}, dtype=5)", "err_unsupported_dtype"),
            (f"nl.add({x}, 'x')", "err_invalid_argument"),
            (f"nl.multiply({x}, None)", "err_invalid_argument"),
            (f"nl.maximum({x}, [1, 2])", "err_invalid_argument"),
            ("nl.load('a')", "err_invalid_argument"),
            ("nl.arange(2.5)", "err_invalid_argument"),
            ("nl.arange(0, 4, 0)", "err_invalid_argument"),
            ("nl.program_id(2)", "err_invalid_argument"),
            ("nl.program_id('0')", "err_invalid_argument"),
            ("nl.num_programs(3)", "err_invalid_argument"),
            ("nl.ndarray((4, 0), dtype=nl.float32, buffer=nl.sbuf)", "err_invalid_argument"),
            ("nl.ndarray((4, '8'), dtype=nl.float32, buffer=nl.sbuf)", "err_invalid_argument"),
            ("nl.zeros((4, 8), dtype=nl.float32, buffer='dram')", "err_invalid_argument"),
            (f"nl.full(({p}, {f}), 'x', dtype=nl.float32)", "err_invalid_argument"),
            (f"nl.expand_dims({x}, 7)", "err_invalid_argument"),
            (f"{x}.reshape((3,))", "err_invalid_argument"),
            (f"nl.broadcast_to({x}, ('a', 2))", "err_invalid_argument"),
            (f"nl.where({x}, 'x', 1.0)", "err_invalid_argument"),
            (f"{x}[nl.arange({p})[:, None], nl.arange(0)[None, :]]", "err_invalid_argument"),
            (f"{x}[:, 0.5:2]", "err_invalid_argument"),
            (f"{x}[:, nl.ds(0, 0)]", "err_invalid_argument"),
            (f"{x}[:, {f}:{f + 4}]", "err_tensor_access_out_of_bound"),
            (f"nl.arange({p})[:, :]", "err_invalid_argument"),
            ("nl.mgrid[0:]", "err_invalid_argument"),
            (f"nl.load({x})", "err_unsupported_memory"),
            ("nisa.iota(nl.arange(0)[None, :], dtype=nl.int32)", "err_invalid_argument"),
            (f"nl.softmax({x}, axis=3)", "err_invalid_argument"),
            (f"nisa.memset(({p}, 'x'), 0.0, nl.float32)", "err_invalid_argument"),
            ("nl.ones((200, 4), dtype=nl.float32)", "err_num_partition_exceed_arch_limit"),
        ]
        if f % 3:
            cases.append((f"nisa.bn_aggr({x})", "err_invalid_argument"))
        line, error = self.draw(st.sampled_from(cases))
        errors = (error,)
        if not t.psum and self.draw(st.booleans()):
            # a store into an input not marked mutable (of another shape: either error)
            line = f"nl.store(a, {x})"
            errors = ("err_cannot_update_immutable_parameter",)
            if self.inputs[0].shape != t.shape:
                errors += ("err_store_dst_shape_smaller_than_other_shape",)
        self.fail(f"t_bad = {line}", errors, f"misuse: {line}")


@st.composite
def random_kernels(draw, *, max_steps: int = 5, illegal: bool = True) -> RandomKernel:
    """A random small Beta-1 kernel with the model's verdict (see the module docstring).
    ``illegal=False`` draws legal kernels only; otherwise about half of them break a rule."""
    n_inputs = draw(st.integers(1, 2))
    shapes = [
        (draw(st.sampled_from([1, 3, 64, 127, 128, 129, 200])), draw(st.integers(1, 700)))
        for _ in range(n_inputs)
    ]
    in_dtypes = [draw(st.sampled_from(DTYPES)) for _ in shapes]
    seed = draw(st.integers(0, 2**32 - 1))
    inputs = [random_inputs(s, d, seed + i) for i, (s, d) in enumerate(zip(shapes, in_dtypes))]
    bad = illegal and draw(st.booleans())
    b = _Builder(draw, inputs, bad)
    b.illegal = False
    b.load()
    steps = draw(st.integers(0, max_steps - 1))
    bad_at = draw(st.integers(0, steps)) if bad else -1
    kinds = ["load", "unary", "binary", "scalar", "reduce", "matmul", "transpose"]
    for i in range(steps + (1 if bad else 0)):
        b.illegal = i == bad_at
        # an illegal step: a bad load or a misuse more often than a step whose shapes clash
        bad_kinds = ["load", "load", "misuse", "misuse", "misuse", "reduce"] + kinds[2:]
        kind = draw(st.sampled_from(bad_kinds if b.illegal else kinds))
        getattr(b, kind)()
        if b.bad is not None:
            break
    last = b.tiles[-1]
    # the result goes to a window of a larger output, in a drawn dtype
    p, f = last.shape
    r0, c0 = draw(st.integers(0, 3)), draw(st.integers(0, 40))
    out_dtype = draw(st.sampled_from(DTYPES))
    header = ["def kernel(" + ", ".join(b.names) + "):"]
    out_line = f"out = nl.ndarray(({r0 + p}, {c0 + f}), dtype=nl.{out_dtype}, buffer=nl.shared_hbm)"
    lines = header + ["    " + out_line] + ["    " + s for s in b.body]
    case = RandomKernel(lines, inputs, steps=list(b.body))
    if b.bad is None and bad:  # the drawn steps happened to be legal: a bad store
        kind = draw(st.sampled_from(["rows", "cols", "start"]))
        window = {
            "rows": f"{r0}:{r0 + p + 1}, {c0}:{c0 + f}",  # one row past the end
            "cols": f"{r0}:{r0 + p}, {c0 + 1}:{c0 + f + 1}",  # one column past the end
            "start": f"{r0}:{r0 + p}, {c0 + f}:",  # a start at the end
        }[kind]
        b.fail(
            f"nl.store(out[{window}], {last.name})",
            ("err_tensor_access_out_of_bound",),
            f"store: {kind}",
        )
        lines.append("    " + b.body[-1])
    if b.bad is not None:
        index, errors, what = b.bad
        case.bad_line = 3 + index  # the def and out lines come first (1-based)
        case.errors, case.what = errors, what
        lines.append("    return out")
        return case
    lines += [f"    nl.store(out[{r0}:, {c0}:], {last.name})", "    return out"]
    case.expected = _round(last.value, out_dtype)
    case.window = (r0, c0)
    case.rtol = b.ulps + _ULPS[out_dtype]
    return case


def check_random_kernel(case: RandomKernel) -> str:
    """Run ``case`` and assert the contract (see the module docstring); returns ``"match"``
    for a legal kernel, else the name of the NKI error it raised."""
    kernel = case.build()
    try:
        got = kernel(*case.inputs)
    except NkiError as e:
        if case.bad_line is None:
            raise AssertionError(f"a legal kernel was rejected: {e}\n{case!r}") from e
        line = e.loc.line
        assert line == case.bad_line, f"error at line {line}, not {case.bad_line}: {e}\n{case!r}"
        assert e.name in case.errors, f"expected {case.errors}, got {e.name}: {e}\n{case!r}"
        return e.name
    except Exception as e:  # an internal error: the contract's worst break
        raise AssertionError(f"internal {type(e).__name__} escaped: {e}\n{case!r}") from e
    if case.bad_line is not None:
        raise AssertionError(f"an illegal kernel ran silently ({case.what})\n{case!r}")
    assert case.expected is not None
    r0, c0 = case.window  # the output window the kernel wrote (the rest stays poisoned)
    got = np.asarray(got, dtype=np.float64)[r0:, c0:]
    want = case.expected
    assert got.shape == want.shape, f"shape {got.shape} != {want.shape}\n{case!r}"
    scale = max(1.0, float(np.abs(want[np.isfinite(want)]).max(initial=0.0)))
    tol = case.rtol * 4 * (np.abs(want) + scale)
    same = (got == want) | (np.isnan(got) & np.isnan(want)) | (np.abs(got - want) <= tol)
    if not same.all():
        i = np.argwhere(~same)[0]
        raise AssertionError(
            f"mismatch at {tuple(i)}: got {got[tuple(i)]}, model {want[tuple(i)]} "
            f"({int((~same).sum())} elements differ)\n{case!r}"
        )
    return "match"
