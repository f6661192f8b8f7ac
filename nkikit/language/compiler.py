"""NKI Beta-1's ``nki.compiler`` names (re-exported by :mod:`nkikit.compiler`): direct allocation
(``sbuf`` / ``psum`` with ``alloc``, ``mod_alloc``, ``auto_alloc``), the kernel decorators
(``skip_middle_end_transformations``, ``enable_stack_allocator``, ``force_auto_alloc``) and the
loop directives (``no_reorder()``, ``multi_buffer(factor)``) passed as ``directives=`` to
``nl.affine_range`` / ``nl.sequential_range`` / ``nl.static_range``.

Contract of direct allocation here: ``nl.ndarray(shape, dtype, buffer=<allocation>)`` places the
tensor in that allocation's memory, and the allocation is *checked* where the tensor is created --
every block's address range must lie inside the target's SBUF partition (bytes) or its PSUM banks,
and a PSUM block must fit in one bank -- with ``err_allocation_out_of_bounds`` and the user's
line.  The allocation is recorded (:func:`user_allocation`) and decides the tensor's footprint,
``Tensor.user_span``: the bytes of each partition its blocks occupy, blocks beyond the allocated
tiles aliasing modulo them (a PSUM block takes its whole bank).  The capacity rule and the
allocator count that span, not the whole tensor (``nkikit/ir/residency.py``); the allocator
keeps a user's tensor at its address -- one buffer, never spilled -- and places its own tensors
beside the user spans (SBUF) or above the highest user bank (PSUM), and a span past the SBUF of
the target compiled for is ``err_allocation_out_of_bounds`` there
(``nkikit/compiler/allocate.py``).  Overlapping user
allocations are allowed: the Beta-1 compiler trusts direct allocation, and the program orders
the tenants of an address (the attention tutorial reuses PSUM banks that way; the cost model's
scheduler orders the instructions of overlapping placements).  The simulators keep every block
apart (a kernel that reads a block after an aliasing block overwrote it is not modeled).
``force_auto_alloc`` drops the direct allocations of a kernel (its tensors are placed as if
allocated automatically); the other decorators set kernel options that change nothing in
simulation or in the model (the model has no middle-end to skip); ``no_reorder`` marks a loop
whose instructions keep program order, which the simulator always does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import NkiError, SourceLoc, caller_loc
from ..targets import default_target
from .creation import Buffer
from .creation import psum as _psum_buffer
from .creation import sbuf as _sbuf_buffer

__all__ = [
    "Allocation",
    "Directive",
    "enable_stack_allocator",
    "force_auto_alloc",
    "multi_buffer",
    "no_reorder",
    "psum",
    "sbuf",
    "skip_middle_end_transformations",
    "user_allocation",
]


@dataclass(frozen=True)
class Allocation:
    """A user's placement of a tensor: ``memory`` is ``"sbuf"`` or ``"psum"``; ``kind`` is
    ``"mod"`` (modulo allocation: ``base`` is the SBUF byte address or the PSUM bank, ``tiles``
    the number of physical tiles per block dimension) or ``"func"`` (``func(idx, pdim_size,
    fdim_size)`` gives each block's ``(start_partition, byte_addr)`` in SBUF or ``(bank,
    start_partition, byte_addr)`` in PSUM)."""

    memory: str
    kind: str
    base: int = 0
    tiles: tuple[int, ...] = ()
    func: Callable | None = None

    @property
    def name(self) -> str:
        """The buffer the tensor lives in (what ``nl.sbuf`` / ``nl.psum`` name)."""
        return self.memory


class _MemorySpace(Buffer):
    """``nki.compiler.sbuf`` / ``nki.compiler.psum``: the buffer itself (as ``nl.sbuf``), plus the
    direct-allocation constructors."""

    __slots__ = ()

    def alloc(self, func: Callable) -> Allocation:
        """Place each block by ``func`` (see :class:`Allocation`)."""
        if not callable(func):
            raise TypeError(f"nki.compiler.{self.name}.alloc expects a function, got {func!r}")
        return Allocation(self.name, "func", func=func)

    def auto_alloc(self) -> Buffer:
        """Leave the placement to the compiler (what ``nl.sbuf`` / ``nl.psum`` mean)."""
        return _sbuf_buffer if self.name == "sbuf" else _psum_buffer


class _Sbuf(_MemorySpace):
    __slots__ = ()

    def mod_alloc(
        self, *, base_addr: int, base_partition: int = 0, num_par_tiles=(), num_free_tiles=()
    ) -> Allocation:
        """Modulo allocation from byte ``base_addr`` of each partition: block ``i`` of a
        dimension with ``n`` physical tiles lives in tile ``i % n``."""
        if base_partition or num_par_tiles:
            _unsupported(
                "nki.compiler.sbuf.mod_alloc(base_partition=, num_par_tiles=)",
                "blocks start at partition 0 and tile the free dimension",
            )
        return Allocation("sbuf", "mod", int(base_addr), _tiles(num_free_tiles))


class _Psum(_MemorySpace):
    __slots__ = ()

    def mod_alloc(
        self,
        *,
        base_bank: int,
        base_addr: int = 0,
        base_partition: int = 0,
        num_bank_tiles=(),
        num_par_tiles=(),
        num_free_tiles=(),
    ) -> Allocation:
        """Modulo allocation from PSUM bank ``base_bank``: block ``i`` of a dimension with ``n``
        bank tiles lives in bank ``base_bank + i % n``."""
        if base_addr or base_partition or num_par_tiles or num_free_tiles:
            _unsupported(
                "nki.compiler.psum.mod_alloc(base_addr=, base_partition=, ...)",
                "give base_bank and num_bank_tiles (one block per bank)",
            )
        return Allocation("psum", "mod", int(base_bank), _tiles(num_bank_tiles))


def _unsupported(api: str, why: str) -> None:
    raise NkiError("err_unsupported_api", caller_loc(), api=api, why=why)


def _tiles(t) -> tuple[int, ...]:
    if isinstance(t, int | np.integer):
        return (int(t),)
    return tuple(int(x) for x in t)


sbuf = _Sbuf("sbuf")
psum = _Psum("psum")


def check_allocation(
    alloc: Allocation, shape: tuple[int, ...], par_axis: int, itemsize: int, loc: SourceLoc
) -> tuple[int, int]:
    """Raise ``err_allocation_out_of_bounds`` unless every block of a tensor of this shape fits
    the target's memory under ``alloc``.  Dimensions before the partition axis are the blocks;
    those after it make one block's bytes per partition.  Returns the bytes ``[start, end)`` of
    each partition the blocks occupy (a PSUM block takes its whole bank): blocks beyond the
    allocated tiles alias, so this is the tensor's footprint (``Tensor.user_span``)."""
    tgt = default_target()
    blocks = shape[:par_axis]
    block_bytes = int(np.prod(shape[par_axis + 1 :], dtype=np.int64)) * itemsize
    if alloc.kind == "func":
        return _check_func(alloc, blocks, shape[par_axis], block_bytes, loc, tgt)
    # a block dimension with n physical tiles occupies min(n, blocks) of them; tile counts for
    # dimensions the tensor does not have change nothing (the shape already holds the buffers)
    n_phys = 1
    for i, nblk in enumerate(blocks):
        n_phys *= min(alloc.tiles[i], nblk) if i < len(alloc.tiles) else 1
    if alloc.memory == "sbuf":
        end = alloc.base + n_phys * block_bytes
        if alloc.base < 0 or end > tgt.sbuf_bytes:
            _oob(
                loc,
                f"bytes [{alloc.base}, {end}) of each SBUF partition, which has {tgt.sbuf_bytes}",
            )
        return alloc.base, end
    else:
        if block_bytes > tgt.psum_bank_bytes:
            _oob(
                loc,
                f"a PSUM block of {block_bytes} bytes per partition; a bank holds "
                f"{tgt.psum_bank_bytes}",
            )
        if alloc.base < 0 or alloc.base + n_phys > tgt.psum_banks:
            _oob(loc, f"PSUM banks [{alloc.base}, {alloc.base + n_phys}) of {tgt.psum_banks}")
        bank = tgt.psum_bank_bytes
        return alloc.base * bank, (alloc.base + n_phys) * bank


