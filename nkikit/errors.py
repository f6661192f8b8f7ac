"""The error catalogue: every rejection nkikit makes has an NKI error name, a message template
and the kernel's own source location.

Names follow the legacy NKI error catalogue (``err_*``), so a message found here can be looked
up in AWS's documentation.  Messages say what is wrong and what to do about it.

Each entry is a subclass of :class:`NkiError` carrying its NKI ``name`` and ``template``:
``except nkikit.errors.ErrNumPartitionExceedArchLimit`` catches exactly that rejection.
``NkiError("err_num_partition_exceed_arch_limit", loc, size=256, limit=128)`` constructs
(and so raises) the matching subclass, so raise sites may name an entry by its string; a name
that is not in the catalogue is an :class:`NkiInternalError` (a bug in nkikit, not in the
kernel).
"""

from __future__ import annotations

import functools
import linecache
import os
import sys
import types
from dataclasses import dataclass
from typing import ClassVar

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_HUB_DIR = os.path.join(os.path.dirname(_PACKAGE_DIR), "hub")
# kernels that ship inside the package are user code as far as locations are concerned
_KERNEL_DIRS = (os.path.join(_PACKAGE_DIR, "demo") + os.sep,)


@dataclass(frozen=True, slots=True)
class SourceLoc:
    """A place in the user's kernel source."""

    file: str
    line: int
    function: str = ""

    def __str__(self) -> str:
        return f"{os.path.basename(self.file)}:{self.line}"

    @property
    def text(self) -> str:
        return linecache.getline(self.file, self.line).strip()


UNKNOWN_LOC = SourceLoc("<unknown>", 0)


@functools.lru_cache(maxsize=4096)
def _is_internal(filename: str) -> bool:
    # cached: every traced instruction walks the stack to the user's frame
    path = os.path.abspath(filename)
    if path.startswith(_KERNEL_DIRS):
        return False
    return path.startswith(_PACKAGE_DIR + os.sep) or path.startswith(_HUB_DIR + os.sep)


def caller_loc() -> SourceLoc:
    """The innermost stack frame outside the nkikit package: the user's kernel line."""
    frame = sys._getframe(1)
    internal = _INTERNAL
    code = frame.f_code
    # one dict look-up per frame (every traced instruction and tensor walks the stack)
    while internal[code.co_filename]:
        frame = frame.f_back
        if frame is None:
            return UNKNOWN_LOC
        code = frame.f_code
    # keyed by the call site: the code object's id (hashing a code object hashes its
    # contents) and the offset of its instruction.  ``f_lineno`` decodes the line table from
    # the start of the function, which costs microseconds in a long kernel, so only a call
    # site not seen before asks for it.  The entry holds the code object, so the id stays its own.
    site = (id(code), frame.f_lasti)
    hit = _SITES.get(site)
    if hit is not None:
        return hit[1]
    line = frame.f_lineno
    key = (id(code), line)
    hit = _LOCS.get(key)
    if hit is None:
        # one object per source line: an unrolled loop's ops share theirs
        hit = _LOCS[key] = (code, SourceLoc(code.co_filename, line, code.co_name))
    if sys.gettrace() is None:  # a line tracer (debugger, coverage) may move f_lineno
        _SITES[site] = hit
    return hit[1]


_SITES: dict[tuple[int, int], tuple[types.CodeType, SourceLoc]] = {}  # call site -> its line
_LOCS: dict[tuple[int, int], tuple[types.CodeType, SourceLoc]] = {}  # (code, line) -> line


class _Internal(dict):
    """File name -> whether it is nkikit's own (:func:`_is_internal`), filled on first use."""

    def __missing__(self, filename: str) -> bool:
        flag = self[filename] = _is_internal(filename)
        return flag


_INTERNAL = _Internal()


class NkiInternalError(RuntimeError):
    """A bug in nkikit itself (e.g. a raise site naming an error that is not in the catalogue),
    never a problem with the user's kernel."""

    def __init__(self, message: str) -> None:
        super().__init__(f"internal error in nkikit (please report it): {message}")


