"""The emulated ``neuron`` device for PyTorch (eager mode).

Contract: after ``import nkikit.torch.neuron`` (or a call of :func:`neuron_device`, which is
idempotent), ``"neuron"`` is a torch device like TorchNeuron's: ``torch.randn(..., device=
"neuron")``, ``t.to("neuron")``, ``module.to("neuron")``, ``t.cpu()``, ``t.to(torch.bfloat16)``,
printing and autograd all work on unmodified PyTorch code.  A tensor on the device is a
:class:`NeuronTensor`: a wrapper subclass whose data lives in a CPU tensor (``_storage``), the
emulated HBM.  Every ATen op on it goes through :func:`nkikit.torch.neuron.dispatch.dispatch`,
which runs it as an NKI kernel on the simulator, as a zero-cost view of the storage, or as a
counted CPU fallback (see the ops table in :mod:`nkikit.torch.neuron.ops`).  There is one
device, ``neuron:0`` (one emulated NeuronCore): a tensor created or moved to another index is
refused (:func:`check_index`).

How (PyTorch's pure-Python extension points, torch 2.x): the PrivateUse1 backend is renamed
``neuron`` (``torch.utils.backend_registration``), factories get Python kernels at the
``PrivateUse1`` dispatch key (``empty.memory_format``, ``empty_strided``), and ``torch.rms_norm``,
``F.layer_norm`` and ``F.scaled_dot_product_attention`` get kernels at ``AutogradPrivateUse1``
so that they reach the device whole (one library kernel each) instead of decomposed.
"""

from __future__ import annotations

import threading
from typing import Any

import torch
from torch.utils._pytree import tree_leaves, tree_map

from ...arrays import DEVICE_TYPE

DEVICE = DEVICE_TYPE  # "neuron"
HOST = torch.device("cpu")  # where a device tensor's storage (the emulated HBM) lives
_SETUP_LOCK = threading.Lock()
_SETUP: list[Any] = []  # the torch.library.Library objects, kept alive once set up


class NeuronTensor(torch.Tensor):
    """A tensor on the emulated device; its data is the CPU tensor ``_storage`` (which views
    of it share, so in-place ops and views behave as on any torch device)."""

    _storage: torch.Tensor

    @staticmethod
    def __new__(cls, data: torch.Tensor, requires_grad: bool = False) -> NeuronTensor:
        r = torch.Tensor._make_wrapper_subclass(
            cls,
            data.shape,
            dtype=data.dtype,
            device=torch.device(DEVICE, 0),
            strides=data.stride(),
            storage_offset=data.storage_offset(),
            requires_grad=requires_grad,
            # the wrapper's own storage is metadata (the data is ``_storage``).  One of zero
            # bytes is resized when torch.compile fakes the tensor, and a Python device has no
            # resize hook (PrivateUse1's is C++ only): a nominal byte keeps an empty tensor
            # from asking
            storage_size=None if data.numel() else 1,
        )
        r._storage = data
        return r

    def __repr__(self, *, tensor_contents: Any = None) -> str:
        body = repr(self._storage.detach())
        body = body.replace("tensor(", "NeuronTensor(", 1)
        return body[:-1] + f", device='{self.device}')" if body.endswith(")") else body

    def tolist(self) -> Any:
        """The values as nested Python lists (a transfer to the host, as on any device)."""
        return self._storage.tolist()

    # torch.compile: a traceable wrapper subclass (torch.utils._python_dispatch), so Dynamo and
    # AOTAutograd see through a device tensor to its storage and trace the storage's ATen ops;
    # the compiled graph then runs on the device (nkikit.torch.neuron.backend) and AOTAutograd
    # wraps its results back into device tensors.
    def __tensor_flatten__(self) -> tuple[list[str], None]:
        return ["_storage"], None

    @staticmethod
    def __tensor_unflatten__(
        inner: dict[str, torch.Tensor], meta: None, outer_size: Any, outer_stride: Any
    ) -> NeuronTensor:
        return NeuronTensor(inner["_storage"])

    def __coerce_same_metadata_as_tangent__(
        self, expected_metadata: Any, expected_type: type | None = None
    ) -> torch.Tensor | None:
        """The gradient AOTAutograd hands a compiled backward for an output the graph traced
        as a plain tensor on the device (``.to("neuron")`` of a host input, a factory on the
        device): the graph runs on host tensors, so the storage is that tensor (None, so
        torch's own error, for any other expectation)."""
        return self._storage if expected_type is torch.Tensor else None

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _tracing(args, kwargs):  # under torch.compile's tracing: the op itself, no kernel
            return _trace(func, args, kwargs)
        from .dispatch import dispatch

        return dispatch(func, args, kwargs)


def _tracing(args: Any, kwargs: Any) -> bool:
    """Whether device tensors hold fake or functional tensors (Dynamo/AOTAutograd tracing)."""
    from torch._subclasses.fake_tensor import FakeTensor
    from torch._subclasses.functional_tensor import FunctionalTensor

    return any(
        isinstance(a, NeuronTensor) and isinstance(a._storage, FakeTensor | FunctionalTensor)
        for a in tree_leaves((args, kwargs))
    )


