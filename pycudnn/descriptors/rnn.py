"""Recurrent networks: ``cudnnDropoutDescriptor_t`` (also used on its own by dropout),
``cudnnRNNDescriptor_t`` (configured with the cuDNN 8+ ``_v8`` API) and
``cudnnRNNDataDescriptor_t`` (a batch of variable-length sequences).

The dropout and RNN descriptors need a cuDNN handle for some calls (setting the random states,
workspace sizes); they accept a ``pycudnn.Handle`` only (``_validate.as_handle``: any other object
with ``.ptr`` -- a descriptor, a device array -- would be read by cuDNN as a handle) and keep what
they were given alive, as cuDNN keeps using it.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import enums, errors
from .._generated import lib as _lib
from .._layout import INT32_MAX, INT64_MAX, UINT64_MAX
from .._resource import Resource
from .._types import HasPtr, dtype_name, numpy_dtype
from ..enums import DataType
from ._validate import (
    FLOAT_TYPES,
    MATH_TYPES,
    as_float,
    as_handle,
    buffer_ptr,
    c_int_array,
    coerce_enum,
    describe,
    finite,
    int_in,
    int_seq,
    restrict_dtype,
)
from .tensor import TensorDescriptor

__all__ = ["DropoutDescriptor", "RNNDataDescriptor", "RNNDescriptor"]


class DropoutDescriptor(Resource):
    """``cudnnDropoutDescriptor_t``.

    Creating one needs no GPU; *configuring* it (``cudnnSetDropoutDescriptor``, which also
    initialises the random states on the device) needs a cuDNN handle and a states buffer.

    Parameters
    ----------
    handle : pycudnn.Handle, optional
        A cuDNN handle (``pycudnn.get_handle()``; nothing else is accepted). Without it the
        descriptor stays unset (valid as "no dropout" for an :class:`RNNDescriptor`); call
        :meth:`set` later.
    dropout : float, default 0.0
        Probability in ``[0, 1)``.
    states : device buffer, optional
        Device buffer (an object with an int ``.ptr``, not a descriptor or handle) of at least
        :meth:`states_size` bytes (required when *dropout* > 0).
    states_size : int, optional
        Size of *states* in bytes; default ``states.nbytes`` (required when *states* has no
        ``nbytes``). :meth:`states_size` tells how many bytes the GPU needs.
    seed : int, default 0
        0 to 2**64 - 1.

    Notes
    -----
    The descriptor keeps *handle* and *states* alive (cuDNN writes to the states on every
    dropout call).
    """

    _c_type = _lib.cudnnDropoutDescriptor_t
    _destroy_name = "cudnnDestroyDropoutDescriptor"
    __slots__ = ("_handle", "_states")

    def __init__(
        self,
        handle: HasPtr | None = None,
        dropout: float = 0.0,
        states: HasPtr | None = None,
        states_size: int | None = None,
        seed: int = 0,
    ) -> None:
        args = None
        if handle is not None:
            args = self._validate(handle, dropout, states, states_size, seed)
        elif states is not None or states_size is not None:
            raise TypeError("states need a handle: pass handle= as well")
        else:
            _dropout_p(dropout)
            int_in(seed, "seed", 0, UINT64_MAX)
        h = self._new_handle()
        errors.checked("cudnnCreateDropoutDescriptor", warn=False)(ctypes.byref(h))
        self._adopt(h)
        self._handle = self._states = None
        if args is not None:
            self._set("cudnnSetDropoutDescriptor", handle, states, *args)

    def _init_from_ptr(self) -> None:
        self._handle = self._states = None

    def _mark_closed(self) -> None:
        super()._mark_closed()
        self._handle = self._states = None

    @staticmethod
    def _validate(
        handle: Any, dropout: Any, states: Any, states_size: Any, seed: Any
    ) -> tuple[float, int, int, int]:
        p = _dropout_p(dropout)
        seed = int_in(seed, "seed", 0, UINT64_MAX)
        if states is None:
            if states_size not in (None, 0):
                raise ValueError(f"states_size={states_size} given without states")
            sptr, size = 0, 0
            if p > 0:
                raise ValueError(f"dropout={p} > 0 needs a states buffer (states=)")
        else:
            sptr = buffer_ptr(states, "states")
            if states_size is None:
                states_size = getattr(states, "nbytes", None)
                if states_size is None:
                    raise TypeError("states_size is required: states has no .nbytes")
            size = int_in(states_size, "states_size", 0, INT64_MAX)
        as_handle(handle)  # last: the other arguments' errors are reported first
        return p, sptr, size, seed

    def _set(
        self, fn: str, handle: Any, states: Any, p: float, sptr: int, size: int, seed: int
    ) -> None:
        # the Handle object itself goes to C (its typed handle): see Resource.close
        errors.checked(fn, warn=False)(self._h(), as_handle(handle), p, sptr or None, size, seed)
        # children keep their parents alive: cuDNN uses the handle's stream and the states
        self._handle = handle
        self._states = states

    def set(
        self,
        handle: HasPtr,
        dropout: float,
        states: HasPtr | None,
        states_size: int | None = None,
        seed: int = 0,
    ) -> None:
        """``cudnnSetDropoutDescriptor``: configure and initialise the random states."""
        args = self._validate(handle, dropout, states, states_size, seed)
        self._set("cudnnSetDropoutDescriptor", handle, states, *args)

    def restore(
        self,
        handle: HasPtr,
        dropout: float,
        states: HasPtr,
        states_size: int | None = None,
        seed: int = 0,
    ) -> None:
        """``cudnnRestoreDropoutDescriptor``: reuse states initialised before (no re-init)."""
        args = self._validate(handle, dropout, states, states_size, seed)
        self._set("cudnnRestoreDropoutDescriptor", handle, states, *args)

    @staticmethod
    def states_size(handle: HasPtr) -> int:
        """``cudnnDropoutGetStatesSize``: bytes of random state this GPU needs (needs a
        ``pycudnn.Handle``)."""
        size = ctypes.c_size_t()
        errors.checked("cudnnDropoutGetStatesSize", warn=False)(
            as_handle(handle), ctypes.byref(size)
        )
        return size.value

    @staticmethod
    def reserve_space_size(x: TensorDescriptor) -> int:
        """``cudnnDropoutGetReserveSpaceSize``: reserve-space bytes for input *x* (no GPU)."""
        if not isinstance(x, TensorDescriptor):
            raise TypeError(f"x must be a TensorDescriptor, got {describe(x)}")
        size = ctypes.c_size_t()
        errors.checked("cudnnDropoutGetReserveSpaceSize", warn=False)(x._h(), ctypes.byref(size))
        return size.value

    def read(self, handle: HasPtr | None = None) -> tuple[float, int, int]:
        """``cudnnGetDropoutDescriptor``: ``(dropout, states pointer, seed)``.

        Needs a handle: *handle*, or the one given at construction / :meth:`set`.
        """
        h = self._h()
        handle = handle if handle is not None else self._handle
        if handle is None:
            raise ValueError("reading a DropoutDescriptor needs a cuDNN handle (pass handle=)")
        p, states, seed = ctypes.c_float(), ctypes.c_void_p(), ctypes.c_ulonglong()
        errors.checked("cudnnGetDropoutDescriptor", warn=False)(
            h,
            as_handle(handle),
            ctypes.byref(p),
            ctypes.byref(states),
            ctypes.byref(seed),
        )
        return p.value, states.value or 0, seed.value

    @property
    def dropout(self) -> float:
        """Dropout probability (read back through cuDNN; needs the handle given at set time)."""
        return self.read()[0]

    @property
    def seed(self) -> int:
        """Seed (read back through cuDNN; needs the handle given at set time)."""
        return self.read()[2]

    @property
    def is_set(self) -> bool:
        """True once configured with a handle (by this wrapper)."""
        self._h()
        return self._handle is not None

    def _repr_fields(self) -> str:
        if self._handle is None:
            return "unset" if self._owned else f"ptr={self._ptr:#x}"
        p, _states, seed = self.read()
        return f"dropout={p:g}, seed={seed}"


def _dropout_p(value: Any) -> float:
    p = as_float(value, "dropout")
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout={p} is invalid; expected a probability in [0, 1)")
    return p


_RNN_MODES = {
    "rnn_relu": enums.RNNMode.RNN_RELU,
    "relu": enums.RNNMode.RNN_RELU,
    "rnn_tanh": enums.RNNMode.RNN_TANH,
    "tanh": enums.RNNMode.RNN_TANH,
    "lstm": enums.RNNMode.LSTM,
    "gru": enums.RNNMode.GRU,
}
_RNN_BIAS = {
    "none": enums.RNNBiasMode.NO_BIAS,
    "no_bias": enums.RNNBiasMode.NO_BIAS,
    "single_inp": enums.RNNBiasMode.SINGLE_INP_BIAS,
    "single_rec": enums.RNNBiasMode.SINGLE_REC_BIAS,
    "double": enums.RNNBiasMode.DOUBLE_BIAS,
}
_DIRECTIONS = {
    "unidirectional": enums.DirectionMode.UNIDIRECTIONAL,
    "bidirectional": enums.DirectionMode.BIDIRECTIONAL,
}
_INPUT_MODES = {
    "linear": enums.RNNInputMode.LINEAR_INPUT,
    "skip": enums.RNNInputMode.SKIP_INPUT,
}
_RNN_ALGOS = {
    "standard": enums.RNNAlgo.STANDARD,
    "persist_static": enums.RNNAlgo.PERSIST_STATIC,
    "persist_dynamic": enums.RNNAlgo.PERSIST_DYNAMIC,
    "persist_static_small_h": enums.RNNAlgo.PERSIST_STATIC_SMALL_H,
}
_AUX_FLAGS = {"padded_io": _lib.CUDNN_RNN_PADDED_IO_ENABLED}
_RNN_MATH_PREC = {
    DataType.FLOAT: (DataType.FLOAT,),
    DataType.DOUBLE: (DataType.DOUBLE,),
    DataType.HALF: (DataType.FLOAT, DataType.HALF),
    DataType.BFLOAT16: (DataType.FLOAT, DataType.BFLOAT16),
}


class RNNDescriptor(Resource):
    """``cudnnRNNDescriptor_t`` configured with the cuDNN 8+ API (``cudnnSetRNNDescriptor_v8``).

    Parameters
    ----------
    hidden_size : int
        Hidden state size (>= 1).
    num_layers : int, default 1
    cell_mode : {"lstm", "gru", "rnn_tanh", "rnn_relu"} or RNNMode, default ``"lstm"``
    input_size : int, optional
        Input vector size; default *hidden_size*.
    proj_size : int, optional
        LSTM projection size (<= *hidden_size*; only LSTM may project); default *hidden_size*.
    bias_mode : {"double", "single_inp", "single_rec", "none"} or RNNBiasMode
    direction : {"unidirectional", "bidirectional"} or DirectionMode
    input_mode : {"linear", "skip"} or RNNInputMode (``"skip"`` needs input_size ==
        hidden_size)
    dtype : dtype, default ``"float32"``
        float32, float64, float16 or bfloat16.
    math_precision : dtype, optional
        Default: float64 for float64 data, else float32. float16/bfloat16 data may also use
        their own type.
    math_type : {"default", "tensor_op", "tensor_op_allow_conversion", "fma"} or MathType
    dropout : DropoutDescriptor, optional
        Applied between layers; kept alive by this descriptor. Default: no dropout.
    aux_flags : int or "padded_io", default 0
    algo : {"standard", "persist_static", "persist_dynamic", "persist_static_small_h"} or RNNAlgo
    """

    _c_type = _lib.cudnnRNNDescriptor_t
    _destroy_name = "cudnnDestroyRNNDescriptor"
    __slots__ = ()

    def __init__(
        self,
        hidden_size: int,
        num_layers: int = 1,
        *,
        cell_mode: Any = "lstm",
        input_size: int | None = None,
        proj_size: int | None = None,
        bias_mode: Any = "double",
        direction: Any = "unidirectional",
        input_mode: Any = "linear",
        dtype: Any = "float32",
        math_precision: Any = None,
        math_type: Any = "default",
        dropout: DropoutDescriptor | None = None,
        aux_flags: int | str = 0,
        algo: Any = "standard",
    ) -> None:
        hidden = int_in(hidden_size, "hidden_size", 1)
        layers = int_in(num_layers, "num_layers", 1)
        inp = hidden if input_size is None else int_in(input_size, "input_size", 1)
        proj = hidden if proj_size is None else int_in(proj_size, "proj_size", 1)
        cell = coerce_enum(cell_mode, enums.RNNMode, "cell_mode", _RNN_MODES)
        if proj > hidden:
            raise ValueError(f"proj_size={proj} must not exceed hidden_size={hidden}")
        if proj != hidden and cell != enums.RNNMode.LSTM:
            raise ValueError(f"proj_size={proj} != hidden_size={hidden} is only valid for LSTM")
        bias = coerce_enum(bias_mode, enums.RNNBiasMode, "bias_mode", _RNN_BIAS)
        dirm = coerce_enum(direction, enums.DirectionMode, "direction", _DIRECTIONS)
        inm = coerce_enum(input_mode, enums.RNNInputMode, "input_mode", _INPUT_MODES)
        if inm == enums.RNNInputMode.SKIP_INPUT and inp != hidden:
            raise ValueError(
                f"input_mode='skip' needs input_size == hidden_size, got {inp} and {hidden}"
            )
        dt = restrict_dtype(dtype, "dtype", FLOAT_TYPES)
        if math_precision is None:
            mp = DataType.DOUBLE if dt == DataType.DOUBLE else DataType.FLOAT
        else:
            mp = restrict_dtype(math_precision, "math_precision", _RNN_MATH_PREC[dt])
        math = coerce_enum(math_type, enums.MathType, "math_type", MATH_TYPES)
        if dropout is not None and not isinstance(dropout, DropoutDescriptor):
            raise TypeError(f"dropout must be a DropoutDescriptor or None, got {describe(dropout)}")
        dh = dropout._h() if dropout is not None else None
        if isinstance(aux_flags, str):
            key = aux_flags.strip().lower()
            if key not in _AUX_FLAGS:
                raise ValueError(
                    f"aux_flags={aux_flags!r} is invalid; expected 'padded_io' or an int"
                )
            flags = _AUX_FLAGS[key]
        else:
            flags = int_in(aux_flags, "aux_flags", 0, 2**32 - 1)
        algo = coerce_enum(algo, enums.RNNAlgo, "algo", _RNN_ALGOS)
        h = self._new_handle()
        errors.checked("cudnnCreateRNNDescriptor", warn=False)(ctypes.byref(h))
        self._adopt(h)
        errors.checked("cudnnSetRNNDescriptor_v8", warn=False)(
            h, algo, cell, bias, dirm, inm, dt, mp, math, inp, hidden, proj, layers, dh, flags
        )
        if dropout is not None:
            self._refs.append(dropout)  # cuDNN keeps the dropout descriptor's pointer

    def _read(self) -> dict[str, Any]:
        ints = [ctypes.c_int() for _ in range(8)]
        sizes = [ctypes.c_int32() for _ in range(4)]
        drop, flags = _lib.cudnnDropoutDescriptor_t(), ctypes.c_uint32()
        errors.checked("cudnnGetRNNDescriptor_v8", warn=False)(
            self._h(),
            *(ctypes.byref(v) for v in ints),
            *(ctypes.byref(v) for v in sizes),
            ctypes.byref(drop),
            ctypes.byref(flags),
        )
        algo, cell, bias, dirm, inm, dt, mp, math = (v.value for v in ints)
        inp, hidden, proj, layers = (v.value for v in sizes)
        return {
            "algo": enums.RNNAlgo(algo),
            "cell_mode": enums.RNNMode(cell),
            "bias_mode": enums.RNNBiasMode(bias),
            "direction": enums.DirectionMode(dirm),
            "input_mode": enums.RNNInputMode(inm),
            "dtype": DataType(dt),
            "math_precision": DataType(mp),
            "math_type": enums.MathType(math),
            "input_size": inp,
            "hidden_size": hidden,
            "proj_size": proj,
            "num_layers": layers,
            "dropout_ptr": drop.value or 0,
            "aux_flags": flags.value,
        }

    def config(self) -> dict[str, Any]:
        """Everything ``cudnnGetRNNDescriptor_v8`` reports, as a dict."""
        return self._read()

    algo = property(lambda self: self._read()["algo"], doc="The :class:`~pycudnn.enums.RNNAlgo`.")
    cell_mode = property(lambda self: self._read()["cell_mode"], doc="The RNNMode.")
    bias_mode = property(lambda self: self._read()["bias_mode"], doc="The RNNBiasMode.")
    direction = property(lambda self: self._read()["direction"], doc="The DirectionMode.")
    input_mode = property(lambda self: self._read()["input_mode"], doc="The RNNInputMode.")
    dtype = property(lambda self: self._read()["dtype"], doc="Data type.")
    math_precision = property(lambda self: self._read()["math_precision"], doc="Math precision.")
    math_type = property(lambda self: self._read()["math_type"], doc="The MathType.")
    input_size = property(lambda self: self._read()["input_size"], doc="Input vector size.")
    hidden_size = property(lambda self: self._read()["hidden_size"], doc="Hidden size.")
    proj_size = property(lambda self: self._read()["proj_size"], doc="Projection size.")
    num_layers = property(lambda self: self._read()["num_layers"], doc="Number of layers.")
    aux_flags = property(lambda self: self._read()["aux_flags"], doc="Auxiliary flags.")

    def set_clip(self, mode: Any = "minmax", lclip: float = 0.0, rclip: float = 0.0) -> None:
        """``cudnnRNNSetClip_v9``: LSTM cell clipping (``mode="none"`` turns it off)."""
        m = coerce_enum(mode, enums.RNNClipMode, "mode")
        lo, hi = finite(lclip, "lclip"), finite(rclip, "rclip")
        if m == enums.RNNClipMode.MINMAX and lo > hi:
            raise ValueError(f"lclip={lo} must not exceed rclip={hi}")
        errors.checked("cudnnRNNSetClip_v9", warn=False)(self._h(), m, lo, hi)

    @property
    def clip(self) -> tuple[enums.RNNClipMode, float, float]:
        """``cudnnRNNGetClip_v9``: ``(mode, lclip, rclip)``."""
        m, lo, hi = ctypes.c_int(), ctypes.c_double(), ctypes.c_double()
        errors.checked("cudnnRNNGetClip_v9", warn=False)(
            self._h(), ctypes.byref(m), ctypes.byref(lo), ctypes.byref(hi)
        )
        return enums.RNNClipMode(m.value), lo.value, hi.value

    def weight_space_size(self, handle: HasPtr) -> int:
        """``cudnnGetRNNWeightSpaceSize`` (needs a handle)."""
        size = ctypes.c_size_t()
        errors.checked("cudnnGetRNNWeightSpaceSize", warn=False)(
            as_handle(handle), self._h(), ctypes.byref(size)
        )
        return size.value

    def temp_space_sizes(
        self, handle: HasPtr, x: RNNDataDescriptor, training: bool = True
    ) -> tuple[int, int]:
        """``cudnnGetRNNTempSpaceSizes``: ``(workspace, reserve space)`` bytes for input *x*."""
        if not isinstance(x, RNNDataDescriptor):
            raise TypeError(f"x must be an RNNDataDescriptor, got {describe(x)}")
        ws, rs = ctypes.c_size_t(), ctypes.c_size_t()
        mode = enums.ForwardMode.TRAINING if training else enums.ForwardMode.INFERENCE
        errors.checked("cudnnGetRNNTempSpaceSizes", warn=False)(
            as_handle(handle),
            self._h(),
            mode,
            x._h(),
            ctypes.byref(ws),
            ctypes.byref(rs),
        )
        return ws.value, rs.value

    def _repr_fields(self) -> str:
        c = self._read()
        return (
            f"cell_mode={c['cell_mode'].name}, hidden_size={c['hidden_size']}, "
            f"num_layers={c['num_layers']}, input_size={c['input_size']}, "
            f"direction={c['direction'].name}, dtype={dtype_name(c['dtype'])}"
        )


_RNN_LAYOUTS = {
    "seq_major_unpacked": enums.RNNDataLayout.SEQ_MAJOR_UNPACKED,
    "seq_major_packed": enums.RNNDataLayout.SEQ_MAJOR_PACKED,
    "batch_major_unpacked": enums.RNNDataLayout.BATCH_MAJOR_UNPACKED,
}


def _fill_bytes(dt: DataType, value: float) -> ctypes.Array:
    """*value* encoded as one element of *dt* in a host buffer (cuDNN reads dataType bytes)."""
    buf = ctypes.create_string_buffer(8)
    with np.errstate(over="ignore"):
        arr = np.array([value], dtype=numpy_dtype(dt))
    if math.isfinite(value) and not np.isfinite(arr[0].astype(np.float64)):
        raise OverflowError(f"padding_fill={value} does not fit in {dtype_name(dt)}")
    raw = arr.tobytes()
    ctypes.memmove(buf, raw, len(raw))
    return buf


class RNNDataDescriptor(Resource):
    """``cudnnRNNDataDescriptor_t``: a batch of variable-length sequences.

    Parameters
    ----------
    seq_lengths : sequence of int
        Length of each sequence (0 to *max_seq_length*); its length is the batch size.
    vector_size : int
        Size of each input/output vector (>= 1).
    max_seq_length : int, optional
        Default ``max(seq_lengths)``.
    dtype : dtype, default ``"float32"``
        float32, float64, float16 or bfloat16.
    layout : {"seq_major_unpacked", "seq_major_packed", "batch_major_unpacked"} or
        RNNDataLayout, default ``"seq_major_packed"``
    padding_fill : float, default 0.0
        Written into padding positions of outputs (unpacked layouts).
    """

    _c_type = _lib.cudnnRNNDataDescriptor_t
    _destroy_name = "cudnnDestroyRNNDataDescriptor"
    __slots__ = ()

    def __init__(
        self,
        seq_lengths: Sequence[int],
        vector_size: int,
        max_seq_length: int | None = None,
        *,
        dtype: Any = "float32",
        layout: Any = "seq_major_packed",
        padding_fill: float = 0.0,
    ) -> None:
        lengths = int_seq(seq_lengths, "seq_lengths", lo=0, min_len=1, max_len=INT32_MAX)
        vec = int_in(vector_size, "vector_size", 1)
        max_len = (
            max(lengths) if max_seq_length is None else int_in(max_seq_length, "max_seq_length", 1)
        )
        if max_len < 1:
            raise ValueError("max_seq_length must be >= 1 (all seq_lengths are 0)")
        longest = max(lengths)
        if longest > max_len:
            raise ValueError(f"seq_lengths contains {longest}, more than max_seq_length={max_len}")
        batch = len(lengths)
        total = max_len * batch * vec
        if total > INT32_MAX:
            raise OverflowError(
                f"max_seq_length * batch * vector_size = {total} exceeds cuDNN's limit of "
                f"{INT32_MAX}"
            )
        dt = restrict_dtype(dtype, "dtype", FLOAT_TYPES)
        lay = coerce_enum(layout, enums.RNNDataLayout, "layout", _RNN_LAYOUTS)
        fill = _fill_bytes(dt, as_float(padding_fill, "padding_fill"))
        h = self._new_handle()
        errors.checked("cudnnCreateRNNDataDescriptor", warn=False)(ctypes.byref(h))
        self._adopt(h)
        errors.checked("cudnnSetRNNDataDescriptor", warn=False)(
            h, dt, lay, max_len, batch, vec, c_int_array(lengths), fill
        )

    def _read(self) -> dict[str, Any]:
        h = self._h()
        dt, lay, mx, b, v = (ctypes.c_int() for _ in range(5))
        fill = ctypes.create_string_buffer(8)
        fn = errors.checked("cudnnGetRNNDataDescriptor", warn=False)
        refs = [ctypes.byref(x) for x in (dt, lay, mx, b, v)]
        fn(h, *refs, 0, None, fill)
        n = b.value
        lengths = (ctypes.c_int * max(n, 1))()
        fn(h, *refs, n, lengths, fill)
        dtype = DataType(dt.value)
        npdt = numpy_dtype(dtype)
        pad = float(np.frombuffer(fill.raw[: npdt.itemsize], dtype=npdt)[0])
        return {
            "dtype": dtype,
            "layout": enums.RNNDataLayout(lay.value),
            "max_seq_length": mx.value,
            "batch_size": n,
            "vector_size": v.value,
            "seq_lengths": tuple(lengths[:n]),
            "padding_fill": pad,
        }

    def config(self) -> dict[str, Any]:
        """Everything ``cudnnGetRNNDataDescriptor`` reports, as a dict."""
        return self._read()

    dtype = property(lambda self: self._read()["dtype"], doc="Data type.")
    layout = property(lambda self: self._read()["layout"], doc="The RNNDataLayout.")
    max_seq_length = property(lambda self: self._read()["max_seq_length"], doc="Max length.")
    batch_size = property(lambda self: self._read()["batch_size"], doc="Batch size.")
    vector_size = property(lambda self: self._read()["vector_size"], doc="Vector size.")
    seq_lengths = property(lambda self: self._read()["seq_lengths"], doc="Sequence lengths.")
    padding_fill = property(lambda self: self._read()["padding_fill"], doc="Padding fill.")

    def _repr_fields(self) -> str:
        c = self._read()
        return (
            f"batch_size={c['batch_size']}, max_seq_length={c['max_seq_length']}, "
            f"vector_size={c['vector_size']}, dtype={dtype_name(c['dtype'])}, "
            f"layout={c['layout'].name}"
        )
