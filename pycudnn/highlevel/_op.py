"""A re-export shim for ``conv.py`` until it adopts the split modules (:mod:`._operand`,
:mod:`._checks`, :mod:`._staging`, :mod:`._call`); then this module goes.

Names are the split modules' own objects. Module state that others rebind (``FAST_T``,
``one_device``) is read through to its one home, and a test's ``monkeypatch.setattr(_op, name,
...)`` of a forwarded name patches that home, so the state lives in exactly one place.
:class:`Call` is the old single-output face of :class:`._call.Call` that ``conv.py`` subclasses.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Sequence
from typing import Any

from .. import handle as _handle
from . import _call, _checks, _operand, _staging
from ._call import (
    GraphCall,
    OutputSpec,
    calls,
    check_overlap,
    cudnn_version,
    empty_result,
    handle_for,
    like_spec,
    local,
    on_device,
    output_spec,
    overlaps,
    quiet,
    scales,
    snapshot,
    workspace,
)
from ._checks import (
    FLOATS,
    check_operand,
    check_out,
    check_stream,
    check_strides,
    choose,
    ints,
    out_operand,
    real,
    same_dtype_and_device,
)
from ._operand import Operand, data_type, key_of, operand, raw_operand, register_operand_type
from ._staging import (
    Packed,
    Stage,
    channels_last,
    packed_operands,
    padded,
    same_layout,
    tensor_desc,
    tensor_descriptor,
)

__all__ = [
    "FLOATS",
    "Call",
    "GraphCall",
    "OutputSpec",
    "Operand",
    "Packed",
    "Stage",
    "calls",
    "channels_last",
    "check_operand",
    "check_out",
    "check_overlap",
    "check_stream",
    "check_strides",
    "choose",
    "cudnn_version",
    "data_type",
    "empty_result",
    "handle_for",
    "ints",
    "key_of",
    "like_spec",
    "local",
    "on_device",
    "operand",
    "out_operand",
    "output_spec",
    "overlaps",
    "packed_operands",
    "padded",
    "quiet",
    "raw_operand",
    "real",
    "register_operand_type",
    "same_dtype_and_device",
    "same_layout",
    "scales",
    "snapshot",
    "tensor_desc",
    "tensor_descriptor",
    "workspace",
]
_handle = _handle  # tests patch ``_op._handle.get_handle`` (the handle module itself)


class Call(_call.Call):
    """The old single-output face: ``Call(func, handle, alloc, spans, stage, inplace)`` and
    ``run(ptrs, out, po, stream) -> out``."""

    __slots__ = ()

    def __init__(
        self,
        func: str,
        handle: Any,
        alloc: OutputSpec | None,
        spans: tuple[int, ...],
        stage: Stage | None = None,
        inplace: tuple[int, ...] = (),
    ):
        super().__init__(func, handle, (alloc,), spans, stage, inplace)

    def run(self, ptrs: Sequence[int], out: Any, po: Any, stream: Any) -> Any:  # type: ignore[override]
        return _call.Call.run(self, tuple(ptrs), (out,), (po,), stream)[0]

    @property
    def alloc(self) -> OutputSpec | None:
        return self.allocs[0]


# where each forwarded name lives (read through, and patched there)
_HOMES = {
    "FAST_T": _operand,
    "one_device": _call,
    "quiet": _call,
    "cudnn_version": _call,
    "calls": _call,
    "tensor_descriptor": _staging,
    "check_stream": _checks,
}


class _Shim(types.ModuleType):
    @property
    def FAST_T(self) -> type | None:
        return _operand.FAST_T

    @property
    def one_device(self) -> bool:
        return _call.one_device

    def __setattr__(self, name: str, value: Any) -> None:
        home = _HOMES.get(name)
        if home is not None:
            setattr(home, name, value)
            if name in ("FAST_T", "one_device"):
                return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Shim
