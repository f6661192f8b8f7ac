"""A kernel function as a torch custom op: `torch.ops.<namespace>.<function>`.

For each function of a build (registry.runtime.KernelFunction) this registers, with
`torch.library.custom_op`:
  - the op, schema `(Tensor x, Tensor weight, float eps=1e-06) -> Tensor` from the manifest
    (inputs are tensors, attrs keep the type of their default); its implementation converts to
    numpy and runs the kernel on the simulator;
  - a fake implementation giving the outputs' shapes and dtypes from the kernel's trace (no
    simulation), so torch.compile and export see through the op;
  - when the manifest names a backward kernel, a second op `<function>_backward` taking one
    gradient per output (then the forward's arguments) and returning one gradient per input,
    and an Autograd kernel wiring it in (`_register_autograd`), which plain autograd and the
    torch.func transforms grad / vjp use alike. A function returning several outputs gets the
    gradient of each (zeros for an output the loss did not use). Inputs of a non-floating dtype
    (e.g. int class indices, see `input_dtypes` in kernel.toml) are not differentiable: autograd
    gets no gradient for them, and the backward op returns zeros for them. The backward op has
    no backward: a gradient of it (double backward: create_graph=True, then a gradient of the
    gradients) is ErrDoubleBackwardNotSupported, naming it;
  - without a backward kernel, an Autograd kernel that lets the forward run on inputs that
    require grad (as torch's own custom ops without an autograd formula do) and refuses a
    backward that reaches it: ErrKernelHasNoBackward, naming the kernel and how to give one.
Forward-mode AD (torch.func.jvp, torch.autograd.forward_ad) reaches either op's Autograd kernel
with a tangent, which no kernel can carry: ErrForwardModeAdNotSupported, rather than a silent
zero derivative.

Each input is checked against its own declared dtypes (the manifest's `dtypes`, or its
`input_dtypes` entry), each attr against the schema's type for it. Errors (KernelCallError): an
input of an undeclared dtype, or on a device other than the CPU; an attr of the wrong type
(`eps="big"`), naming the argument.
A shape the kernel cannot take fails in the kernel's own trace (an NkiError naming its line),
eagerly and under torch.compile alike.

Eager calls that need no autograd and run under no torch transform skip the dispatcher and call
the implementation directly (`TorchBinding.call`), which saves the ~20-60 µs that a Python
custom op costs per call; everything else (autograd, compile, export, vmap, modes) goes through
the registered op, so semantics are the same either way.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.autograd.forward_ad as fwAD
from torch._functorch.utils import enable_single_level_autograd_function

from ..errors import (
    ErrDoubleBackwardNotSupported,
    ErrForwardModeAdNotSupported,
    ErrKernelHasNoBackward,
)
from ..registry.errors import KernelCallError
from .convert import dtype_name, from_numpy, to_numpy, torch_dtype

if TYPE_CHECKING:
    from ..registry.runtime import KernelFunction

_FAKE_DEVICES = ("cpu", "meta")


def _schema_args(fn: KernelFunction) -> list[str]:
    spec = fn.spec
    args = [f"Tensor {n}" for n in spec.inputs]
    args += [f"{_attr_type(k, v)} {k}={_attr_default(v)}" for k, v in spec.attrs.items()]
    return args


def schema_of(fn: KernelFunction) -> str:
    """The op schema for a kernel function, e.g. `(Tensor x, Tensor weight, float eps=1e-06) -> Tensor`."""
    spec = fn.spec
    n = spec.outputs or 1
    ret = "(" + ", ".join(["Tensor"] * n) + ")" if spec.returns_tuple else "Tensor"
    return f"({', '.join(_schema_args(fn))}) -> {ret}"


def _grad_names(fn: KernelFunction) -> list[str]:
    n = fn.spec.outputs or 1
    return ["grad"] if n == 1 and not fn.spec.returns_tuple else [f"grad_{i}" for i in range(n)]


def backward_schema_of(fn: KernelFunction) -> str:
    """The backward op's schema: one gradient per output (`grad`, or `grad_0, grad_1, ...` for
    a tuple-returning function), then the forward's arguments; one gradient per input out."""
    grads = [f"Tensor {g}" for g in _grad_names(fn)]
    return f"({', '.join([*grads, *_schema_args(fn)])}) -> Tensor[]"