def _check_func(alloc, blocks, partitions, block_bytes, loc, tgt) -> tuple[int, int]:
    lo, hi = None, 0
    for idx in np.ndindex(*blocks) if blocks else [()]:
        where = alloc.func(tuple(int(i) for i in idx), partitions, block_bytes)
        where = tuple(int(w) for w in where)
        if alloc.memory == "sbuf":
            part, addr = where[-2], where[-1]
            if (
                part < 0
                or part + partitions > tgt.pmax
                or addr < 0
                or (addr + block_bytes > tgt.sbuf_bytes)
            ):
                _oob(loc, f"block {idx} at partition {part}, byte {addr}")
            start, end = addr, addr + block_bytes
        else:
            bank = where[0]
            if not 0 <= bank < tgt.psum_banks or block_bytes > tgt.psum_bank_bytes:
                _oob(loc, f"block {idx} in PSUM bank {bank}")
            start, end = bank * tgt.psum_bank_bytes, (bank + 1) * tgt.psum_bank_bytes
        lo = start if lo is None else min(lo, start)
        hi = max(hi, end)
    # blocks placed apart count with the memory between them (nkikit places a tensor in one range)
    return lo or 0, hi


def _oob(loc: SourceLoc, what: str) -> None:
    raise NkiError("err_allocation_out_of_bounds", loc, what=what)


