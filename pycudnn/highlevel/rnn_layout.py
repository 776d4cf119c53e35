"""Where each weight of a cuDNN RNN sits in its one weight buffer, and converters to and from
PyTorch's ``nn.LSTM`` / ``nn.GRU`` / ``nn.RNN`` parameters.

cuDNN keeps all the weights of an RNN in one flat buffer whose layout it documents only through
``cudnnGetRNNWeightParams`` (the address and shape of each matrix and bias, per *pseudo-layer*
and *linear-layer id*). :class:`RNNLayout` is that answer written down: one :class:`ParamSlot`
(offset in elements, shape) per matrix and per bias. :meth:`pycudnn.RNNBlock.layout` reads it
from cuDNN; :func:`canonical_rnn_layout` computes the same layout in pure Python (no GPU), from
the rule cuDNN 9 follows (checked against cuDNN on the GPU by the test suite):

* the buffer holds **all matrices first**, pseudo-layer after pseudo-layer, then **all biases**,
  in the same order;
* within a pseudo-layer, matrices and biases go by linear-layer id: the input-side ones
  (``W``, multiplying the layer's input), then the recurrent ones (``R``, multiplying the
  previous hidden state), one per gate, then (LSTM with ``proj_size``) the projection matrix;
* a matrix is row-major ``(gate rows, inputs)``: ``gate = W @ x + b_W + R @ h + b_R``; a bias is
  ``(rows,)``;
* pseudo-layer ``p`` is layer ``p // num_directions``, direction ``p % num_directions``
  (0 forward, 1 reverse); layer 0 reads the input, the others the concatenated outputs of the
  layer below (``num_directions * (proj_size or hidden_size)`` wide);
* ``input_mode='skip'`` drops the input matrices of layer 0 (its biases stay);
  ``bias=False`` drops all biases.

Gate order (cuDNN's ``linLayerID``; Theano's ``split_params`` order; also PyTorch's row-block
order inside ``weight_ih_l*`` / ``weight_hh_l*``, so the converters only cut and paste):

====================  ===========================================  ==========================
mode                  linLayerID (input side; recurrent side)      PyTorch rows of ``*_ih/hh``
====================  ===========================================  ==========================
``rnn_relu/_tanh``    0 ``W``; 1 ``R``                             ``[0:H]``
``lstm``              0-3 ``W_i, W_f, W_g, W_o``; 4-7 ``R_...``;   ``i, f, g, o`` blocks of H
                      8 the projection ``P`` (proj_size only)      ``weight_hr_l*`` = ``P``
``gru``               0-2 ``W_r, W_z, W_n``; 3-5 ``R_...``         ``r, z, n`` blocks of H
====================  ===========================================  ==========================

(``i`` input gate, ``f`` forget gate, ``g`` new memory (cell candidate), ``o`` output gate,
``r`` reset gate, ``z`` update gate, ``n`` new memory.) cuDNN's GRU puts the recurrent bias of the
new-memory gate inside the reset product, ``n = tanh(W_n x + b_Wn + r * (R_n h + b_Rn))``, as
PyTorch does, so both bias sets map one to one: ``bias_ih`` = the ``b_W`` biases, ``bias_hh`` =
the ``b_R`` biases.

Everything here is pure Python on host arrays (NumPy, or anything convertible: torch CPU or
CUDA tensors, pycudnn ``DeviceArray``, CuPy arrays are copied to the host first).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from .._config import parse_bool

__all__ = [
    "GATES",
    "ParamSlot",
    "RNNLayout",
    "canonical_rnn_layout",
    "rnn_weights_from_torch",
    "rnn_weights_to_torch",
    "torch_rnn_param_names",
]

#: gates per mode, in cuDNN's linLayerID order (input side; the recurrent side repeats them)
GATES: dict[str, tuple[str, ...]] = {
    "rnn_relu": ("h",),
    "rnn_tanh": ("h",),
    "lstm": ("i", "f", "g", "o"),
    "gru": ("r", "z", "n"),
}
_GATE_WORDS = {
    "h": "hidden",
    "i": "input gate",
    "f": "forget gate",
    "g": "new memory",
    "o": "output gate",
    "r": "reset gate",
    "z": "update gate",
    "n": "new memory",
}
#: the linLayerID of the LSTM projection matrix
PROJ_ID = 8
_MODE_ALIASES = {"relu": "rnn_relu", "tanh": "rnn_tanh"}


def mode_name(mode: Any, func: str = "RNNLayout") -> str:
    """The canonical mode name of *mode* (``'rnn_relu'``, ``'rnn_tanh'``, ``'lstm'``, ``'gru'``;
    ``'relu'`` and ``'tanh'`` are accepted)."""
    if not isinstance(mode, str):
        raise TypeError(f"{func}: rnn_mode must be a string, got {mode!r}")
    m = _MODE_ALIASES.get(mode.lower(), mode.lower())
    if m not in GATES:
        raise ValueError(
            f"{func}: rnn_mode={mode!r} is not one of 'rnn_relu', 'rnn_tanh', 'lstm', 'gru'"
        )
    return m


class ParamSlot(NamedTuple):
    """One matrix or bias in the weight buffer."""

    pseudo_layer: int  # layer * num_directions + direction
    lin_id: int  # cuDNN's linLayerID
    kind: str  # "weight" (a matrix) or "bias"
    offset: int  # elements from the start of the buffer
    shape: tuple[int, ...]  # (rows, cols) for a matrix, (rows,) for a bias

    @property
    def size(self) -> int:
        """Number of elements."""
        return math.prod(self.shape)


class RNNLayout:
    """The positions of every matrix and bias of an RNN in cuDNN's weight buffer.

    Made by :meth:`pycudnn.RNNBlock.layout` (read from cuDNN) or :func:`canonical_rnn_layout`
    (computed). Two layouts compare equal when they describe the same network and put every
    parameter at the same place.

    Attributes
    ----------
    mode : str
        ``'rnn_relu'``, ``'rnn_tanh'``, ``'lstm'`` or ``'gru'``.
    input_size, hidden_size, num_layers : int
    proj_size : int or None
        LSTM projection size (None: no projection).
    bidirectional : bool
    input_mode : str
        ``'linear'`` or ``'skip'``.
    bias : bool
        Whether the network has its two bias sets.
    size : int
        Elements in the buffer (``RNNBlock.get_param_size``).
    slots : tuple of ParamSlot
    """

    __slots__ = (
        "_index",
        "bias",
        "bidirectional",
        "hidden_size",
        "input_mode",
        "input_size",
        "mode",
        "num_layers",
        "proj_size",
        "size",
        "slots",
    )

    def __init__(
        self,
        mode: str,
        input_size: int,
        hidden_size: int,
        num_layers: int,
        bidirectional: bool,
        proj_size: int | None,
        input_mode: str,
        bias: bool,
        size: int,
        slots: Any,
    ) -> None:
        self.mode = mode_name(mode)
        self.input_size = int(input_size)
        self.hidden_size = int(hidden_size)
        self.num_layers = int(num_layers)
        self.bidirectional = bool(bidirectional)
        self.proj_size = None if proj_size in (None, hidden_size) else int(proj_size)
        self.input_mode = str(input_mode)
        self.bias = bool(bias)
        self.size = int(size)
        self.slots = tuple(ParamSlot(*s) for s in slots)
        self._index = {(s.pseudo_layer, s.lin_id, s.kind): s for s in self.slots}

    # -- structure ---------------------------------------------------------------------------
    @property
    def num_directions(self) -> int:
        """1, or 2 when bidirectional."""
        return 2 if self.bidirectional else 1

    @property
    def num_pseudo_layers(self) -> int:
        """``num_layers * num_directions``."""
        return self.num_layers * self.num_directions

    @property
    def out_size(self) -> int:
        """Width of each direction's output and hidden state (``proj_size or hidden_size``)."""
        return self.proj_size or self.hidden_size

    @property
    def num_lin_layers(self) -> int:
        """Linear layers per pseudo-layer, projection excluded (2, 6 or 8)."""
        return 2 * len(GATES[self.mode])

    def lin_ids(self) -> tuple[int, ...]:
        """Every linLayerID this network has (the projection's too)."""
        ids = tuple(range(self.num_lin_layers))
        return (*ids, PROJ_ID) if self.proj_size else ids

    def matrix(self, pseudo_layer: int, lin_id: int) -> ParamSlot | None:
        """The matrix of *lin_id* in *pseudo_layer* (None when the network has none there)."""
        return self._index.get((pseudo_layer, lin_id, "weight"))

    def bias_of(self, pseudo_layer: int, lin_id: int) -> ParamSlot | None:
        """The bias of *lin_id* in *pseudo_layer* (None when the network has none there)."""
        return self._index.get((pseudo_layer, lin_id, "bias"))

    def describe(self, slot: ParamSlot) -> str:
        """What *slot* is, in words (``'layer 1 reverse: recurrent matrix R_f (forget gate)'``)."""
        layer, direction = divmod(slot.pseudo_layer, self.num_directions)
        where = f"layer {layer}" + (" reverse" if direction else "")
        if slot.lin_id == PROJ_ID:
            return f"{where}: projection matrix P"
        gates = GATES[self.mode]
        side, gate = divmod(slot.lin_id, len(gates))
        sym = ("W", "R")[side] + (f"_{gates[gate]}" if len(gates) > 1 else "")
        what = ("input", "recurrent")[side] + (" matrix" if slot.kind == "weight" else " bias")
        name = sym if slot.kind == "weight" else f"b_{sym}"
        return f"{where}: {what} {name} ({_GATE_WORDS[gates[gate]]})"

    def torch_slice(self, slot: ParamSlot) -> str:
        """Where *slot* sits among PyTorch's parameters (``'weight_hh_l1_reverse[4:8]'``)."""
        layer, direction = divmod(slot.pseudo_layer, self.num_directions)
        sfx = f"_l{layer}" + ("_reverse" if direction else "")
        if slot.lin_id == PROJ_ID:
            return f"weight_hr{sfx}"
        n = len(GATES[self.mode])
        side, gate = divmod(slot.lin_id, n)
        h = self.hidden_size
        name = ("weight" if slot.kind == "weight" else "bias") + ("_ih", "_hh")[side] + sfx
        return f"{name}[{gate * h}:{(gate + 1) * h}]"

    def table(self) -> str:
        """A text table of every slot: offset, shape, meaning and PyTorch counterpart."""
        rows = [("offset", "shape", "cuDNN (pseudo-layer, linLayerID)", "meaning", "PyTorch")]
        for s in sorted(self.slots, key=lambda s: s.offset):
            rows.append(
                (
                    str(s.offset),
                    "x".join(map(str, s.shape)),
                    f"{s.kind} ({s.pseudo_layer}, {s.lin_id})",
                    self.describe(s),
                    self.torch_slice(s),
                )
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows)
        return "\n".join(line.rstrip() for line in lines)

    # -- comparison --------------------------------------------------------------------------
    def _key(self) -> tuple:
        return (
            self.mode,
            self.input_size,
            self.hidden_size,
            self.num_layers,
            self.bidirectional,
            self.proj_size,
            self.input_mode,
            self.bias,
            self.size,
            tuple(sorted(self.slots)),
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RNNLayout):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        proj = f", proj_size={self.proj_size}" if self.proj_size else ""
        return (
            f"RNNLayout(mode={self.mode!r}, input_size={self.input_size}, "
            f"hidden_size={self.hidden_size}, num_layers={self.num_layers}, "
            f"bidirectional={self.bidirectional}{proj}, input_mode={self.input_mode!r}, "
            f"bias={self.bias}, size={self.size})"
        )


