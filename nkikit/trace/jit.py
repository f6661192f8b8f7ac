"""The jit machinery both dialects share: specialize a kernel on its arguments, trace it to IR
once per specialization, verify and cache it, and run it on the simulator.

A call with numpy arrays (or CPU torch tensors) traces the kernel for those shapes, dtypes,
non-array arguments, launch grid and target, verifies the IR, caches it, and runs it on the
simulator.  Results come back as the same kind of array the caller passed (``nkikit.arrays``).

:class:`JitKernel` knows no dialect: a dialect's kernel class (``nkikit.language.jit`` for
NKI Beta 1, ``nkikit.nki.jit`` for NKI 0.x) says what the traced function receives for an array
argument (:meth:`JitKernel.proxy`) and which HBM tensor a returned value stands for
(:meth:`JitKernel.returned`), or replaces :meth:`JitKernel._trace` whole.
"""

from __future__ import annotations

import functools
import inspect
import math
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from ..arrays import TensorSpec, as_kind_of, as_numpy, is_torch, spec_of
from ..collector import gc_paused
from ..errors import (
    ErrInvalidArgument,
    NkiError,
    SourceLoc,
    hide_internal_frames,
    raised_in_user_code,
)
from ..ir.cache import KernelCache, op_count
from ..ir.core import Kernel, Tensor
from ..targets import target_scope
from . import launches
from .builder import Builder, LoopSite, maybe_current, tracing
from .loops import SplitLoops
from .outputs import check_outputs
from .peek import Concrete

# each re-trace grows a loop's split factor; a kernel needing more is beyond reason
_MAX_RETRACES = 16


def _const_key(v: object) -> object:
    """The cache key of a non-array argument: equal keys trace to the same IR.  Floats are
    keyed by their bits, as the trace embeds them: ``-0.0 == 0.0`` and ``nan != nan`` in
    Python, but a kernel scaled by ``-0.0`` writes negative zeros and one scaled by nan
    should reuse its trace.  Tuples and lists are keyed element by element."""
    if isinstance(v, float | np.floating):
        return (type(v).__name__, np.asarray(v).tobytes())
    if isinstance(v, tuple | list):
        return (type(v).__name__, tuple(_const_key(x) for x in v))
    try:
        hash(v)
        return (type(v).__name__, v)
    except TypeError:
        return (type(v).__name__, repr(v))


