"""The error catalogue: every rejection nkikit makes has an NKI error name, a message template
and the kernel's own source location.

Names follow the legacy NKI error catalogue (``err_*``), so a message found here can be looked
up in AWS's documentation.  Messages say what is wrong and what to do about it.
"""

from __future__ import annotations

import linecache
import os
import sys
import types
from dataclasses import dataclass

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


def _is_internal(filename: str) -> bool:
    path = os.path.abspath(filename)
    if path.startswith(_KERNEL_DIRS):
        return False
    return path.startswith(_PACKAGE_DIR + os.sep) or path.startswith(_HUB_DIR + os.sep)


def caller_loc() -> SourceLoc:
    """The innermost stack frame outside the nkikit package: the user's kernel line."""
    frame = sys._getframe(1)
    while frame is not None and _is_internal(frame.f_code.co_filename):
        frame = frame.f_back
    if frame is None:
        return UNKNOWN_LOC
    return SourceLoc(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)


# name -> message template.  Templates are formatted with the keyword arguments of NkiError.
CATALOGUE: dict[str, str] = {
    "err_num_partition_exceed_arch_limit": (
        "Size of partition dimension {size} exceeds architecture limitation of {limit}; "
        "tile the partition dimension by nl.tile_size.pmax"
    ),
    "err_size_of_dimension_exceed_arch_limit": (
        "{what} has free size {size}, over the architecture limit of {limit}"
    ),
    "err_num_partition_mismatch": (
        "{op}: operands have {a} and {b} partitions; they must match "
        "(use broadcast_to to broadcast along the partition dimension)"
    ),
    "err_unsupported_memory": "{op}: {what} must be in {allowed}, got {got}",
    "err_tensor_access_out_of_bound": (
        "access to {tensor} is out of bounds: dimension {dim} reaches index {index}, size is {size}"
    ),
    "err_unexpected_output_dependencies": (
        "{op} writes {tensor} at the same location in every iteration of affine_range loop "
        "'{loop}' (missing indices in the dst access); index the destination by the loop "
        "variable, or use sequential_range for a loop-carried dependency"
    ),
    "err_local_variable_used_out_of_scope": (
        "{tensor} was created inside a loop body and is used outside of it; create it "
        "before the loop"
    ),
    "err_tensor_output_not_written_to": "output tensor {tensor} is returned but never written to",
    "err_cannot_update_immutable_parameter": (
        "kernel parameter {tensor} is immutable; annotate it as nt.mutable_tensor to write to it"
    ),
    "err_activation_bias_invalid_type": (
        "activation bias must be a (P, 1) tile of float32, float16 or bfloat16, got {got}"
    ),
    "err_activation_scale_invalid_type": "activation scale must be float32, got {got}",
    "err_activation_scale_scalar_or_vector": (
        "activation scale must be a python scalar or a (P, 1) tile, got shape {got}"
    ),
    "err_unsupported_expression_in_mask": (
        "mask must be a comparison of affine expressions of aranges, loop variables and "
        "program ids, combined with &; got {got}"
    ),
    "err_control_flow_condition_depending_on_arange": (
        "a Python condition depends on an arange index ({expr}); use mask= instead"
    ),
    "err_dynamic_control_flow_not_supported": (
        "a Python condition depends on a loop variable or program id ({expr}), whose value is "
        "only known at run time; use mask=, or nl.static_range to unroll the loop"
    ),
    "err_1d_arange_not_supported": (
        "a 1-D arange cannot index a tensor; give it an axis, e.g. nl.arange(n)[:, None] "
        "for the partition axis or nl.arange(n)[None, :] for the free axis"
    ),
    "err_unsupported_mixing_basic_advanced_tensor_indexing": (
        "an index mixes slices with arange expressions; use aranges (or slices) for every axis"
    ),
    "err_ambiguous_tensor_truth_value": (
        "the truth value of a tile is unknown while tracing; use nl.where or a mask"
    ),
    "err_exceed_max_supported_dimension": "{what} has {ndim} dimensions; at most {limit} allowed",
    "err_shared_hbm_must_in_kernel_level": (
        "shared_hbm tensors must be created at the top level of the kernel, not inside a loop"
    ),
    "err_store_dst_shape_smaller_than_other_shape": (
        "{op}: destination shape {dst} does not match value shape {src}"
    ),
    "err_nki_api_outside_of_nki_kernel": (
        "{api} can only be called inside a kernel decorated with @nki.jit"
    ),
    "err_non_affine_index": (
        "index expression {expr} is not affine in loop variables, aranges and program ids"
    ),
    "err_sbuf_capacity_exceeded": (
        "{buffer} usage of {used} bytes per partition exceeds the capacity of {limit} bytes; "
        "largest tensors: {tensors}"
    ),
    "err_psum_capacity_exceeded": (
        "PSUM tile {tensor} uses {used} bytes per partition, over the {limit}-byte bank"
    ),
    "err_unsupported_dtype": "{op}: dtype {dtype} is not supported here ({why})",
    "err_invalid_argument": "{op}: {why}",
    "err_unsupported_api": "{api} is not supported by nkikit yet: {why}",
    "err_read_uninitialized": "{op} reads {tensor} before it was written",
    "err_matmul_dtype_mismatch": (
        "nc_matmul: fp32/tfloat32 operands can only be combined with each other, got {a} and {b}"
    ),
    # -- verifier (nkikit/ir/verify.py) ---------------------------------------------------------
    "err_leading_dimension_of_tensor_must_be_partition": (
        "{op}: {operand} {access} must walk the partition dimension (dimension {par}) of "
        "{tensor} with tile axis 0 at stride 1 ({why}); put the partition index "
        "(nl.arange(n)[:, None] or a slice) on the partition dimension and nowhere else"
    ),
    "err_loop_variable_used_out_of_scope": (
        "{op} uses loop variable '{var}' outside of its loop (line {line}); a loop index "
        "only exists inside the loop body"
    ),
    "err_psum_total_capacity_exceeded": (
        "PSUM usage of {used} bytes per partition exceeds the capacity of {limit} bytes "
        "({banks} banks of 2 KiB); largest live PSUM tensors: {tensors}; copy results to SBUF "
        "sooner or create PSUM tiles inside the loop that uses them"
    ),
    # -- indirect DMA (runtime index tiles) ----------------------------------------------------
    "err_indirect_indices_free_dim": (
        "indirect indexing of {tensor} on a free dimension is not supported ({why}); an index "
        "tile gives one index per partition and must index the dimension the tile's partition "
        "axis walks, e.g. t[idx_tile, i_f] or t[idx_tile[i_p, 0], i_f] with idx_tile a "
        "(P, 1) SBUF tile of integers"
    ),
    "err_indirect_indices_are_not_supported_with_nki_api": (
        "{api} cannot take an indirectly indexed operand ({operand}); only DMAs gather and "
        "scatter by an index tile: nl.load, nl.store, nl.atomic_rmw and nisa.dma_copy"
    ),
    "err_spmd_output_dependencies": (
        "{op} writes {tensor} at the same location from every instance along SPMD grid "
        "axis {axis} (size {size}); index the destination by nl.program_id({axis})"
    ),
}


class NkiError(Exception):
    """A kernel rejected by nkikit, as the Neuron compiler or hardware would reject it.

    Attributes: ``name`` (the NKI error name, e.g. ``err_num_partition_exceed_arch_limit``),
    ``loc`` (the kernel's file:line that caused it) and ``detail`` (the formatted message).
    """

    def __init__(self, name: str, loc: SourceLoc | None = None, **fields: object) -> None:
        template = CATALOGUE.get(name, "{why}")
        try:
            detail = template.format(**fields)
        except (KeyError, IndexError):
            detail = f"{template} {fields}"
        self.name = name
        self.loc = loc or UNKNOWN_LOC
        self.detail = detail
        self.fields = fields
        super().__init__(self._render())

    def _render(self) -> str:
        where = f"{self.loc}: " if self.loc is not UNKNOWN_LOC else ""
        text = self.loc.text if self.loc is not UNKNOWN_LOC else ""
        code = f"\n    {text}" if text else ""
        return f"{where}{self.name}: {self.detail}{code}"

    def at(self, loc: SourceLoc) -> NkiError:
        """Attach a location if none is known yet."""
        if self.loc is UNKNOWN_LOC:
            self.loc = loc
            self.args = (self._render(),)
        return self


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