class NkiError(Exception):
    """A kernel rejected by nkikit, as the Neuron compiler or hardware would reject it.

    Construct an entry's class directly, ``ErrInvalidArgument(loc, op=..., why=...)``, or by
    name, ``NkiError("err_invalid_argument", loc, op=..., why=...)``; both give an instance of
    the entry's class.  The keyword fields fill the entry's ``template``.

    Attributes: ``name`` (the NKI error name, e.g. ``err_num_partition_exceed_arch_limit``),
    ``loc`` (the kernel's file:line that caused it), ``detail`` (the formatted message) and
    ``fields`` (the keyword fields).
    """

    name: ClassVar[str] = ""
    template: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if not cls.name.startswith("err_") or not cls.template:
            raise NkiInternalError(f"{cls.__name__} needs an err_* name and a template")
        if cls.name in _CLASSES:
            raise NkiInternalError(f"{cls.name} is defined twice")
        _CLASSES[cls.name] = cls

    def __new__(cls, *args: object, **fields: object) -> NkiError:
        if cls is NkiError:
            if not args or not isinstance(args[0], str):
                raise TypeError("NkiError(name, loc=None, **fields) takes an error name first")
            cls = error_class(args[0])
        return super().__new__(cls)

    def __init__(self, *args: object, **fields: object) -> None:
        rest = list(args)
        if rest and isinstance(rest[0], str):  # NkiError("err_x", ...): the name picked the class
            given = rest.pop(0)
            if given != self.name:
                raise NkiInternalError(f"{type(self).__name__} constructed as {given!r}")
        if len(rest) > 1 or (rest and rest[0] is not None and not isinstance(rest[0], SourceLoc)):
            raise NkiInternalError(f"{self.name}: expected (loc, **fields), got {args!r}")
        loc = rest[0] if rest else None
        try:
            detail = self.template.format(**fields)
        except (KeyError, IndexError) as e:
            raise NkiInternalError(
                f"{self.name}: its template needs field {e}, the raise site gave {sorted(fields)}"
            ) from None
        self.loc = loc or UNKNOWN_LOC
        self.detail = detail
        self.fields = fields
        super().__init__(self._render())

    def __reduce__(self) -> tuple:
        # rebuild from name, location and fields (the default would pass the rendered message)
        return (_rebuild, (self.name, self.loc, self.fields))

    def _render(self) -> str:
        where = f"{self.loc}: " if self.loc != UNKNOWN_LOC else ""
        text = self.loc.text if self.loc != UNKNOWN_LOC else ""
        code = f"\n    {text}" if text else ""
        return f"{where}{self.name}: {self.detail}{code}"

    def at(self, loc: SourceLoc) -> NkiError:
        """Attach a location if none is known yet."""
        if self.loc == UNKNOWN_LOC:
            self.loc = loc
            self.args = (self._render(),)
        return self


_CLASSES: dict[str, type[NkiError]] = {}


def error_class(name: str) -> type[NkiError]:
    """The catalogue entry ``name`` names; NkiInternalError if there is none."""
    try:
        return _CLASSES[name]
    except KeyError:
        raise NkiInternalError(
            f"unknown error name {name!r}; add it to the catalogue in nkikit/errors.py"
        ) from None


def _rebuild(name: str, loc: SourceLoc, fields: dict[str, object]) -> NkiError:
    return NkiError(name, loc, **fields)


# -- the catalogue: one class per entry, in the order of the pipeline -------------------------
# Templates are formatted with the keyword fields of the raise site (tests/test_errors.py checks
# every site passes exactly its template's fields).


class ErrNumPartitionExceedArchLimit(NkiError):
    name = "err_num_partition_exceed_arch_limit"
    template = (
        "Size of partition dimension {size} exceeds architecture limitation of {limit}; "
        "tile the partition dimension by nl.tile_size.pmax"
    )


class ErrSizeOfDimensionExceedArchLimit(NkiError):
    name = "err_size_of_dimension_exceed_arch_limit"
    template = "{what} has free size {size}, over the architecture limit of {limit}"


class ErrNumPartitionMismatch(NkiError):
    name = "err_num_partition_mismatch"
    template = (
        "{op}: operands have {a} and {b} partitions; they must match "
        "(use broadcast_to to broadcast along the partition dimension)"
    )


class ErrUnsupportedMemory(NkiError):
    name = "err_unsupported_memory"
    template = "{op}: {what} must be in {allowed}, got {got}"


class ErrTensorAccessOutOfBound(NkiError):
    name = "err_tensor_access_out_of_bound"
    template = (
        "access to {tensor} is out of bounds: dimension {dim} reaches index {index}, size is {size}"
    )


class ErrUnexpectedOutputDependencies(NkiError):
    name = "err_unexpected_output_dependencies"
    template = (
        "{op} writes {tensor} at the same location in every iteration of affine_range loop "
        "'{loop}' (missing indices in the dst access); index the destination by the loop "
        "variable, or use sequential_range for a loop-carried dependency"
    )