def _attr_type(name: str, v: object) -> str:
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "int"
    if isinstance(v, float):
        return "float"
    if isinstance(v, str):
        return "str"
    if isinstance(v, list):
        return "float[]" if any(isinstance(x, float) for x in v) else "int[]"
    raise TypeError(f"attr {name}: unsupported default {v!r}")


def _attr_default(v: object) -> str:
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(repr(x) for x in v) + "]"
    return repr(v)


class TorchBinding:
    """The torch ops of one kernel function. `op` is the forward OpOverload, `backward_op` the
    backward one (or None); `call(full_args)` is what KernelFunction uses for torch inputs."""

    def __init__(self, fn: KernelFunction):
        self.fn = fn
        self.nin = len(fn.spec.inputs)
        self.attr_defaults = tuple(fn.spec.attrs.values())
        self.returns_tuple = fn.spec.returns_tuple
        self.nout = fn.spec.outputs or 1
        # per input: the torch dtypes it may have
        self._allowed = tuple(
            frozenset(torch_dtype(d) for d in fn.spec.accepted_dtypes(n) if _has_torch_dtype(d))
            for n in fn.spec.inputs
        )
        self._attr_names = tuple(fn.spec.attrs)
        ns = fn.namespace
        self.qualname = f"{ns}::{fn.name}"
        self.op_def = torch.library.custom_op(
            self.qualname, self._impl, mutates_args=(), schema=schema_of(fn)
        )
        self.op_def.register_fake(self._fake)
        self.op = getattr(getattr(torch.ops, ns), fn.name).default
        # the Autograd kernels below replace the ones custom_op registered (see _register_autograd)
        self._lib = torch.library.Library(ns, "FRAGMENT")
        self.backward_op = None
        if fn.backward is None:
            _register_autograd(self._lib, self.op, _save_nothing, self._no_backward)
            return
        self.bwd_def = torch.library.custom_op(
            f"{ns}::{fn.name}_backward",
            self._backward_impl,
            mutates_args=(),
            schema=backward_schema_of(fn),
        )
        self.bwd_def.register_fake(self._backward_fake)
        self.backward_op = getattr(getattr(torch.ops, ns), f"{fn.name}_backward").default
        _register_autograd(self._lib, self.op, self._setup_context, self._autograd_backward)
        _register_autograd(self._lib, self.backward_op, _save_nothing, self._no_double_backward)

    # -- argument handling -------------------------------------------------------------------

    def _split(self, args: tuple, kwargs: dict) -> tuple[tuple[torch.Tensor, ...], tuple]:
        """The dispatcher passes the arguments as given: fill in the attrs' defaults."""
        tensors = args[: self.nin]
        attrs = list(args[self.nin :]) + list(self.attr_defaults[len(args) - self.nin :])
        for i, k in enumerate(self.fn.spec.attrs):
            if k in kwargs:
                attrs[i] = kwargs[k]
        return tensors, tuple(attrs)

    def _check(
        self, tensors: tuple[torch.Tensor, ...], devices: tuple[str, ...] = ("cpu",)
    ) -> None:
        for name, t, allowed in zip(self.fn.spec.inputs, tensors, self._allowed):
            if not isinstance(t, torch.Tensor):
                raise KernelCallError(
                    f"{self.fn.name}(): input {name!r} must be a tensor, got {type(t).__name__}"
                )
            if t.is_cpu and t.dtype in allowed:  # the common case, without building names
                continue
            if t.device.type not in devices:
                raise KernelCallError(
                    f"{self.fn.name}(): input {name!r} is on {t.device}; nkikit runs kernels on the "
                    "CPU simulator, so move the inputs to 'cpu' (on Trainium, pull the kernel with "
                    "backend='neuron')"
                )
            self.fn.check_dtype(name, dtype_name(t.dtype))

    # -- forward -----------------------------------------------------------------------------

    def _run(self, tensors: tuple[torch.Tensor, ...], attrs: tuple) -> Any:
        arrays = tuple([to_numpy(t) for t in tensors])
        result = self.fn.entry(*arrays, **dict(zip(self._attr_names, attrs)))
        if self.returns_tuple:
            return tuple(from_numpy(r, arrays) for r in result)
        return from_numpy(result, arrays)

    def _impl(self, *args: Any, **kwargs: Any) -> Any:
        tensors, attrs = self._split(args, kwargs)
        self._check(tensors)
        return self._run(tensors, attrs)

    def _fake(self, *args: Any, **kwargs: Any) -> Any:
        tensors, attrs = self._split(args, kwargs)
        self._check(tensors, _FAKE_DEVICES)
        specs = tuple((tuple(int(s) for s in t.shape), dtype_name(t.dtype)) for t in tensors)
        outs = self.fn.output_specs(specs, attrs)
        device = tensors[0].device
        made = tuple(torch.empty(shape, dtype=torch_dtype(dt), device=device) for shape, dt in outs)
        return made if self.returns_tuple else made[0]

    def call(self, full: tuple) -> Any:
        """Call with (inputs..., attrs...) as KernelFunction.normalize returns them.

        The fast eager path is taken only for arguments the op schema certainly takes; anything
        else goes through the dispatcher, which checks it against the schema (it takes e.g. a
        0-d tensor for a float) and refuses it naming the argument (KernelCallError)."""
        tensors, attrs = full[: self.nin], full[self.nin :]
        typed = self.fn.attrs_accepted(attrs)
        if typed and _eager_plain(tensors, self._allowed):
            if torch.autograd.profiler._is_profiler_enabled:
                # no dispatcher, so no op range: open one by the op's name, as it would be
                with torch.profiler.record_function(self.qualname):
                    return self._run(tensors, attrs)
            return self._run(tensors, attrs)
        if _eager_plain(tensors, None):  # plain tensors, but a dtype or device to refuse
            self._check(tensors)
        if not typed:
            self.fn.check_attr_ranges(attrs)
        try:
            return self.op(*full)
        except RuntimeError as e:
            message = str(e).strip().splitlines()[0] if str(e).strip() else ""
            if "for argument" not in message:
                raise
            raise KernelCallError(f"{self.fn.name}(): {message}") from None

    # -- backward ----------------------------------------------------------------------------

    def _setup_context(self, ctx: Any, inputs: tuple, output: Any) -> None:
        ctx.save_for_backward(*inputs[: self.nin])
        ctx.attrs = tuple(inputs[self.nin :])
        outs = output if self.returns_tuple else (output,)
        # enough to make zeros for an output whose gradient autograd leaves out
        ctx.out_meta = tuple((o.shape, o.dtype, o.device) for o in outs)

    def _autograd_backward(self, ctx: Any, *grads: torch.Tensor | None) -> tuple:
        full = [
            torch.zeros(shape, dtype=dtype, device=device) if g is None else g
            for g, (shape, dtype, device) in zip(grads, ctx.out_meta)
        ]
        tensors = ctx.saved_tensors
        in_grads = self.backward_op(*full, *tensors, *ctx.attrs)
        # integer inputs (class indices, ...) are not differentiable: no gradient at all
        return (
            *(g if t.is_floating_point() else None for g, t in zip(in_grads, tensors)),
            *([None] * len(ctx.attrs)),
        )

    def _no_backward(self, ctx: Any, *grads: torch.Tensor | None) -> tuple:
        """Autograd reached the op of a function without a backward kernel. The forward ran
        (and its outputs require grad), as torch's own custom ops without an autograd formula
        do: a gradient may never be asked of them."""
        raise ErrKernelHasNoBackward(op=self.qualname, function=self.fn.name)

    def _no_double_backward(self, ctx: Any, *grads: torch.Tensor | None) -> tuple:
        """Autograd reached the backward op: a gradient of a gradient (create_graph=True). The
        backward kernel has no backward of its own, and a gradient of zero would be wrong."""
        raise ErrDoubleBackwardNotSupported(op=f"{self.qualname}_backward", function=self.fn.name)

    def _backward_impl(self, *args: Any, **kwargs: Any) -> list[torch.Tensor]:
        out_grads, rest = args[: self.nout], args[self.nout :]
        tensors, attrs = self._split(rest, kwargs)
        self._check(tensors)
        arrays = tuple(to_numpy(t) for t in tensors)
        # the kernels take the output gradients in their float inputs' dtype
        like = next((t.dtype for t in tensors if t.is_floating_point()), None)
        gs = tuple(
            to_numpy(g.to(like) if like is not None and g.dtype != like else g) for g in out_grads
        )
        grads = self.fn.backward(*gs, *arrays, **dict(zip(self.fn.spec.attrs, attrs)))  # type: ignore[misc]
        grads = grads if isinstance(grads, tuple | list) else (grads,)
        if len(grads) != self.nin:
            raise KernelCallError(
                f"{self.fn.name}: the backward kernel returned {len(grads)} gradients for "
                f"{self.nin} inputs"
            )
        out: list[torch.Tensor] = []
        seen: tuple[np.ndarray, ...] = arrays + gs
        for t, gr in zip(tensors, grads):
            if not t.is_floating_point():  # not differentiable: whatever the kernel returned
                out.append(torch.zeros_like(t))
                continue
            if gr is None:
                raise KernelCallError(
                    f"{self.fn.name}: the backward kernel returned no gradient for a floating input"
                )
            a = np.asarray(gr) if not isinstance(gr, np.ndarray) else gr
            gt = from_numpy(a, seen)  # copies if it aliases an input or an earlier gradient
            seen += (a,)
            if gt.dtype != t.dtype:  # autograd wants each gradient in its input's dtype
                gt = gt.to(t.dtype)
            if tuple(gt.shape) != tuple(t.shape):
                raise KernelCallError(
                    f"{self.fn.name}: the backward kernel returned a gradient of shape "
                    f"{tuple(gt.shape)} for an input of shape {tuple(t.shape)}"
                )
            out.append(gt)
        return out

    def _backward_fake(self, *args: Any, **kwargs: Any) -> list[torch.Tensor]:
        tensors, _ = self._split(args[self.nout :], kwargs)
        return [torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in tensors]


