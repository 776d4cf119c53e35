"""Recurrent networks on cuDNN's v8 RNN API: Theano's ``RNNBlock`` and cudnn.torch's
``RNNReLU``/``RNNTanh``/``LSTM``/``GRU``/``BLSTM`` as one stateful object.

``RNNBlock`` owns an ``RNNDescriptor`` per (device, input size), its dropout state, and per input
shape the ``RNNDataDescriptor`` pair, the device copy of the sequence lengths and the reserve
space; the workspace is the handle's (``_call.workspace``). A call is keyed like every high-level
call (:func:`._operand.key_of`: shapes, strides, dtypes, devices, address residues, the
arguments) and runs through the one cache-and-run helper (:func:`._call.run_cached`), so a
repeated call skips validation and makes its one C call (``cudnnRNNForward``, or
``cudnnRNNBackwardData_v8`` then ``cudnnRNNBackwardWeights_v8``). The call entries live in the
block's own store (one per thread, as the handles they hold), not in the shared per-thread call
cache, because they hold the block's descriptors and reserve space: :meth:`RNNBlock.close` frees
them all.

Data layout: ``x`` is ``(T, N, input_size)`` (``(N, T, input_size)`` with ``batch_first``), padded
when sequences are shorter than ``T`` (cuDNN's unpacked layouts with padded I/O); ``hx``/``hy`` are
``(num_layers * num_directions, N, proj_size or hidden_size)``, ``cx``/``cy``
``(num_layers * num_directions, N, hidden_size)``; ``y`` is ``(T, N, num_directions *
(proj_size or hidden_size))``. The weights are cuDNN's one flat buffer; see
:mod:`.rnn_layout` for where each matrix and bias sits and for the PyTorch converters.
"""

from __future__ import annotations

import random
import threading
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import _config, _layout, memory
from .._types import as_data_type, dtype_name, itemsize, numpy_dtype
from ..descriptors import RNNDataDescriptor
from ..enums import DataType, MathType, RNNDataLayout
from . import _call, _checks, _operand, _rnn_calls, _staging
from .rnn_layout import (
    ParamSlot,
    RNNLayout,
    canonical_rnn_layout,
    mode_name,
    rnn_weights_from_torch,
    rnn_weights_to_torch,
)

__all__ = ["RNNBlock"]

_DIRECTIONS = {"unidirectional": 1, "bidirectional": 2}
_INPUT_MODES = {"linear": "linear", "skip": "skip"}
_MATH = {
    "default": MathType.DEFAULT_MATH,
    "tensor_op": MathType.TENSOR_OP_MATH,
    "tensor_op_allow_conversion": MathType.TENSOR_OP_MATH_ALLOW_CONVERSION,
    "fma": MathType.FMA_MATH,
}
_MATH_NAMES = {v: k for k, v in _MATH.items()}
_MAX_SHAPES = 64  # input shapes (with their reserve spaces) kept per block
_FWD, _BWD = _rnn_calls.FWD, _rnn_calls.BWD