class ErrLocalVariableUsedOutOfScope(NkiError):
    name = "err_local_variable_used_out_of_scope"
    template = (
        "{tensor} was created inside a loop body and is used outside of it; create it "
        "before the loop"
    )


class ErrTensorOutputNotWrittenTo(NkiError):
    name = "err_tensor_output_not_written_to"
    template = "output tensor {tensor} is returned but never written to"


class ErrCannotUpdateImmutableParameter(NkiError):
    name = "err_cannot_update_immutable_parameter"
    template = (
        "kernel parameter {tensor} is immutable; annotate it as nt.mutable_tensor to write to it"
    )


class ErrActivationBiasInvalidType(NkiError):
    name = "err_activation_bias_invalid_type"
    template = "activation bias must be a (P, 1) tile of float32, float16 or bfloat16, got {got}"


class ErrActivationScaleInvalidType(NkiError):
    name = "err_activation_scale_invalid_type"
    template = "activation scale must be float32, got {got}"


class ErrActivationScaleScalarOrVector(NkiError):
    name = "err_activation_scale_scalar_or_vector"
    template = "activation scale must be a python scalar or a (P, 1) tile, got shape {got}"


class ErrUnsupportedExpressionInMask(NkiError):
    name = "err_unsupported_expression_in_mask"
    template = (
        "mask must be a comparison of affine expressions of aranges, loop variables and "
        "program ids, combined with &; got {got}"
    )


class ErrControlFlowConditionDependingOnArange(NkiError):
    name = "err_control_flow_condition_depending_on_arange"
    template = "a Python condition depends on an arange index ({expr}); use mask= instead"


class ErrDynamicControlFlowNotSupported(NkiError):
    name = "err_dynamic_control_flow_not_supported"
    template = (
        "a Python condition depends on a loop variable or program id ({expr}), whose value is "
        "only known at run time; use mask=, or nl.static_range to unroll the loop"
    )


class Err1dArangeNotSupported(NkiError):
    name = "err_1d_arange_not_supported"
    template = (
        "a 1-D arange cannot index a tensor; give it an axis, e.g. nl.arange(n)[:, None] "
        "for the partition axis or nl.arange(n)[None, :] for the free axis"
    )


class ErrUnsupportedMixingBasicAdvancedTensorIndexing(NkiError):
    name = "err_unsupported_mixing_basic_advanced_tensor_indexing"
    template = (
        "an index mixes slices with arange expressions; use aranges (or slices) for every axis"
    )


class ErrAmbiguousTensorTruthValue(NkiError):
    name = "err_ambiguous_tensor_truth_value"
    template = "the truth value of a tile is unknown while tracing; use nl.where or a mask"


class ErrExceedMaxSupportedDimension(NkiError):
    name = "err_exceed_max_supported_dimension"
    template = "{what} has {ndim} dimensions; at most {limit} allowed"


class ErrSharedHbmMustInKernelLevel(NkiError):
    name = "err_shared_hbm_must_in_kernel_level"
    template = (
        "shared_hbm tensors must be created at the top level of the kernel, not inside a loop"
    )


class ErrStoreDstShapeSmallerThanOtherShape(NkiError):
    name = "err_store_dst_shape_smaller_than_other_shape"
    template = "{op}: destination shape {dst} does not match value shape {src}"


class ErrNkiApiOutsideOfNkiKernel(NkiError):
    name = "err_nki_api_outside_of_nki_kernel"
    template = "{api} can only be called inside a kernel decorated with @nki.jit"


class ErrNonAffineIndex(NkiError):
    name = "err_non_affine_index"
    template = "index expression {expr} is not affine in loop variables, aranges and program ids"


class ErrSbufCapacityExceeded(NkiError):
    name = "err_sbuf_capacity_exceeded"
    template = (
        "{buffer} usage of {used} bytes per partition exceeds the capacity of {limit} bytes; "
        "largest tensors: {tensors}"
    )


class ErrPsumCapacityExceeded(NkiError):
    name = "err_psum_capacity_exceeded"
    template = "PSUM tile {tensor} uses {used} bytes per partition, over the {limit}-byte bank"


class ErrUnsupportedDtype(NkiError):
    name = "err_unsupported_dtype"
    template = "{op}: dtype {dtype} is not supported here ({why})"


class ErrUnsupportedInstructionOnTarget(NkiError):
    name = "err_unsupported_instruction_on_target"
    template = (
        "{op} exists on NeuronCore-v{versions} only; the kernel is built for {target} "
        "(NeuronCore-v{have}); build it for {want} (NEURON_PLATFORM_TARGET_OVERRIDE={want})"
    )