def _trace(func: Any, args: tuple, kwargs: dict) -> Any:
    """One op on device tensors while torch.compile traces (Dynamo's fake run, AOTAutograd's
    graph): the op itself on the storages, so the traced graph is a graph of host tensors that
    the backend runs as one device program.

    Contract: the result is a device tensor, as in eager mode, unless the op moves it to
    another device (``.cpu()``, ``.to("cpu")``: ``_to_copy`` with a host ``device=``), which
    returns the host tensor itself.  A tensor the graph made on the device (a factory's
    result, such as the scalar ``torch.where(c, a, 0.0)`` makes or attention's causal mask) is,
    while tracing, a plain fake tensor whose device is ``neuron``, with no storage: it is
    copied to the host (a ``_to_copy`` in the graph, which the backend runs on the host) so
    that the op sees tensors of one device; ``device="neuron"`` arguments become the host's."""
    to = kwargs.get("device")
    check_index(to)
    leaves = to is not None and torch.device(to).type != DEVICE
    if to is not None and not leaves:
        kwargs = {**kwargs, "device": HOST}
    out = func(*tree_map(_traced_storage, args), **tree_map(_traced_storage, kwargs))
    if leaves:
        return out
    return tree_map(lambda t: wrap(t) if isinstance(t, torch.Tensor) else t, out)


def _traced_storage(t: Any) -> Any:
    """A traced device tensor's storage; a traced tensor made on the device, copied to the
    host (see :func:`_trace`); anything else as it is."""
    if isinstance(t, NeuronTensor):
        return t._storage
    if isinstance(t, torch.Tensor) and t.device.type == DEVICE:
        return torch.ops.aten._to_copy.default(t, device=HOST)
    return t


def check_index(device: Any) -> None:
    """Refuse ``device`` if it names a ``neuron`` device other than index 0.

    There is one emulated NeuronCore (``torch.neuron.device_count()`` is 1), so ``neuron:1``
    is a device this machine does not have: a tensor created or moved there raises
    :class:`nkikit.errors.ErrNoSuchNeuronDevice` at the user's line, as torch refuses a
    device ordinal it does not have, rather than landing silently on ``neuron:0``.  ``None``
    and other device types pass."""
    if device is None:
        return
    d = torch.device(device)
    if d.type == DEVICE and d.index not in (None, 0):
        from nkikit.errors import ErrNoSuchNeuronDevice, SourceLoc

        from .dispatch import _user_frame

        raise ErrNoSuchNeuronDevice(SourceLoc(*_user_frame()), device=str(d))


def wrap(t: torch.Tensor) -> NeuronTensor:
    """The device tensor whose storage is the CPU tensor ``t``."""
    return NeuronTensor(t)


def storage(t: Any) -> Any:
    """A device tensor's CPU storage; anything else as it is."""
    return t._storage if isinstance(t, NeuronTensor) else t


def neuron_device() -> torch.device:
    """Set up the ``neuron`` device once (idempotent, thread-safe) and return it."""
    with _SETUP_LOCK:
        if not _SETUP:
            _setup()
    return torch.device(DEVICE, 0)


class _BackendModule:
    """``torch.neuron``: what torch asks of a device's module.  Random numbers on the device
    are drawn by the CPU generator (see the ops table), so the device's RNG state is the CPU's:
    ``torch.random.fork_rng`` and AOTAutograd's RNG handling, which visit every registered
    device, save and restore it like any other."""

    def is_initialized(self) -> bool:
        return True

    def is_available(self) -> bool:
        return True

    def current_device(self) -> int:
        return 0

    def device_count(self) -> int:
        return 1

    def _is_in_bad_fork(self) -> bool:
        return False

    # torch.manual_seed seeds the CPU generator and then calls these: nothing more to seed
    def manual_seed(self, seed: int) -> None:
        pass

    def manual_seed_all(self, seed: int) -> None:
        pass

    def initial_seed(self) -> int:
        return torch.initial_seed()

    def get_rng_state(self, device: Any = None) -> torch.Tensor:
        return torch.get_rng_state()

    def set_rng_state(self, new_state: torch.Tensor, device: Any = None) -> None:
        torch.set_rng_state(new_state)


def _setup() -> None:
    from torch.utils import backend_registration

    if torch._C._get_privateuse1_backend_name() != DEVICE:
        backend_registration._setup_privateuseone_for_python_backend(
            DEVICE, backend_module=_BackendModule()
        )
    lib = torch.library.Library("aten", "IMPL")
    lib.impl("empty.memory_format", _empty, "PrivateUse1")
    lib.impl("empty_strided", _empty_strided, "PrivateUse1")
    # torch.tensor(data, device="neuron") copies below the Python dispatch key
    lib.impl("_copy_from", _copy_from, "PrivateUse1")
    _SETUP.append(lib)
    # the autograd engine runs the backward of a non-CPU device on a thread of its own, which
    # for a device set up from Python holds Python state: one still alive while the
    # interpreter shuts down aborts the process ("terminate called without an active
    # exception", about one exit in two after a backward on the device).  Every op of this
    # device runs on the host anyway: backward runs on the calling thread, as on the CPU
    # (per thread: the thread that sets the device up, the main one as a rule)
    torch.autograd.set_multithreading_enabled(False)
    from .fused import register

    _SETUP.append(register())


def _empty(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    check_index(device)  # every factory and host -> device copy allocates here first
    fmt = memory_format or torch.contiguous_format
    return wrap(torch.empty(size, dtype=dtype, memory_format=fmt))


def _empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    check_index(device)
    return wrap(torch.empty_strided(size, stride, dtype=dtype))


def _copy_from(self, dst, non_blocking=False):
    from .stats import device_stats

    device_stats().transfer("_copy_from.default")
    storage(dst).copy_(storage(self))
    return dst