def _positive(value: Any, name: str, func: str) -> int:
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{func}: {name} must be an int, got {value!r}")
    v = value.__index__()
    if v < 1:
        raise ValueError(f"{func}: {name}={v} must be >= 1")
    return v


def canonical_rnn_layout(
    mode: str,
    input_size: int,
    hidden_size: int,
    num_layers: int = 1,
    bidirectional: bool = False,
    proj_size: int | None = None,
    input_mode: str = "linear",
    bias: bool = True,
) -> RNNLayout:
    """The layout cuDNN 9 gives an RNN's weight buffer, computed without a GPU.

    The rule is in this module's docstring; :meth:`pycudnn.RNNBlock.layout` reads the layout
    from cuDNN itself (the GPU tests check that the two agree).

    Parameters
    ----------
    mode : {'rnn_relu', 'rnn_tanh', 'lstm', 'gru'}
    input_size, hidden_size, num_layers : int
    bidirectional : bool
    proj_size : int, optional
        LSTM only, ``<= hidden_size``.
    input_mode : {'linear', 'skip'}
        ``'skip'`` needs ``input_size == hidden_size``.
    bias : bool

    Returns
    -------
    RNNLayout

    Examples
    --------
    >>> lay = canonical_rnn_layout("lstm", 5, 4)
    >>> lay.size, lay.matrix(0, 1)
    (144, ParamSlot(pseudo_layer=0, lin_id=1, kind='weight', offset=20, shape=(4, 5)))
    """
    func = "canonical_rnn_layout"
    bidirectional = parse_bool(bidirectional, func, "bidirectional")
    bias = parse_bool(bias, func, "bias")
    m = mode_name(mode, func)
    inp = _positive(input_size, "input_size", func)
    hid = _positive(hidden_size, "hidden_size", func)
    layers = _positive(num_layers, "num_layers", func)
    proj = None if proj_size is None else _positive(proj_size, "proj_size", func)
    if proj is not None and proj > hid:
        raise ValueError(f"{func}: proj_size={proj} must not exceed hidden_size={hid}")
    if proj == hid:
        proj = None
    if proj is not None and m != "lstm":
        raise ValueError(f"{func}: proj_size is only valid for 'lstm', not {m!r}")
    if input_mode not in ("linear", "skip"):
        raise ValueError(f"{func}: input_mode={input_mode!r} is not 'linear' or 'skip'")
    if input_mode == "skip" and inp != hid:
        raise ValueError(f"{func}: input_mode='skip' needs input_size == hidden_size")
    dirs = 2 if bidirectional else 1
    ngates = len(GATES[m])
    out = proj or hid
    slots: list[tuple] = []
    offset = 0
    for pl in range(layers * dirs):
        layer_in = inp if pl < dirs else dirs * out
        for lin in range(2 * ngates):
            if lin < ngates:
                if input_mode == "skip" and pl < dirs:
                    continue
                cols = layer_in
            else:
                cols = out
            slots.append((pl, lin, "weight", offset, (hid, cols)))
            offset += hid * cols
        if proj:
            slots.append((pl, PROJ_ID, "weight", offset, (proj, hid)))
            offset += proj * hid
    if bias:
        for pl in range(layers * dirs):
            for lin in range(2 * ngates):
                slots.append((pl, lin, "bias", offset, (hid,)))
                offset += hid
    return RNNLayout(
        m, inp, hid, layers, bool(bidirectional), proj, input_mode, bias, offset, slots
    )


