"""Run a kernel on the simulator next to its numpy reference and compare, with failure messages
that point at the cause (which elements, how far off, NaN from poisoned memory)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .. import dtypes
from .inputs import round_to
from .tolerances import Tolerance, loosest_tolerance, tolerance

_POISON_HINT = (
    "NaN where the reference is finite usually means the kernel read memory it never wrote: "
    "fresh SBUF/PSUM/HBM buffers are NaN-poisoned in simulation. Check the masks and loop "
    "bounds of the ragged last tile, and that every output element is stored."
)


def _is_array(x: object) -> bool:
    return isinstance(x, np.ndarray) or (
        type(x).__module__.startswith("torch") and hasattr(x, "detach")
    )


def _as_numpy(x: object) -> np.ndarray:
    if isinstance(x, np.ndarray):
        return x
    if type(x).__module__.startswith("torch"):
        import torch

        t = x.detach().cpu()  # type: ignore[attr-defined]
        if t.dtype == torch.bfloat16:
            return t.view(torch.int16).numpy().view(dtypes.bfloat16)
        return t.numpy()
    return np.asarray(x)


def _is_floating(a: np.ndarray) -> bool:
    return a.dtype.kind == "f" or dtypes.is_float(a.dtype)


def _kernel_input(x: object, dtype: np.dtype | None) -> object:
    """What the kernel gets: float arrays rounded to ``dtype`` (float64 narrowed to float32 when
    no dtype is given, since float64 is not an NKI dtype); everything else unchanged."""
    if not _is_array(x):
        return x
    a = _as_numpy(x)
    if not _is_floating(a):
        return a
    if dtype is not None:
        return round_to(a, dtype)
    return a.astype(np.float32) if a.dtype == np.float64 else a


def _reference_input(x: object) -> object:
    """What the reference gets: the kernel's (rounded) float inputs widened to float64."""
    if isinstance(x, np.ndarray) and _is_floating(x):
        return x.astype(np.float64)
    return x


def _flatten_outputs(r: object) -> list[object]:
    if isinstance(r, tuple | list):
        return list(r)
    return [r]


def _fmt_index(idx: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(int(i)) for i in idx) + "]"


def _fmt(v: float) -> str:
    return f"{v:.6g}"


def assert_close(
    actual: object,
    expected: object,
    *,
    dtype: object = None,
    op_kind: str = "elementwise",
    rtol: float | None = None,
    atol: float | None = None,
) -> None:
    """Assert a kernel result ``actual`` is close to a reference ``expected``.

    The tolerance is ``rtol``/``atol`` when given, else ``tolerance()`` of the loosest of
    ``dtype`` and ``actual``'s dtype for ``op_kind``.  Raises ``AssertionError`` as ``compare``.
    """
    __tracebackhide__ = True  # pytest shows the caller's line and the report, not ours
    a = _as_numpy(actual)
    considered = [a.dtype] + ([dtypes.as_dtype(dtype)] if dtype is not None else [])
    tol = loosest_tolerance([d for d in considered if _nki_dtype(d)], op_kind)
    if rtol is not None or atol is not None:
        tol = Tolerance(tol.rtol if rtol is None else rtol, tol.atol if atol is None else atol)
    compare(a, expected, tol)


def compare(
    out: object, ref: object, tol: Tolerance, *, name: str = "output", context: str = ""
) -> None:
    """Assert ``out`` (kernel result) is close to ``ref`` (reference) within ``tol``.

    Same shape required.  NaN in both at the same place counts as equal; infinities must
    match exactly.  Raises ``AssertionError`` with the mismatch count, the largest absolute and
    relative errors with their indices and values, the index range the mismatches span, and the
    NaN counts (with a hint when the kernel's NaNs look like uninitialized memory).
    """
    __tracebackhide__ = True  # pytest shows the caller's line and the report, not ours
    o = _as_numpy(out)
    r = np.asarray(ref)
    odt = dtypes.name(o.dtype) if o.dtype != np.float64 else "float64"
    head = f"{context}{name} ({odt}{list(o.shape)})"
    if o.shape != r.shape:
        raise AssertionError(
            f"{head}: shape {tuple(o.shape)} differs from the reference's {tuple(r.shape)}"
        )
    if o.size == 0:
        return
    of = o.astype(np.float64)
    rf = r.astype(np.float64)
    o_nan, r_nan = np.isnan(of), np.isnan(rf)
    both_nan = o_nan & r_nan
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(of - rf)
        same_inf = np.isinf(of) & np.isinf(rf) & (of == rf)
        diff = np.where(both_nan | same_inf, 0.0, diff)
        bound = tol.atol + tol.rtol * np.abs(rf)
        bad = ~(diff <= bound)  # NaN in diff counts as bad
        bad &= ~(both_nan | same_inf)
    n_bad = int(bad.sum())
    if n_bad == 0:
        return
    lines = [
        f"{head} does not match the reference",
        f"  tolerance: rtol={tol.rtol:g} atol={tol.atol:g}",
        f"  mismatched: {n_bad} of {o.size} elements ({100.0 * n_bad / o.size:.3g}%)",
    ]
    finite = np.isfinite(diff)
    over = " over the non-NaN elements" if not finite.all() else ""
    if finite.any() and diff[finite].max() > 0:
        d = np.where(finite, diff, -1.0)
        i_abs = np.unravel_index(int(np.argmax(d)), d.shape)
        with np.errstate(divide="ignore", invalid="ignore"):
            rel = np.where(finite, diff / np.abs(rf), -1.0)
        rel = np.where(np.isnan(rel), -1.0, rel)
        i_rel = np.unravel_index(int(np.argmax(rel)), rel.shape)
        lines.append(
            f"  max abs error{over}: {_fmt(diff[i_abs])} at {_fmt_index(i_abs)} "
            f"(kernel {_fmt(of[i_abs])}, reference {_fmt(rf[i_abs])})"
        )
        lines.append(
            f"  max rel error{over}: {_fmt(rel[i_rel])} at {_fmt_index(i_rel)} "
            f"(kernel {_fmt(of[i_rel])}, reference {_fmt(rf[i_rel])})"
        )
    first = np.unravel_index(int(np.argmax(bad)), bad.shape)
    lines.append(
        f"  first mismatch: {_fmt_index(first)} (kernel {_fmt(of[first])}, reference {_fmt(rf[first])})"
    )
    where = np.nonzero(bad)
    span = ", ".join(f"{int(w.min())}..{int(w.max())}" for w in where)
    lines.append(f"  mismatches span index ranges [{span}]")
    n_onan, n_rnan = int(o_nan.sum()), int(r_nan.sum())
    if n_onan or n_rnan:
        lines.append(f"  NaN: {n_onan} in the kernel output, {n_rnan} in the reference")
        stray = o_nan & ~r_nan
        if stray.any():
            s = np.unravel_index(int(np.argmax(stray)), stray.shape)
            lines.append(f"  first kernel NaN where the reference is finite: {_fmt_index(s)}")
            lines.append("  " + _POISON_HINT)
    raise AssertionError("\n".join(lines))