class JitKernel:
    """A jitted kernel of some dialect.  Call it to simulate; index it with a grid
    (``kernel[g0, g1](...)``) for an SPMD launch; ``.ir(*args)`` returns the traced IR.

    A dialect subclasses it and defines :meth:`proxy` and :meth:`returned` (or overrides
    :meth:`_trace`); this class is not a kernel by itself."""

    dialect = ""
    """The front end's name, recorded in the IR (``Kernel.dialect``)."""
    default_target_fallback = "trn2"
    """The target a call is traced for when neither ``target=`` nor the environment names one
    (``default_target``)."""

    def __init__(
        self, func: Callable, grid: tuple[int, ...] = (), options: dict | None = None, cache=None
    ) -> None:
        self.func = func
        self.grid = grid
        self.options = options or {}
        self.signature = inspect.signature(func)
        params = list(self.signature.parameters.values())
        self._names = [p.name for p in params]
        plain = all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params)
        self._n_positional = len(params) if plain else -1
        # a *args or **kwargs parameter: its items are arguments of their own (``bind``)
        self._variadic = any(
            p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
            for p in params
        )
        self._cache: KernelCache = KernelCache() if cache is None else cache
        functools.update_wrapper(self, func)

    def __getitem__(self, grid) -> JitKernel:
        if not isinstance(grid, tuple):
            grid = (grid,)
        return type(self)(self.func, tuple(int(g) for g in grid), self.options, self._cache)

    def __repr__(self) -> str:
        return f"<nki.jit kernel {self.func.__name__}{list(self.grid) if self.grid else ''}>"

    # -- specialization -----------------------------------------------------------------------
    def bind(self, args: tuple, kwargs: dict) -> inspect.BoundArguments:
        """The call's arguments by name, defaults applied.  The items of a ``*args``
        parameter are arguments of their own, named ``args[0]``, ``args[1]``, ...; those of a
        ``**kwargs`` parameter by their keywords (:meth:`call_with` puts them back)."""
        # (a Python TypeError for arguments the signature does not take, as a call would)
        if not kwargs and len(args) == self._n_positional:
            # the common call: every parameter given positionally, nothing to default
            return inspect.BoundArguments(self.signature, dict(zip(self._names, args)))
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"{self.func.__name__}(): {e}") from None
        bound.apply_defaults()
        if self._variadic:
            flat: dict[str, Any] = {}
            for name, v in bound.arguments.items():
                kind = self.signature.parameters[name].kind
                if kind is inspect.Parameter.VAR_POSITIONAL:
                    flat.update((f"{name}[{i}]", x) for i, x in enumerate(v))
                elif kind is inspect.Parameter.VAR_KEYWORD:
                    flat.update(v)
                else:
                    flat[name] = v
            bound = inspect.BoundArguments(self.signature, flat)  # type: ignore[arg-type]
        return bound

    def _parameter_of(self, name: str) -> inspect.Parameter:
        """The parameter that takes the argument :meth:`bind` named ``name``."""
        params = self.signature.parameters
        p = params.get(name) or params.get(name.partition("[")[0])
        if p is None or (p.kind is p.VAR_POSITIONAL and name == p.name):
            p = next(q for q in params.values() if q.kind is q.VAR_KEYWORD)
        return p

    def call_with(self, arguments: dict[str, Any]) -> Any:
        """Call the kernel's function on ``arguments`` (what the traced function receives,
        by the names :meth:`bind` gave them): positional-only parameters and the items of
        ``*args`` by position, the rest by keyword."""
        if not self._variadic and self._n_positional >= 0:
            return self.func(**arguments)
        positional: list[Any] = []
        keywords = dict(arguments)
        for p in self.signature.parameters.values():
            if p.kind in (inspect.Parameter.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
                positional.append(keywords.pop(p.name))  # by position: a *args after lines up
            elif p.kind is inspect.Parameter.VAR_POSITIONAL:
                i = 0
                while f"{p.name}[{i}]" in keywords:
                    positional.append(keywords.pop(f"{p.name}[{i}]"))
                    i += 1
        return self.func(*positional, **keywords)

    def _key(self, bound: inspect.BoundArguments) -> tuple:
        # cheap to compute on every call: raw shapes and dtype numbers (validated when traced)
        parts: list[Any] = [self.grid]
        for v in bound.arguments.values():
            if isinstance(v, np.ndarray | TensorSpec):
                dt = v.dtype
                parts.append((v.shape, dt.num, dt.metadata is not None))
            elif is_torch(v):
                parts.append((tuple(v.shape), v.dtype))
            else:
                parts.append(_const_key(v))
        return tuple(parts)

    def _precise_fp(self) -> bool:
        """Whether a call stores bf16 / fp8 tensors rounded (``run``'s ``precise_fp``):
        always for Beta-1 kernels; NKI 0.x kernels read ``NKI_PRECISE_FP``."""
        return True

    def default_target(self) -> str:
        """The target this kernel is traced for when no ``target=`` is given:
        ``NEURON_PLATFORM_TARGET_OVERRIDE`` (or ``NKI_NC_VERSION``), else the dialect's own
        (``default_target_fallback``)."""
        from ..targets import default_target_name

        return default_target_name(self.default_target_fallback)

    def specialize(self, *args, **kwargs) -> tuple[Kernel, inspect.BoundArguments]:
        """The IR for these arguments, traced and verified for the default target
        (:meth:`default_target`).  Traced once per specialization."""
        return self.specialize_for(None, *args, **kwargs)

    def specialize_for(self, target, *args, **kwargs) -> tuple[Kernel, inspect.BoundArguments]:
        """The IR for these arguments, traced for ``target`` (a name or None for the default:
        what ``nl.tile_size`` and ``nisa.get_nc_version()`` return while tracing) and verified
        against its limits.  The target is part of the specialization."""
        from ..targets import canonical_name

        bound = self.bind(args, kwargs)
        name = canonical_name(target) if target else self.default_target()
        # NKI_NC_VERSION changes what `nisa.get_nc_version()` answers while tracing
        key = (name, os.environ.get("NKI_NC_VERSION"), self._key(bound))
        entry = self._cache.get(key)
        if entry is None:
            with gc_paused():
                kernel = self._trace(bound, name)
                self.verify(kernel, name)
                check_outputs(kernel)
            entry = kernel
            self._cache.put(key, kernel, op_count(kernel))
        return entry, bound

    def verify(self, kernel: Kernel, target: str) -> None:
        """Check the traced ``kernel`` against ``target``'s rules (``nkikit.ir.verify``); a
        dialect may first do what its compiler does to a kernel that breaks one."""
        from ..ir.verify import verify

        verify(kernel, target)

    def _parameters(self, b: Builder, bound: inspect.BoundArguments, loc: SourceLoc, proxy):
        """The kernel's arguments as the traced function sees them: an HBM input tensor (seen
        through ``proxy``, the dialect's tensor type) per array argument, the rest as given."""
        call_args: dict[str, Any] = {}
        params: list[Tensor] = []
        for name, v in bound.arguments.items():
            try:
                spec = spec_of(v)
            except TypeError as e:  # an array of float64, int64, complex, object, ...
                raise NkiError(
                    "err_unsupported_dtype",
                    loc,
                    op=f"{self.func.__name__}(): argument {name!r}",
                    dtype=str(getattr(v, "dtype", type(v).__name__)),
                    why=str(e),
                ) from None
            if spec is None:
                call_args[name] = v
                continue
            ann = self._parameter_of(name).annotation
            if isinstance(ann, str):  # postponed (`from __future__ import annotations`): resolve
                try:
                    ann = eval(ann, self.func.__globals__)  # the user's own annotation text
                except Exception:
                    ann = None
            # ``nt.mutable_tensor`` (either dialect's) says so with a class attribute
            mutable = getattr(ann, "mutable", False) is True
            t = Tensor(
                name, spec[0], spec[1], "shared_hbm", kind="input", loc=loc, mutable=bool(mutable)
            )
            b.names[name] = 1
            b.tensors.append(t)
            params.append(t)
            call_args[name] = proxy(t)
        return call_args, params

    # -- the dialect's part -----------------------------------------------------------------
    def proxy(self, tensor: Tensor) -> object:
        """What the traced function receives for the array argument ``tensor`` (an HBM input
        tensor of the IR): the dialect's tensor type viewing all of it."""
        raise NotImplementedError(f"{type(self).__name__} defines no argument proxy")

    def returned(self, value: object, loc: SourceLoc) -> Tensor | None:
        """The HBM tensor that ``value``, returned by the traced function, stands for; None
        if ``value`` is not one of the dialect's tensors.  Raises ``NkiError`` (at ``loc``,
        the kernel's ``def`` line) for one of its tensors that cannot be returned."""
        raise NotImplementedError(f"{type(self).__name__} defines no return values")

    def _trace(self, bound: inspect.BoundArguments, target: str) -> Kernel:
        """Trace the function (:meth:`_trace_once`), again with loops split while an index
        expression asks for it (``i % k`` of a loop variable: see :mod:`nkikit.trace.loops`).

        Each re-trace runs the function again, with its trace-time side effects.  The plan
        starts empty for every specialization, so the IR depends on the arguments alone (not
        on which specializations were traced before)."""
        splits: dict[LoopSite, int] = {}
        for _ in range(_MAX_RETRACES):
            try:
                return self._trace_once(bound, target, splits)
            except SplitLoops as s:
                grown = False
                for site, k in s.factors.items():
                    new = math.lcm(splits.get(site, 1), k)
                    grown |= new != splits.get(site, 1)
                    splits[site] = new
                if not grown:  # the plan already holds: splitting cannot help (a bug)
                    raise s.error() from None
                last = s
        raise last.error() from None

    def _concrete(
        self, bound: inspect.BoundArguments, params: list[Tensor], target: str | None
    ) -> Concrete | None:
        """What a look at a tile's values inside the kernel runs on (``nkikit.trace.peek``):
        None when the call has only shapes (``nt.tensor`` specs)."""
        values = [bound.arguments.get(t.name) for t in params]
        if any(v is None or isinstance(v, TensorSpec) for v in values):
            return None
        return Concrete(
            list(zip(params, values)),
            target or self.default_target(),
            self._precise_fp(),
            self.dialect,
            self._prepare_prefix,
            math.prod(self.grid),
        )

    def _prepare_prefix(self, prefix: Kernel) -> None:
        """Make a prefix of the trace a kernel the verifier takes as the dialect would the
        whole (NKI 0.x marks inputs it writes as mutable)."""

    def _trace_once(
        self, bound: inspect.BoundArguments, target: str, splits: dict[LoopSite, int]
    ) -> Kernel:
        """Run the function once on proxies (:meth:`proxy`) inside the target's scope and
        build the kernel: its parameters, body and outputs (:meth:`returned`, in the nesting
        of tuples and lists the function returned them in), splitting loops by ``splits``."""
        code = self.func.__code__
        loc = SourceLoc(code.co_filename, code.co_firstlineno, self.func.__name__)
        b = Builder(self.func.__name__, self.grid, dict(splits))
        call_args, params = self._parameters(b, bound, loc, self.proxy)
        b.concrete = self._concrete(bound, params, target)
        outputs: list[Tensor] = []

        def collect(r):
            if r is None:
                return None
            if isinstance(r, tuple | list):
                return type(r)(collect(x) for x in r)
            t = self.returned(r, loc)
            if t is None:
                raise NkiError(
                    "err_invalid_argument",
                    loc,
                    op="return",
                    why=f"cannot return a {type(r).__name__}",
                )
            t.kind = "output"
            outputs.append(t)
            return len(outputs) - 1

        # returned proxies are read inside the trace: they may view retargeted temporaries
        with tracing(b), target_scope(target):
            structure = collect(self.call_with(call_args))
        return Kernel(
            self.func.__name__,
            params,
            outputs,
            b.body,
            self.grid,
            loc,
            b.tensors,
            structure,
            self.dialect,
            tuple(sorted(b.unlaunched_program_ids)),
        )

    def ir(self, *args, **kwargs) -> Kernel:
        """Trace (and verify) for these arguments; ``print()`` the result to read the IR."""
        try:
            return self.specialize(*args, **kwargs)[0]
        except NkiError as e:
            raise hide_internal_frames(e) from None
        except Exception as e:  # raised at the kernel's own line: the user's frames only
            if raised_in_user_code(e):
                raise hide_internal_frames(e) from None
            raise

    # -- execution ------------------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        __tracebackhide__ = True
        if maybe_current() is not None:
            # called from inside another kernel: a sub-kernel, traced inline into the caller
            # (the NKI rotary tutorial calls one @nki.jit kernel from another)
            return self.func(*args, **kwargs)
        try:
            if launches.active():  # a profiler records this launch (nkikit.trace.launches)
                return launches.hook(self, args, kwargs)
            kernel, bound = self.specialize(*args, **kwargs)
            with gc_paused():  # the first run generates the kernel's simulator program
                return run(kernel, bound, precise_fp=self._precise_fp())
        except NkiError as e:
            raise hide_internal_frames(e) from None
        except RecursionError:
            # a kernel (or a function it calls) that calls itself without end; a recursion
            # that ends at trace time is fine (Python traces it)
            code = self.func.__code__
            loc = SourceLoc(code.co_filename, code.co_firstlineno, self.func.__name__)
            raise NkiError(
                "err_invalid_argument",
                loc,
                op=f"{self.func.__name__}()",
                why="tracing it recursed past Python's limit: does the kernel (or a function "
                "it calls) call itself without end?",
            ) from None
        except Exception as e:  # e.g. nl.exponential (a typo) or an unknown keyword argument:
            if raised_in_user_code(e):  # raised at the kernel's own line, the user's to read
                raise hide_internal_frames(e) from None
            raise


def run(kernel: Kernel, bound: inspect.BoundArguments, *, precise_fp: bool = True):
    """Simulate ``kernel`` on the bound arguments and return its results shaped like the
    kernel's return value; ``precise_fp=False`` holds bf16 / fp8 tensors as unrounded fp32
    (``NKI_PRECISE_FP=0``, ``nkikit.sim.low_precision_storage``)."""
    from ..sim import low_precision_storage, simulate

    arrays = []
    like = None
    for t in kernel.params:
        v = bound.arguments[t.name]
        if isinstance(v, TensorSpec):
            raise TypeError(
                f"argument {t.name!r} is abstract (nt.tensor[...]); pass an array to simulate"
            )
        if t.mutable and isinstance(v, np.ndarray) and not v.flags.writeable:
            raise ErrInvalidArgument(
                t.loc,
                op=f"argument {t.name!r}",
                why="is an nt.mutable_tensor the kernel writes to, but the numpy array passed "
                "is read-only (flags.writeable is False); pass a writeable array",
            )
        # no defensive copy: the verifier rejects writes to parameters not marked mutable
        arrays.append(as_numpy(v, t.dtype))
        like = like if like is not None else v
    with low_precision_storage(kernel, precise=precise_fp) as store:
        outs = simulate(kernel, store(arrays))
    for t, a in zip(kernel.params, arrays):
        # A contiguous numpy argument was written in place and a contiguous torch argument's
        # array is a view of it. A non-contiguous view of either (or a cast) ran on a copy: the
        # kernel's writes are copied back, so the caller's array sees them as it would on a
        # device (a no-op copy for a view).
        v = bound.arguments[t.name]
        if not t.mutable:
            continue
        if is_torch(v):
            import torch

            with torch.no_grad():
                v.copy_(as_kind_of(a, v))
        elif isinstance(v, np.ndarray) and a is not v:
            np.copyto(v, a, casting="unsafe")
    results = [as_kind_of(o, like) for o in outs]

    def build(s):
        if s is None:
            return None
        if isinstance(s, int):
            return results[s]
        if isinstance(s, dict):  # NKI 0.x may return a dict of tensors
            return {k: build(x) for k, x in s.items()}
        return type(s)(build(x) for x in s)

    return build(kernel.return_structure)