class ErrInvalidArgument(NkiError):
    name = "err_invalid_argument"
    template = "{op}: {why}"


class ErrUnsupportedApi(NkiError):
    name = "err_unsupported_api"
    template = "{api} is not supported by nkikit yet: {why}"


class ErrAllocationOutOfBounds(NkiError):
    name = "err_allocation_out_of_bounds"
    template = "direct allocation out of bounds: {what}"


class ErrReadUninitialized(NkiError):
    name = "err_read_uninitialized"
    template = "{op} reads {tensor} before it was written"


class ErrMatmulDtypeMismatch(NkiError):
    name = "err_matmul_dtype_mismatch"
    template = (
        "nc_matmul: fp32/tfloat32 operands can only be combined with each other, got {a} and {b}"
    )


class ErrHbmTensorWithInitValueNotSupported(NkiError):
    name = "err_hbm_tensor_with_init_value_not_supported"
    template = (
        "{api}: HBM tensors cannot be created with an initial value; create it with "
        "nl.ndarray(..., buffer=nl.shared_hbm) and write the value with nl.store"
    )


# -- verifier (nkikit/ir/verify.py) -----------------------------------------------------------------


class ErrLeadingDimensionOfTensorMustBePartition(NkiError):
    name = "err_leading_dimension_of_tensor_must_be_partition"
    template = (
        "{op}: {operand} {access} must walk the partition dimension (dimension {par}) of "
        "{tensor} with tile axis 0 at stride 1 ({why}); put the partition index "
        "(nl.arange(n)[:, None] or a slice) on the partition dimension and nowhere else"
    )


class ErrLoopVariableUsedOutOfScope(NkiError):
    name = "err_loop_variable_used_out_of_scope"
    template = (
        "{op} uses loop variable '{var}' outside of its loop (line {line}); a loop index "
        "only exists inside the loop body"
    )


class ErrPsumTotalCapacityExceeded(NkiError):
    name = "err_psum_total_capacity_exceeded"
    template = (
        "PSUM usage of {used} bytes per partition exceeds the capacity of {limit} bytes "
        "({banks} banks of 2 KiB); largest live PSUM tensors: {tensors}; copy results to SBUF "
        "sooner or create PSUM tiles inside the loop that uses them"
    )


# -- indirect DMA (runtime index tiles) -------------------------------------------------------------


class ErrIndirectIndicesFreeDim(NkiError):
    name = "err_indirect_indices_free_dim"
    template = (
        "indirect indexing of {tensor} on a free dimension is not supported ({why}); an index "
        "tile gives one index per partition and must index the dimension the tile's partition "
        "axis walks, e.g. t[idx_tile, i_f] or t[idx_tile[i_p, 0], i_f] with idx_tile a "
        "(P, 1) SBUF tile of integers"
    )


class ErrIndirectIndicesAreNotSupportedWithNkiApi(NkiError):
    name = "err_indirect_indices_are_not_supported_with_nki_api"
    template = (
        "{api} cannot take an indirectly indexed operand ({operand}); only DMAs gather and "
        "scatter by an index tile: nl.load, nl.store, nl.atomic_rmw and nisa.dma_copy"
    )


class ErrIndirectOperandNotSupported(NkiError):
    name = "err_indirect_operand_not_supported"
    template = (
        "{op}: {operand} cannot be an indirect view (NkiTensor.indirect): {why}; NeuronCore-v4 "
        "tensor indirection takes the operands listed per instruction in the NKI ISA"
    )


class ErrSpmdOutputDependencies(NkiError):
    name = "err_spmd_output_dependencies"
    template = (
        "{op} writes {tensor} at the same location from every instance along SPMD grid "
        "axis {axis} (size {size}); index the destination by nl.program_id({axis})"
    )


class ErrKernelTooLargeToSimulate(NkiError):
    # not an NKI name: the hardware has no such limit; the simulator on this machine does
    name = "err_kernel_too_large_to_simulate"
    template = (
        "tracing stopped after {ops} instructions with {used_mb} MiB in use, over the "
        "simulator's memory limit of {limit_mb} MiB (NKIKIT_MEMORY_LIMIT_MB; default 40% of "
        "this machine's memory); simulate a smaller shape, or raise the limit"
    )


class ErrKernelHasNoOutput(NkiError):
    # not an NKI name: the Neuron compiler accepts such a kernel, which then does nothing
    name = "err_kernel_has_no_output"
    template = (
        "{kernel} returns {returned} and writes none of its arguments, so calling it computes "
        "nothing; create the output with nl.ndarray(..., buffer=nl.shared_hbm), store into it "
        "and `return` it"
    )