def check_kernel(
    kernel: Callable[..., Any],
    reference: Callable[..., Any],
    *args: object,
    dtype: object = None,
    rtol: float | None = None,
    atol: float | None = None,
    op_kind: str = "elementwise",
    **kwargs: object,
) -> list[np.ndarray]:
    """Run ``kernel(*args, **kwargs)`` on the simulator and ``reference`` on the same inputs,
    and assert the results are close.

    ``kernel``: a ``@nki.jit`` kernel (optionally with a grid, ``k[g0, g1]``) or any function
    that launches one (a library entry point).  ``reference``: a numpy function with the same
    signature returning an array or a tuple/list of arrays.

    Inputs: floating arrays in ``args``/``kwargs`` are rounded to ``dtype`` (an NKI dtype) before
    the kernel sees them; with ``dtype=None`` they are passed as they are (float64 narrowed to
    float32).  The reference gets exactly the kernel's input values widened to float64, so only
    the kernel's own rounding and arithmetic are measured.  Integer arrays and non-array
    arguments go to both unchanged.

    Tolerance: ``rtol``/``atol`` when given, else ``tolerance(d, op_kind)`` for the loosest of
    ``dtype`` and each output's dtype (see ``nkikit.testing.tolerances``).

    ``dtype``, ``rtol``, ``atol`` and ``op_kind`` belong to ``check_kernel``; a kernel keyword
    argument with one of these names cannot be passed through (wrap the kernel in a lambda).

    Returns the kernel's outputs as a list of numpy arrays.  Raises ``AssertionError`` when the
    number of outputs, a shape or a value does not match (see ``compare`` for the message).
    """
    __tracebackhide__ = True  # pytest shows the caller's line and the report, not ours
    dt = dtypes.as_dtype(dtype) if dtype is not None else None
    k_args = [_kernel_input(a, dt) for a in args]
    k_kwargs = {k: _kernel_input(v, dt) for k, v in kwargs.items()}
    r_args = [_reference_input(a) for a in k_args]
    r_kwargs = {k: _reference_input(v) for k, v in k_kwargs.items()}

    outs = [_as_numpy(o) for o in _flatten_outputs(kernel(*k_args, **k_kwargs))]
    refs = _flatten_outputs(reference(*r_args, **r_kwargs))
    name = getattr(kernel, "__name__", None) or getattr(
        getattr(kernel, "func", None), "__name__", "kernel"
    )
    if len(outs) != len(refs):
        raise AssertionError(
            f"check_kernel({name}): the kernel returned {len(outs)} outputs, the reference {len(refs)}"
        )
    in_dtypes = [a.dtype for a in k_args + list(k_kwargs.values()) if isinstance(a, np.ndarray)]
    for i, (o, r) in enumerate(zip(outs, refs)):
        considered = [o.dtype] + ([dt] if dt is not None else in_dtypes)
        tol = loosest_tolerance([d for d in considered if _nki_dtype(d)], op_kind)
        if rtol is not None or atol is not None:
            tol = Tolerance(tol.rtol if rtol is None else rtol, tol.atol if atol is None else atol)
        label = "output" if len(outs) == 1 else f"output {i}"
        compare(o, r, tol, name=label, context=f"check_kernel({name}, op_kind={op_kind!r}): ")
    return outs


def _nki_dtype(dt: np.dtype) -> bool:
    try:
        dtypes.as_dtype(dt)
    except TypeError:
        return False
    return True


def assert_grads_close(
    got: Any, want: Any, dtype: object, *, op_kind: str = "normalization", term_scale: float = 0.0
) -> None:
    """Each gradient in ``got`` against its float64 analytic reference in ``want``.

    An input gradient is often a difference of terms (it can be far smaller than the terms
    themselves), so the absolute part of the tolerance is the dtype's relative tolerance times
    the larger of the largest reference entry and ``term_scale``, the size of the largest term.
    """
    __tracebackhide__ = True  # pytest shows the caller's line and the report, not ours
    tol = tolerance(dtypes.as_dtype(dtype), op_kind)
    assert len(got) == len(want), f"{len(got)} gradients, expected {len(want)}"
    for g, w in zip(got, want):
        scale = max(float(np.max(np.abs(w))) if np.size(w) else 1.0, term_scale)
        assert_close(g, w, dtype=dtype, op_kind=op_kind, atol=tol.atol + tol.rtol * scale)