_recorded: dict[int, Allocation] = {}


def record(tensor_uid: int, alloc: Allocation) -> None:
    """Remember the user's allocation of a tensor (by the IR tensor's uid)."""
    _recorded[tensor_uid] = alloc


def user_allocation(tensor: Any) -> Allocation | None:
    """The direct allocation a tensor was created with, or None (automatic allocation)."""
    return _recorded.get(getattr(tensor, "uid", -1))


# ---------------------------------------------------------------------------------------------
# decorators


def _kernel_option(name: str, func: Callable | None, **extra) -> Any:
    def apply(f):
        from .jit import jit

        kernel = getattr(f, "kernel", None) or jit(f)
        kernel.options[name] = extra or True
        return f if hasattr(f, "kernel") else kernel

    return apply if func is None else apply(func)


def skip_middle_end_transformations(func: Callable | None = None) -> Any:
    """Kernel decorator: compile without the middle end's transformations (a kernel option here:
    nkikit's compiler has no middle end to skip)."""
    return _kernel_option("skip_middle_end_transformations", func)


def enable_stack_allocator(func: Callable | None = None, log_level: int = 50) -> Any:
    """Kernel decorator: allocate SBUF/PSUM with a stack allocator (a kernel option here)."""
    return _kernel_option("enable_stack_allocator", func, log_level=log_level)


def force_auto_alloc(func: Callable | None = None) -> Any:
    """Kernel decorator: ignore direct allocations (the kernel's tensors are placed as if
    allocated automatically; the allocations are still checked where they are made)."""
    return _kernel_option("force_auto_alloc", func)


# ---------------------------------------------------------------------------------------------
# loop directives


@dataclass(frozen=True)
class Directive:
    """A loop directive: ``kind`` is ``"no_reorder"`` or ``"multi_buffer"`` (with ``factor``)."""

    kind: str
    factor: int = 1


def no_reorder() -> Directive:
    """Keep the loop body's instructions in program order."""
    return Directive("no_reorder")


def multi_buffer(factor: int = 2) -> Directive:
    """Multi-buffer the tensors allocated in the loop body ``factor`` times."""
    if not isinstance(factor, int | np.integer) or isinstance(factor, bool) or factor < 1:
        raise NkiError(
            "err_invalid_argument",
            caller_loc(),
            op="nki.compiler.multi_buffer",
            why=f"factor must be an int of at least 1, got {factor!r}",
        )
    return Directive("multi_buffer", int(factor))


def check_directives(directives: object) -> tuple[Directive, ...]:
    """The loop directives passed as ``directives=`` (one or a sequence), checked."""
    if directives is None:
        return ()
    items = directives if isinstance(directives, Sequence) else (directives,)
    for d in items:
        if not isinstance(d, Directive):
            raise NkiError(
                "err_invalid_argument",
                caller_loc(),
                op="loop directives",
                why=f"directives= takes nki.compiler.no_reorder() or multi_buffer(), got {d!r}",
            )
    return tuple(items)