# ==================================================================================================
# PyTorch converters
# ==================================================================================================
def torch_rnn_param_names(
    mode: str,
    num_layers: int = 1,
    bidirectional: bool = False,
    proj_size: int | None = None,
    bias: bool = True,
) -> list[str]:
    """PyTorch's parameter names of ``nn.LSTM``/``nn.GRU``/``nn.RNN``, in its order
    (``_flat_weights_names``): per layer and direction ``weight_ih``, ``weight_hh``,
    ``bias_ih``, ``bias_hh``, ``weight_hr`` (LSTM with ``proj_size``)."""
    m = mode_name(mode, "torch_rnn_param_names")
    names = []
    for layer in range(num_layers):
        for direction in range(2 if bidirectional else 1):
            sfx = f"_l{layer}" + ("_reverse" if direction else "")
            names += [f"weight_ih{sfx}", f"weight_hh{sfx}"]
            if bias:
                names += [f"bias_ih{sfx}", f"bias_hh{sfx}"]
            if proj_size and m == "lstm":
                names.append(f"weight_hr{sfx}")
    return names


def torch_params(layout: RNNLayout) -> dict[str, list[tuple[ParamSlot, int]]]:
    """PyTorch name -> [(slot, first row in the PyTorch parameter)] (also pycudnn.jax's
    weight packing)."""
    out: dict[str, list[tuple[ParamSlot, int]]] = {}
    n = len(GATES[layout.mode])
    for s in layout.slots:
        layer, direction = divmod(s.pseudo_layer, layout.num_directions)
        sfx = f"_l{layer}" + ("_reverse" if direction else "")
        if s.lin_id == PROJ_ID:
            out.setdefault(f"weight_hr{sfx}", []).append((s, 0))
            continue
        side, gate = divmod(s.lin_id, n)
        name = ("weight" if s.kind == "weight" else "bias") + ("_ih", "_hh")[side] + sfx
        out.setdefault(name, []).append((s, gate * layout.hidden_size))
    return out