def _save_nothing(ctx: Any, inputs: tuple, output: Any) -> None:
    """setup_context of an op whose backward only refuses: it needs nothing from the forward."""


def _register_autograd(
    lib: torch.library.Library,
    op: torch._ops.OpOverload,
    setup_context: Callable[[Any, tuple, Any], None],
    backward: Callable[..., tuple],
) -> None:
    """Register `op`'s Autograd kernel: `backward(ctx, *output_grads)` gives one gradient per
    argument of `op` (None for an attr), from what `setup_context(ctx, inputs, output)` saved.

    Not `CustomOpDef.register_autograd`: the autograd.Function torch builds from it is refused
    by the torch.func transforms that differentiate (grad, vjp, jacrev): it has no
    `setup_context`, and a Function applied inside an op's Autograd kernel sees no transform to
    lift it (pytorch/pytorch#168393, #170834; still so in torch 2.13). This kernel does what
    torch's does, through a single-level Function, the kind functorch itself applies at one
    transform level: without a gradient needed the call goes straight on to the implementation;
    with one, the op runs in a Function whose backward is `backward`. Plain autograd, torch.func
    (at each grad level), torch.compile (AOTAutograd traces this kernel) and opcheck all go
    through it.
    """
    # an autograd.Function's outputs are tensors or tuples of them: a Tensor[] result (the
    # backward op's) goes through as a tuple, or autograd would not track it
    returns_list = isinstance(op._schema.returns[0].type, torch.ListType)

    def below_autograd(keyset: torch._C.DispatchKeySet, *args: Any) -> Any:
        with torch._C._AutoDispatchBelowAutograd():
            return op.redispatch(keyset & torch._C._after_autograd_keyset, *args)

    def forward(keyset: torch._C.DispatchKeySet, *args: Any) -> Any:
        # a Function's forward runs with grad mode off, but under torch.func the call goes on
        # down to the transform levels below this one (and to plain autograd under them), which
        # must record it too (functorch's own single-level Functions turn it back on likewise)
        with torch.enable_grad():
            out = below_autograd(keyset, *args)
        return tuple(out) if returns_list else out

    def setup(ctx: Any, inputs: tuple, output: Any) -> None:
        setup_context(ctx, inputs[1:], list(output) if returns_list else output)

    def backward_with_keyset(ctx: Any, *grads: Any) -> tuple:
        return (None, *backward(ctx, *grads))

    def jvp(ctx: Any, *tangents: Any) -> Any:
        # a call that carried no tangent would give a derivative of zero: refuse instead
        raise ErrForwardModeAdNotSupported(op=op._schema.name)

    # built with type() so that the grad_fn is named after the op: `<namespace>_<op>Backward`
    function = type(
        f"{op._namespace}_{op._opname}",
        (torch.autograd.function._SingleLevelFunction,),
        {
            "forward": staticmethod(forward),
            "setup_context": staticmethod(setup),
            "backward": staticmethod(backward_with_keyset),
            "jvp": staticmethod(jvp),
        },
    )

    def kernel(keyset: torch._C.DispatchKeySet, *args: Any) -> Any:
        if not _needs_autograd(args):
            return below_autograd(keyset, *args)
        with enable_single_level_autograd_function():
            out = function.apply(keyset, *args)
        return list(out) if returns_list else out

    with warnings.catch_warnings():
        # torch warns (once per process) of any kernel registered over another: this one
        # replaces custom_op's on purpose
        warnings.filterwarnings("ignore", "(?s).*Overriding a previously registered kernel")
        lib.impl(op, kernel, "Autograd", with_keyset=True)