class ErrSimulationOutOfMemory(NkiError):
    # not an NKI name: the hardware has its own HBM; the simulator holds it in this machine's
    name = "err_simulation_out_of_memory"
    template = (
        "simulating this kernel needs {need_mb} MiB more ({what}) with {used_mb} MiB in use, "
        "more than the {room_mb} MiB this process may still take ({limit}); simulate a "
        "smaller shape, or give the process more memory"
    )


class ErrKernelHasNoBackward(NkiError, RuntimeError):
    # not an NKI name: NKI has no autograd; torch's custom ops refuse at the same point (the
    # forward runs, a backward that reaches the op fails), hence also a RuntimeError as theirs
    name = "err_kernel_has_no_backward"
    template = (
        "{op}: a gradient was asked of kernel function {function!r}, which has no backward "
        'kernel; name one with `backward = "<module>:<function>"` in [functions.{function}] '
        "of the kernel's kernel.toml, or call it under torch.no_grad() (or on detached inputs)"
    )


class ErrDoubleBackwardNotSupported(NkiError, RuntimeError):
    # not an NKI name: the torch binding gives a backward kernel no backward of its own; the
    # wording is torch's for its once-differentiable functions ("does not support double backward")
    name = "err_double_backward_not_supported"
    template = (
        "{op} (the backward kernel of {function!r}) does not support double backward: its "
        "gradients cannot be differentiated again (create_graph=True, then a gradient of them); "
        "take second derivatives of a torch implementation of {function!r} instead"
    )


class ErrForwardModeAdNotSupported(NkiError, RuntimeError):
    # not an NKI name: the torch binding has backward kernels (reverse mode) only; carrying no
    # tangent through the op would give a zero derivative, so it refuses instead
    name = "err_forward_mode_ad_not_supported"
    template = (
        "{op} does not support forward-mode AD (torch.func.jvp, jacfwd, "
        "torch.autograd.forward_ad): nkikit kernels have backward kernels only; use reverse "
        "mode (torch.autograd.grad, torch.func.grad / vjp / jacrev)"
    )


class ErrNoSuchNeuronDevice(NkiError, RuntimeError):
    # not an NKI name: the ``neuron`` torch device (nkikit.torch.neuron) emulates one
    # NeuronCore; a RuntimeError too, as torch's refusal of a device it does not have is
    name = "err_no_such_neuron_device"
    template = (
        "{device}: the emulated neuron device has one NeuronCore, index 0 "
        "(torch.neuron.device_count() is 1); use 'neuron' or 'neuron:0'"
    )


CATALOGUE: dict[str, str] = {name: cls.template for name, cls in _CLASSES.items()}
"""NKI error name -> message template, for every entry above."""


# how many NkiWarnings ``warn_at`` issued in this process: a front end remembers a call's
# checks only when they warned of nothing (``nkikit.nki.isa._remember``)
warnings_issued = 0


class NkiWarning(UserWarning):
    """Something a kernel did that runs, but is probably not what its author meant (an output
    left partly unwritten). Shown at the kernel's own file:line."""


def warn_at(loc: SourceLoc, message: str) -> None:
    """Issue an :class:`NkiWarning` attributed to ``loc`` (the user's file:line), not to nkikit."""
    import warnings

    global warnings_issued
    warnings_issued += 1
    warnings.warn_explicit(f"{loc}: {message}", NkiWarning, loc.file, loc.line)


def raised_in_user_code(exc: BaseException) -> bool:
    """True when the innermost frame of ``exc``'s traceback is the user's, not nkikit's: a
    kernel calling ``nisa.nc_matmul(a, b, foo=1)`` gets Python's TypeError raised at its own
    line (the call never enters nkikit), which is the user's to read."""
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return not _is_internal(tb.tb_frame.f_code.co_filename)


def hide_internal_frames(exc: BaseException) -> BaseException:
    """Drop nkikit's own frames from a traceback, so users see their kernel, not our internals."""
    if os.environ.get("NKIKIT_FULL_TRACEBACK"):
        return exc
    tb = exc.__traceback__
    kept: list[types.TracebackType] = []
    while tb is not None:
        if not _is_internal(tb.tb_frame.f_code.co_filename):
            kept.append(tb)
        tb = tb.tb_next
    new_tb = None
    for frame_tb in reversed(kept):
        new_tb = types.TracebackType(
            new_tb, frame_tb.tb_frame, frame_tb.tb_lasti, frame_tb.tb_lineno
        )
    return exc.with_traceback(new_tb)