def torch_shape(layout: RNNLayout, name: str, parts: list[tuple[ParamSlot, int]]) -> tuple:
    if name.startswith("weight_hr"):
        return parts[0][0].shape
    rows = len(GATES[layout.mode]) * layout.hidden_size
    return (rows, parts[0][0].shape[1]) if name.startswith("weight") else (rows,)


def _host(a: Any, name: str) -> np.ndarray:
    """*a* as a host NumPy array (a copy from the device when needed)."""
    if isinstance(a, np.ndarray):
        return a
    tp = type(a)
    mod = tp.__module__ or ""
    if mod.startswith("torch") and hasattr(a, "detach"):
        t = a.detach()
        if str(t.dtype) == "torch.bfloat16":
            from .._types import numpy_dtype
            from ..enums import DataType

            return t.cpu().float().numpy().astype(numpy_dtype(DataType.BFLOAT16))
        return t.cpu().numpy()
    if hasattr(a, "__cuda_array_interface__") and callable(getattr(a, "get", None)):
        return np.asarray(a.get())  # pycudnn DeviceArray, CuPy
    try:
        return np.asarray(a)
    except Exception as exc:  # report which parameter could not be read
        raise TypeError(f"{name}: cannot read a {tp.__name__} as an array ({exc})") from None


def _params_mapping(params: Any, func: str) -> Mapping[str, Any]:
    if hasattr(params, "state_dict") and callable(params.state_dict):
        params = params.state_dict()  # an nn.Module
    if not isinstance(params, Mapping):
        raise TypeError(
            f"{func}: params must be a mapping of PyTorch parameter names to arrays (a "
            f"state_dict) or an nn.RNN/LSTM/GRU module, got {type(params).__name__}"
        )
    return params