def _needs_autograd(args: tuple) -> bool:
    """Whether a call must be recorded: an input requires grad (grad mode on), or carries a
    forward-mode tangent (a dual tensor of torch.autograd.forward_ad or torch.func.jvp)."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return True
    if fwAD._current_level < 0:
        return False
    return any(fwAD.unpack_dual(t).tangent is not None for t in tensors)


def _has_torch_dtype(name: str) -> bool:
    try:
        torch_dtype(name)
    except TypeError:
        return False
    return True


def _eager_plain(tensors: tuple, allowed: tuple[frozenset[torch.dtype], ...] | None) -> bool:
    """True when a call can skip the dispatcher: plain tensors (on the CPU, each of a dtype
    its input allows, unless allowed is None), no autograd needed, no compile/export tracing,
    no dispatch mode, no functorch transform and no forward-mode AD level active (a dual
    tensor is a plain tensor: only the Autograd kernel sees, and refuses, its tangent)."""
    if torch.compiler.is_compiling() or fwAD._current_level >= 0:
        return False
    grad = torch.is_grad_enabled()
    for i, t in enumerate(tensors):
        if type(t) is not torch.Tensor or (grad and t.requires_grad):
            return False
        if allowed is not None and not (t.is_cpu and t.dtype in allowed[i]):
            return False
    return (
        torch._C._len_torch_dispatch_stack() == 0
        and not torch._C._are_functorch_transforms_active()
    )