class RNNBlock:
    """A multi-layer RNN, LSTM or GRU on cuDNN (Theano's ``RNNBlock``, v8 RNN API).

    Parameters
    ----------
    dtype : dtype
        float16, float32 or float64 (data, weights and states; float16 computes in float32).
    hidden_size : int
        Features of the hidden state.
    num_layers : int
        Stacked layers.
    rnn_mode : {'rnn_relu', 'rnn_tanh', 'lstm', 'gru'}
        ``rnn_relu``/``rnn_tanh``: ``h' = act(W x + b_W + R h + b_R)``; ``lstm``: four gates
        (input, forget, new memory, output), no peepholes; ``gru``: three gates (reset, update,
        new memory) with ``n = tanh(W_n x + b_Wn + r * (R_n h + b_Rn))``; all exactly as
        PyTorch's ``nn.RNN``/``nn.LSTM``/``nn.GRU``. ``'relu'``/``'tanh'`` are accepted too.
    input_mode : {'linear', 'skip'}
        ``'skip'``: the first layer adds its input as is instead of multiplying it by ``W``
        (needs ``input_size == hidden_size``; the input biases stay).
    direction_mode : {'unidirectional', 'bidirectional'}
        Bidirectional layers run a second recurrence from last to first and concatenate both
        outputs (cudnn.torch's ``BLSTM``).
    dropout : float
        Dropout probability in ``[0, 1)`` on the outputs of every layer but the last, in
        training mode only (``apply(training=True)``).
    proj_size : int, optional
        LSTM only: project the hidden state to this size (``< hidden_size``), PyTorch's
        ``proj_size``.
    batch_first : bool
        ``x``/``y`` are ``(N, T, features)`` instead of ``(T, N, features)``; ``hx``/``cx``
        keep ``(num_layers * num_directions, N, features)``.
    math : {'default', 'tensor_op', 'tensor_op_allow_conversion', 'fma'}, optional
        cuDNN's math type. Default: ``'tensor_op'`` for float16, ``'fma'`` for float32 unless
        ``pycudnn.config.allow_tf32`` (then ``'default'``, which lets cuDNN use TF32), read when
        the block is made; ``'default'`` for float64.
    bias : bool
        Keyword only. False: no biases (PyTorch's ``bias=False``).
    seed : int, optional
        Keyword only. Seed of the dropout random states (default: a random one).

    Notes
    -----
    **Weights.** One flat buffer of :meth:`get_param_size` elements; :meth:`split_params`
    views its matrices and biases, :meth:`layout` says where each sits, :meth:`from_torch`
    and :meth:`to_torch` convert from and to PyTorch's parameters.

    **Training.** ``apply(..., training=True)`` keeps cuDNN's reserve space (intermediate
    results) in the block; the :meth:`backward` that follows uses it. The reserve is the one of
    the **last** training ``apply``, and one per input shape is kept and reused: call
    ``backward`` with the inputs and outputs of that ``apply`` before the next training
    ``apply`` of the same shape (a ``RuntimeError`` is raised when the last training call had
    another shape, or there was none).

    **Repeated calls.** Descriptors, workspace, the device copy of the sequence lengths and the
    reserve space are made once per input shape and reused; a repeated call (same shapes,
    dtypes, devices, arguments) skips validation. Pass ``out=`` to reuse output buffers too.

    A block is not thread-safe (its reserve space is state); use one block per thread.

    Examples
    --------
    >>> rnn = pycudnn.RNNBlock("float32", hidden_size=64, num_layers=2, rnn_mode="lstm")
    >>> w = pycudnn.to_device(np.random.uniform(-0.1, 0.1, rnn.get_param_size(32))
    ...                       .astype(np.float32))
    >>> y, hy, cy = rnn.apply(w, x, hx, cx, training=True)     # x: (T, N, 32)
    >>> dx, dhx, dcx, dw = rnn.backward(w, x, hx, cx, y, dy)
    """

    def __init__(
        self,
        dtype: Any,
        hidden_size: int,
        num_layers: int,
        rnn_mode: str,
        input_mode: str = "linear",
        direction_mode: str = "unidirectional",
        dropout: float = 0.0,
        proj_size: int | None = None,
        batch_first: bool = False,
        math: str | None = None,
        *,
        bias: bool = True,
        seed: int | None = None,
    ) -> None:
        func = "RNNBlock"
        try:
            dt = as_data_type(dtype)
        except (TypeError, ValueError):
            raise TypeError(
                f"{func}: dtype={dtype!r} is not a dtype; expected float16, float32 or float64"
            ) from None
        if dt not in (DataType.HALF, DataType.FLOAT, DataType.DOUBLE):
            raise TypeError(
                f"{func}: dtype {dtype_name(dt)} is not supported by cuDNN's RNNs; expected "
                "float16, float32 or float64"
            )
        self._dt = dt
        self._hidden = _rnn_calls.nonneg_int(hidden_size, "hidden_size", func)
        self._layers = _rnn_calls.nonneg_int(num_layers, "num_layers", func)
        self._mode = mode_name(rnn_mode, func)
        self._input_mode = _checks.choose(input_mode, _INPUT_MODES, "input_mode", func)
        self._dirs = _checks.choose(direction_mode, _DIRECTIONS, "direction_mode", func)
        self._dropout = _checks.real(dropout, "dropout", func, lo=0.0, hi=1.0, hi_open=True)
        if proj_size is None or (
            not isinstance(proj_size, bool)
            and hasattr(proj_size, "__index__")
            and proj_size.__index__() == self._hidden
        ):
            self._proj = None
        else:
            p = _rnn_calls.nonneg_int(proj_size, "proj_size", func, hi=self._hidden)
            if self._mode != "lstm":
                raise ValueError(
                    f"{func}: proj_size={p} is only valid for rnn_mode='lstm', not {self._mode!r}"
                )
            self._proj = p
        self._batch_first = _config.parse_bool(batch_first, func, "batch_first")
        self._bias = _config.parse_bool(bias, func, "bias")
        if math is None:
            if dt == DataType.HALF:
                self._math = MathType.TENSOR_OP_MATH
            elif dt == DataType.FLOAT and not _config.config.allow_tf32:
                self._math = MathType.FMA_MATH
            else:
                self._math = MathType.DEFAULT_MATH
        else:
            self._math = _checks.choose(math, _MATH, "math", func)
        if seed is None:
            seed = random.SystemRandom().getrandbits(63)
        self._seed = _rnn_calls.nonneg_int(seed, "seed", func, lo=0, hi=2**64 - 1)
        self._devices: dict[int, _rnn_calls.Device] = {}
        self._shapes: OrderedDict = OrderedDict()
        # validated calls, per thread (they hold the thread's handle) and per block (they hold
        # the block's descriptors and reserve spaces: close() frees them)
        self._local = threading.local()
        self._stores: weakref.WeakSet = weakref.WeakSet()
        self._last_train: _rnn_calls.Shape | None = None
        self._closed = False

    # -- properties ---------------------------------------------------------------------------
    dtype = property(lambda self: numpy_dtype(self._dt), doc="The data type (numpy dtype).")
    hidden_size = property(lambda self: self._hidden, doc="Hidden state size.")
    num_layers = property(lambda self: self._layers, doc="Stacked layers.")
    rnn_mode = property(lambda self: self._mode, doc="'rnn_relu', 'rnn_tanh', 'lstm' or 'gru'.")
    input_mode = property(lambda self: self._input_mode, doc="'linear' or 'skip'.")
    direction_mode = property(
        lambda self: "bidirectional" if self._dirs == 2 else "unidirectional",
        doc="'unidirectional' or 'bidirectional'.",
    )
    num_directions = property(lambda self: self._dirs, doc="1 or 2.")
    dropout = property(lambda self: self._dropout, doc="Dropout probability between layers.")
    proj_size = property(lambda self: self._proj, doc="LSTM projection size, or None.")
    batch_first = property(lambda self: self._batch_first, doc="x/y are (N, T, features).")
    bias = property(lambda self: self._bias, doc="Whether the network has biases.")
    seed = property(lambda self: self._seed, doc="Seed of the dropout states.")
    math = property(lambda self: _MATH_NAMES[self._math], doc="cuDNN's math type (a name).")
    closed = property(lambda self: self._closed, doc="True after close().")

    @property
    def out_size(self) -> int:
        """Width of ``hx``/``hy`` (``proj_size or hidden_size``)."""
        return self._proj or self._hidden

    @property
    def output_size(self) -> int:
        """Width of ``y``: ``num_directions * (proj_size or hidden_size)``."""
        return self._dirs * self.out_size

    def __repr__(self) -> str:
        extra = f", proj_size={self._proj}" if self._proj else ""
        extra += ", batch_first=True" if self._batch_first else ""
        extra += ", bias=False" if not self._bias else ""
        extra += f", dropout={self._dropout:g}" if self._dropout else ""
        state = " (closed)" if self._closed else ""
        return (
            f"RNNBlock({dtype_name(self._dt)!r}, hidden_size={self._hidden}, "
            f"num_layers={self._layers}, rnn_mode={self._mode!r}, "
            f"input_mode={self._input_mode!r}, direction_mode={self.direction_mode!r}"
            f"{extra}, math={self.math!r}){state}"
        )

    # -- lifetime -----------------------------------------------------------------------------
    def close(self) -> None:
        """Free the descriptors, dropout states, reserve spaces and cached calls (idempotent).
        A closed block raises ``ValueError`` when used."""
        if self._closed:
            return
        self._closed = True
        for store in list(self._stores):
            store.clear()
        for shape in self._shapes.values():
            for d in (shape.xdesc, shape.ydesc):
                d.close()
            shape.reserve = shape.dev_lengths = shape.dev_lengths_p = None
        self._shapes.clear()
        self._last_train = None
        for dev in self._devices.values():
            dev.close()
        self._devices.clear()

    def __enter__(self) -> RNNBlock:
        self._check_open()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("RNNBlock is closed")

    def __getstate__(self) -> dict[str, Any]:
        # the per-thread call entries are not copied (a copy builds its own)
        state = self.__dict__.copy()
        state["_local"] = state["_stores"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._local = threading.local()
        self._stores = weakref.WeakSet()

    def _calls(self) -> Any:
        """The calling thread's call entries of this block (:func:`._call.run_cached`'s store)."""
        try:
            return self._local.calls
        except AttributeError:
            store = self._local.calls = _call.new_store()
            self._stores.add(store)
            return store

    def _alloc(self, out: _rnn_calls.Out, device: int) -> _call.OutputSpec | None:
        """How to allocate *out* (None: given)."""
        return None if out.given is not None else _call.output_spec(out.shape, self._dt, device)

    # -- parameters ---------------------------------------------------------------------------
    def canonical_layout(self, input_size: Any) -> RNNLayout:
        """The weight layout computed without a GPU (:func:`.canonical_rnn_layout`)."""
        return canonical_rnn_layout(
            self._mode,
            _rnn_calls.input_size(input_size, "RNNBlock.canonical_layout"),
            self._hidden,
            self._layers,
            self._dirs == 2,
            self._proj,
            self._input_mode,
            self._bias,
        )

    def _check_input_size(self, inp: int, func: str) -> None:
        if self._input_mode == "skip" and inp != self._hidden:
            raise ValueError(
                f"{func}: input_mode='skip' needs input_size == hidden_size ({self._hidden}), "
                f"got {inp}"
            )

    def get_param_size(self, input_size: Any, device: int | None = None) -> int:
        """Number of elements of the weight buffer (``cudnnGetRNNWeightSpaceSize``).

        Parameters
        ----------
        input_size : int or (batch_size, input_dim)
            Features of the input (Theano's pair is accepted; its last entry is used).
        device : int, optional
            Default the current device.
        """
        self._check_open()
        func = "RNNBlock.get_param_size"
        inp = _rnn_calls.input_size(input_size, func)
        self._check_input_size(inp, func)
        return self._device(device).rnn(inp)[1] // itemsize(self._dt)

    def layout(self, input_size: Any, device: int | None = None) -> RNNLayout:
        """Where every matrix and bias sits in the weight buffer, read from cuDNN
        (``cudnnGetRNNWeightParams`` for every pseudo-layer and linear-layer id).

        Returns
        -------
        RNNLayout
            Offsets in elements; print ``layout.table()`` for a readable listing.
        """
        self._check_open()
        func = "RNNBlock.layout"
        inp = _rnn_calls.input_size(input_size, func)
        self._check_input_size(inp, func)
        return self._device(device).layout(inp)

    def split_params(self, w: Any, layer: int, input_size: Any) -> list[tuple[Any, Any]]:
        """Views of one pseudo-layer's matrices and biases in the weight buffer *w*.

        Parameters
        ----------
        w : device array
            The weight buffer: 1-D, :meth:`get_param_size` elements, contiguous.
        layer : int
            The pseudo-layer: ``layer_index * num_directions + direction`` (direction 0 forward,
            1 reverse), in ``[0, num_layers * num_directions)``.
        input_size : int or (batch_size, input_dim)

        Returns
        -------
        list of (W, b)
            In Theano's (and cuDNN's linLayerID) order: ``rnn_*``: input, recurrent; ``gru``:
            input reset, update, new memory, then recurrent reset, update, new memory;
            ``lstm``: input input-gate, forget, new memory, output, then the same recurrent;
            with ``proj_size`` a last ``(P, None)``. ``W`` is a ``(rows, cols)`` view (a gate
            computes ``W @ x + b``), ``b`` a ``(rows,)`` view; ``W`` is None for the input side
            of the first layer with ``input_mode='skip'``, ``b`` None without biases. Views are
            :class:`~pycudnn.DeviceArray` objects sharing *w*'s memory.
        """
        self._check_open()
        func = "RNNBlock.split_params"
        inp = _rnn_calls.input_size(input_size, func)
        self._check_input_size(inp, func)
        npl = self._layers * self._dirs
        pl = _rnn_calls.nonneg_int(layer, "layer", func, lo=0, hi=npl - 1)
        g = _operand.operand(w)
        self._check_weights(
            func,
            "w",
            g,
            canonical_rnn_layout(
                self._mode,
                inp,
                self._hidden,
                self._layers,
                self._dirs == 2,
                self._proj,
                self._input_mode,
                self._bias,
            ).size,
        )
        lay = self._device(g.device).layout(inp)
        if g.shape[0] != lay.size:
            raise ValueError(f"{func}: w has {g.shape[0]} elements, cuDNN expects {lay.size}")
        arr = w if isinstance(w, memory.DeviceArray) else memory.asarray(w)

        def view(slot: ParamSlot | None) -> Any:
            if slot is None:
                return None
            return arr[slot.offset : slot.offset + slot.size].reshape(slot.shape)

        return [(view(lay.matrix(pl, lid)), view(lay.bias_of(pl, lid))) for lid in lay.lin_ids()]

    def from_torch(
        self,
        params: Any,
        input_size: Any,
        *,
        prefix: str = "",
        device: int | None = None,
        stream: Any = None,
    ) -> memory.DeviceArray:
        """A weight buffer on the device from PyTorch's parameters (``nn.LSTM.state_dict()``
        or the module), placed by the layout cuDNN reports (:func:`.rnn_weights_from_torch`).
        """
        self._check_open()
        lay = self.layout(input_size, device)
        flat = rnn_weights_from_torch(params, lay, prefix=prefix, dtype=numpy_dtype(self._dt))
        return memory.to_device(flat, stream, device=device)

    def to_torch(self, w: Any, input_size: Any, *, prefix: str = "") -> dict[str, np.ndarray]:
        """PyTorch's parameters (host arrays, PyTorch's names) from a weight buffer or its
        gradient (:func:`.rnn_weights_to_torch`)."""
        self._check_open()
        g = _operand.operand(w)
        lay = self.layout(input_size, g.device)
        return rnn_weights_to_torch(w, lay, prefix=prefix)

    def temp_space_sizes(
        self, x_shape: Sequence[int], seq_lengths: Any = None, device: int | None = None
    ) -> tuple[int, int, int]:
        """``(workspace for inference, workspace for training, reserve space)`` in bytes for an
        input of *x_shape* (``cudnnGetRNNTempSpaceSizes``)."""
        self._check_open()
        func = "RNNBlock.temp_space_sizes"
        shp = tuple(_rnn_calls.nonneg_int(s, "x_shape", func) for s in x_shape)
        if len(shp) != 3:
            raise ValueError(f"{func}: x_shape must have 3 entries, got {tuple(x_shape)}")
        t, n, inp = (shp[1], shp[0], shp[2]) if self._batch_first else shp
        self._check_input_size(inp, func)
        lengths = _rnn_calls.lengths_key(seq_lengths)
        lengths = None if lengths is None else _rnn_calls.check_lengths(func, lengths, n, t)
        dev = self._device(device)
        s = self._shape(dev, t, n, inp, lengths)
        return s.ws_infer, s.ws_train, s.rs_bytes

    # -- state per device and per shape -------------------------------------------------------
    def _device(self, device: int | None) -> _rnn_calls.Device:
        if device is None:
            device = _call.handle_for(None, None).device
        dev = self._devices.get(device)
        if dev is None:
            with _call.on_device(device):  # the dropout states are initialised on the device
                dev = self._devices[device] = _rnn_calls.Device(self, device)
        return dev

    def _shape(
        self, dev: _rnn_calls.Device, t: int, n: int, inp: int, lengths: tuple | None
    ) -> _rnn_calls.Shape:
        key = (dev.device, t, n, inp, lengths)
        s = self._shapes.get(key)
        if s is not None:
            self._shapes.move_to_end(key)
            return s
        rnn, w_bytes = dev.rnn(inp)
        h = dev.handle()
        seq = lengths if lengths is not None else (t,) * n
        lay = (
            RNNDataLayout.BATCH_MAJOR_UNPACKED
            if self._batch_first
            else (RNNDataLayout.SEQ_MAJOR_UNPACKED)
        )
        xdesc = RNNDataDescriptor(seq, inp, t, dtype=self._dt, layout=lay)
        ydesc = RNNDataDescriptor(seq, self.output_size, t, dtype=self._dt, layout=lay)
        nl = self._layers * self._dirs
        hshape, cshape = (nl, n, self.out_size), (nl, n, self._hidden)
        hdesc = _staging.tensor_descriptor(hshape, _layout.packed_strides(hshape), self._dt)
        cdesc = _staging.tensor_descriptor(cshape, _layout.packed_strides(cshape), self._dt)
        ws_train, rs = rnn.temp_space_sizes(h, xdesc, training=True)
        ws_infer, _ = rnn.temp_space_sizes(h, xdesc, training=False)
        dev_len = memory.to_device(np.asarray(seq, dtype=np.int32), h.stream, device=dev.device)
        s = _rnn_calls.Shape(
            key,
            dev.device,
            (rnn, w_bytes),
            (xdesc, ydesc, hdesc, cdesc),
            (seq, dev_len),
            (ws_train, ws_infer, rs),
        )
        self._shapes[key] = s
        while len(self._shapes) > _MAX_SHAPES:
            self._shapes.popitem(last=False)  # the last training shape stays alive via _last_train
        return s

    # -- validation helpers -------------------------------------------------------------------
    def _check_dtype(self, func: str, name: str, g: _operand.Operand) -> None:
        if g.dtype != self._dt:
            got = dtype_name(g.dtype) if g.dtype is not None else "of an unsupported type"
            raise TypeError(f"{func}: {name} is {got}; the block's dtype is {dtype_name(self._dt)}")

    def _check_weights(self, func: str, name: str, g: _operand.Operand, size: int) -> None:
        self._check_dtype(func, name, g)
        if len(g.shape) != 1:
            raise ValueError(
                f"{func}: {name} must be 1-D (the flat weight buffer), got shape {tuple(g.shape)}"
            )
        if g.shape[0] != size:
            raise ValueError(
                f"{func}: {name} has {g.shape[0]} elements; this network needs {size} "
                "(get_param_size)"
            )
        if g.shape[0] > 1 and g.strides[0] != 1:
            raise ValueError(
                f"{func}: {name} must be contiguous (stride 1), got stride {g.strides[0]}"
            )
        _checks.check_strides(func, name, g)

    def _operand(
        self, func: str, name: str, obj: Any, shape: tuple[int, ...], device: int | None
    ) -> _operand.Operand:
        g = _operand.operand(obj)
        self._check_dtype(func, name, g)
        if tuple(g.shape) != shape:
            raise ValueError(f"{func}: {name} has shape {tuple(g.shape)}, expected {shape}")
        if device is not None and g.device != device:
            raise ValueError(f"{func}: x is on device {device} but {name} on device {g.device}")
        _checks.check_strides(func, name, g)
        return g

    def _out(
        self, func: str, name: str, obj: Any, shape: tuple[int, ...], device: int
    ) -> _rnn_calls.Out:
        if obj is None:
            return _rnn_calls.Out(shape, None)
        g = self._operand(func, name, obj, shape, device)
        if not _layout.matches(g.shape, g.strides, _layout.packed_strides(g.shape)):
            raise ValueError(
                f"{func}: {name} must be C-contiguous (packed), got strides {tuple(g.strides)}"
            )
        return _rnn_calls.Out(shape, g)

    def _geometry(self, func: str, gx: _operand.Operand) -> tuple[int, int, int]:
        if len(gx.shape) != 3:
            order = "(N, T, input_size)" if self._batch_first else "(T, N, input_size)"
            raise ValueError(f"{func}: x must be 3-D {order}, got shape {tuple(gx.shape)}")
        if self._batch_first:
            n, t, inp = gx.shape
        else:
            t, n, inp = gx.shape
        for what, v in (("sequence length T", t), ("batch size N", n), ("input_size", inp)):
            if v < 1:
                raise ValueError(f"{func}: x has shape {tuple(gx.shape)}; its {what} must be >= 1")
        if t * n * max(inp, self.output_size) > _layout.INT32_MAX:
            raise OverflowError(
                f"{func}: x of shape {tuple(gx.shape)} exceeds cuDNN's limit of "
                f"{_layout.INT32_MAX} elements per RNN data tensor"
            )
        self._check_input_size(inp, func)
        return t, n, inp

    def _state_shapes(self, n: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        nl = self._layers * self._dirs
        return (nl, n, self.out_size), (nl, n, self._hidden)

    def _y_shape(self, t: int, n: int) -> tuple[int, int, int]:
        return (n, t, self.output_size) if self._batch_first else (t, n, self.output_size)

    # -- forward ------------------------------------------------------------------------------
    def apply(
        self,
        w: Any,
        x: Any,
        hx: Any = None,
        cx: Any = None,
        seq_lengths: Any = None,
        training: bool = False,
        *,
        out: Any = None,
        stream: Any = None,
    ) -> tuple:
        """Run the network over a batch of sequences (``cudnnRNNForward``).

        Parameters
        ----------
        w : device array
            The weight buffer (1-D, :meth:`get_param_size` elements, contiguous).
        x : device array
            ``(T, N, input_size)``, or ``(N, T, input_size)`` with ``batch_first``; any strides
            (copied to a packed buffer first when not C-contiguous). Positions past a
            sequence's length are padding and are not read.
        hx : device array, optional
            Initial hidden state ``(num_layers * num_directions, N, proj_size or
            hidden_size)``; None: zeros. Pseudo-layer order: layer 0 forward, layer 0 reverse,
            layer 1 forward, ...
        cx : device array, optional
            LSTM only: initial cell state ``(num_layers * num_directions, N, hidden_size)``;
            None: zeros.
        seq_lengths : sequence of int, optional
            Host integers, one per sequence, each in ``[1, T]``, in any order (no sorting
            needed: the data is padded, not packed). Default: all ``T``.
        training : bool
            Training mode: dropout is applied and the reserve space kept for :meth:`backward`.
        out : tuple, optional
            ``(y, hy)`` or, for LSTM, ``(y, hy, cy)``: C-contiguous arrays of the right shapes
            to write (an entry may be None: allocated).
        stream : optional
            CUDA stream; default the handle's current stream.

        Returns
        -------
        tuple
            ``(y, hy)``, or ``(y, hy, cy)`` for LSTM. ``y`` is ``(T, N, num_directions *
            (proj_size or hidden_size))`` (``(N, T, ...)`` with ``batch_first``), zero at padded
            positions; ``hy``/``cy`` hold each sequence's state after its last element
            (forward direction) and after its first (reverse direction).

        Raises
        ------
        TypeError
            Host arrays; a dtype other than the block's; *cx* for a non-LSTM; bad
            *seq_lengths* types.
        ValueError
            Wrong shapes or ranks of *x*, *hx*, *cx*, *w* (size != :meth:`get_param_size`) or
            *out*; lengths out of ``[1, T]`` or not one per sequence; operands on different
            devices; outputs overlapping inputs; a closed block.
        OverflowError
            Tensors beyond cuDNN's int32 limits.
        """
        if self._closed:
            self._check_open()
        pw, kw = _operand.key_of(w)
        px, kx = _operand.key_of(x)
        ph, kh = (0, None) if hx is None else _operand.key_of(hx)
        pc, kc = (0, None) if cx is None else _operand.key_of(cx)
        sl = _rnn_calls.lengths_key(seq_lengths)
        outs = _rnn_calls.out_tuple(_FWD, out, "(y, hy[, cy])")
        placed = tuple((None, None) if o is None else _operand.key_of(o) for o in outs)
        training = _config.parse_bool(training, "RNNBlock.forward", "training")
        key = (_FWD, kw, kx, kh, kc, sl, training, tuple(k for _p, k in placed))
        args = (self, w, x, hx, cx, sl, training, outs, stream)
        if not outs:
            outs = (None, None, None) if self._mode == "lstm" else (None, None)
            placed = ((None, None),) * len(outs)
        out_ptrs = tuple(p for p, _k in placed)
        return _call.run_cached(
            key,
            _rnn_calls.build_forward,
            args,
            (pw, px, ph, pc),
            outs,
            out_ptrs,
            stream,
            store=self._calls(),
        )

    def _inputs(self, func: str, x: Any, w: Any) -> tuple:
        """The checks *x* and *w* share in both directions: ``(gx, gw, T, N, input size,
        device, hx shape, cx shape, weight elements)``."""
        gx = _operand.operand(x)
        t, n, inp = self._geometry(func, gx)
        self._check_dtype(func, "x", gx)
        _checks.check_strides(func, "x", gx)
        device = gx.device
        gw = _operand.operand(w)
        if gw.device != device:
            raise ValueError(f"{func}: x is on device {device} but w on device {gw.device}")
        expected = self.canonical_layout(inp).size
        self._check_weights(func, "w", gw, expected)
        hshape, cshape = self._state_shapes(n)
        return gx, gw, t, n, inp, device, hshape, cshape, expected

    # -- backward -----------------------------------------------------------------------------
    def backward(
        self,
        w: Any,
        x: Any,
        hx: Any,
        cx: Any,
        y: Any,
        dy: Any,
        dhy: Any = None,
        dcy: Any = None,
        seq_lengths: Any = None,
        *,
        dw: Any = None,
        accumulate: bool = False,
        weights: bool = True,
        out: Any = None,
        stream: Any = None,
    ) -> tuple:
        """Gradients of the last training :meth:`apply` (``cudnnRNNBackwardData_v8``, then
        ``cudnnRNNBackwardWeights_v8``).

        Parameters
        ----------
        w, x, hx, cx, seq_lengths
            Exactly as given to the training ``apply`` (*hx*/*cx* may be None there and here).
        y : device array
            The ``y`` that ``apply`` returned.
        dy : device array
            Gradient w.r.t. *y* (same shape; entries at padded positions are ignored).
        dhy, dcy : device array, optional
            Gradients w.r.t. ``hy`` and (LSTM) ``cy``; None: zeros.
        dw : device array, optional
            Where to write the weight gradient (1-D, like *w*, contiguous). Default: a new
            array.
        accumulate : bool
            False (default): ``dw`` is **overwritten** with the gradient. True: the gradient is
            **added** to ``dw``'s contents (cuDNN's ``CUDNN_WGRAD_MODE_ADD``; a new ``dw``
            starts at zero), e.g. to sum over several batches.
        weights : bool
            False: skip the weight gradient (``dw`` is returned as None).
        out : tuple, optional
            ``(dx, dhx)`` or, for LSTM, ``(dx, dhx, dcx)``: C-contiguous arrays to write (an
            entry may be None: allocated).
        stream : optional
            CUDA stream; default the handle's current stream.

        Returns
        -------
        tuple
            ``(dx, dhx, dcx, dw)``; ``dcx`` is None for non-LSTM networks, ``dw`` None when
            ``weights=False``. ``dx`` is zero at padded positions; ``dhx``/``dcx`` are the
            gradients w.r.t. the initial states (also when *hx*/*cx* were None: zeros).

        Raises
        ------
        RuntimeError
            No training ``apply`` ran on this block, or the last one had another input shape
            or other sequence lengths (its reserve space is needed).
        TypeError, ValueError
            As for :meth:`apply`, for every operand and *dw*.

        Notes
        -----
        cuDNN computes the weight gradient from the reserve space that the data gradient
        updates, so both come from one ``backward`` call, in that order. Calling ``backward``
        again for the same training ``apply`` is not supported by cuDNN's contract.
        """
        if self._closed:
            self._check_open()
        ops = (w, x, hx, cx, y, dy, dhy, dcy)
        keyed = [(0, None) if o is None else _operand.key_of(o) for o in ops]
        sl = _rnn_calls.lengths_key(seq_lengths)
        outs = _rnn_calls.out_tuple(_BWD, out, "(dx, dhx[, dcx])")
        placed = tuple((None, None) if o is None else _operand.key_of(o) for o in outs)
        pdw, kdw = (None, None) if dw is None else _operand.key_of(dw)
        accumulate = _config.parse_bool(accumulate, "RNNBlock.backward", "accumulate")
        weights = _config.parse_bool(weights, "RNNBlock.backward", "weights")
        key = (_BWD, tuple(k for _, k in keyed), sl, tuple(k for _p, k in placed), kdw)
        key += (accumulate, weights)
        args = (self, ops, sl, outs, dw, (weights, accumulate), stream)
        lstm = self._mode == "lstm"
        if not outs:
            outs = (None, None, None) if lstm else (None, None)
            placed = ((None, None),) * len(outs)
        out_ptrs = tuple(p for p, _k in placed)
        if weights:  # dw is the last output
            outs, out_ptrs = (*outs, dw), (*out_ptrs, pdw)
        ptrs = tuple(p for p, _ in keyed)
        result = _call.run_cached(
            key, _rnn_calls.build_backward, args, ptrs, outs, out_ptrs, stream, store=self._calls()
        )
        return (result[0], result[1], result[2] if lstm else None, result[-1] if weights else None)