def _check_torch_layout(func: str, layout: Any, direction: str) -> None:
    """*layout* is an :class:`RNNLayout` that PyTorch has (*direction*: ``"from"`` or ``"to"``,
    for the message)."""
    if not isinstance(layout, RNNLayout):
        raise TypeError(f"{func}: layout must be an RNNLayout, got {type(layout).__name__}")
    if layout.input_mode == "skip":
        raise ValueError(f"{func}: PyTorch has no input_mode='skip' RNN to convert {direction}")


def rnn_weights_from_torch(
    params: Any, layout: RNNLayout, *, prefix: str = "", dtype: Any = None
) -> np.ndarray:
    """cuDNN's flat weight buffer (host, 1-D, ``layout.size`` elements) from PyTorch parameters.

    Parameters
    ----------
    params : mapping or torch.nn.Module
        ``{name: array}`` with PyTorch's names (``weight_ih_l0``, ``bias_hh_l1_reverse``,
        ``weight_hr_l0``, ... see :func:`torch_rnn_param_names`), e.g. ``lstm.state_dict()``
        or the module itself. Arrays may be NumPy arrays or torch tensors (CPU or CUDA).
    layout : RNNLayout
        The block's layout (:meth:`pycudnn.RNNBlock.layout`) or :func:`canonical_rnn_layout`.
    prefix : str
        Prepended to every name (a submodule's state_dict entries, e.g. ``"encoder.rnn."``).
    dtype : dtype, optional
        Of the result; default the parameters' dtype.

    Returns
    -------
    numpy.ndarray
        1-D, ``layout.size`` elements; copy it to the device with ``pycudnn.to_device``.

    Raises
    ------
    ValueError
        A parameter is missing or has the wrong shape; an unexpected parameter with *prefix*
        (e.g. biases for a ``bias=False`` layout); ``input_mode='skip'`` (PyTorch has no such
        RNN).
    TypeError
        *params* is not a mapping or module.
    """
    func = "rnn_weights_from_torch"
    _check_torch_layout(func, layout, "from")
    params = _params_mapping(params, func)
    wanted = torch_params(layout)
    extra = sorted(
        k[len(prefix) :]
        for k in params
        if isinstance(k, str) and k.startswith(prefix) and k[len(prefix) :] not in wanted
    )
    if extra:
        raise ValueError(
            f"{func}: unexpected parameters {extra} for {layout!r} (expected {sorted(wanted)})"
        )
    flat: np.ndarray | None = None
    for name, parts in wanted.items():
        key = prefix + name
        if key not in params:
            raise ValueError(f"{func}: parameter {key!r} is missing (expected {sorted(wanted)})")
        a = _host(params[key], key)
        shape = torch_shape(layout, name, parts)
        if tuple(a.shape) != shape:
            raise ValueError(f"{func}: {key} has shape {tuple(a.shape)}, expected {shape}")
        if flat is None:
            flat = np.zeros(layout.size, dtype=a.dtype if dtype is None else dtype)
        for s, row in parts:
            block = a[row : row + s.shape[0]] if name[:9] != "weight_hr" else a
            flat[s.offset : s.offset + s.size] = block.reshape(-1)
    assert flat is not None
    return flat


def rnn_weights_to_torch(w: Any, layout: RNNLayout, *, prefix: str = "") -> dict[str, np.ndarray]:
    """PyTorch's parameters (a state_dict of host arrays) from cuDNN's flat weight buffer.

    Parameters
    ----------
    w : array
        The weight buffer (or its gradient): 1-D, ``layout.size`` elements; a NumPy array, a
        device array (copied to the host) or a torch tensor.
    layout : RNNLayout
    prefix : str
        Prepended to every name.

    Returns
    -------
    dict of str to numpy.ndarray
        In :func:`torch_rnn_param_names` order; ``module.load_state_dict({k: torch.as_tensor(v)
        ...})`` loads it.

    Raises
    ------
    ValueError
        *w* does not have ``layout.size`` elements, or the layout is ``input_mode='skip'``.
    """
    func = "rnn_weights_to_torch"
    _check_torch_layout(func, layout, "to")
    a = _host(w, "w").reshape(-1)
    if a.size != layout.size:
        raise ValueError(f"{func}: w has {a.size} elements, the layout {layout.size}")
    wanted = torch_params(layout)
    order = torch_rnn_param_names(
        layout.mode, layout.num_layers, layout.bidirectional, layout.proj_size, layout.bias
    )
    out: dict[str, np.ndarray] = {}
    for name in order:
        parts = wanted[name]
        t = np.empty(torch_shape(layout, name, parts), dtype=a.dtype)
        for s, row in parts:
            src = a[s.offset : s.offset + s.size].reshape(s.shape)
            if name[:9] == "weight_hr":
                t[...] = src
            else:
                t[row : row + s.shape[0]] = src
        out[prefix + name] = t
    return out
