"""The public graph builder: :class:`Graph` and its :class:`Tensor` handles.

A :class:`Graph` records tensors and operations in Python (nothing touches cuDNN until
:meth:`Graph.build`): every argument is checked when the operation is added, and output shapes
are inferred then, so a mistake is reported at the line that made it. :meth:`Graph.build`
freezes the graph into a :class:`~pycudnn.graph._key.GraphKey` -- plain data, hashable by
structure -- and asks the plan engine (:mod:`._plans`, the one that runs every convolution) for
a plan, cached per thread under that key. :meth:`Graph.execute` runs it with a mapping from
tensors to device arrays.

The vocabulary follows cudnn-frontend's ``pygraph``: ``tensor``/``tensor_like``, ``conv_fprop``,
``conv_dgrad``, ``conv_wgrad``, ``matmul``, the pointwise operations by name (``add``, ``relu``,
``gelu``, ``cmp_gt``, ``binary_select``, ...), ``reduction``, ``layernorm``/``rmsnorm``/
``instancenorm``/``batchnorm`` and their ``_backward``, ``sdpa``/``sdpa_backward``; tensors have
``set_output``, ``set_data_type``, ``set_dim``, ``set_stride``, ``set_name``, ``set_uid``.
"""

from __future__ import annotations

import ctypes
import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .. import _config, _cuda, _layout, errors, memory
from .. import handle as _handle
from .._types import as_data_type, dtype_name, itemsize
from ..descriptors import BackendDescriptor
from ..enums import (
    BackendAttributeName as A,
)
from ..enums import (
    BackendAttributeType as T,
)
from ..enums import (
    BackendBehaviorNote,
    BackendDescriptorType,
    BackendHeurMode,
    BackendNormFwdPhase,
    BackendNormMode,
    BackendNumericalNote,
    ConvolutionMode,
    DataType,
    PointwiseMode,
    ReduceTensorOp,
)
from . import _plans
from ._key import GraphKey, NodeSpec, TensorSpec

__all__ = ["Graph", "Tensor", "load_plan"]

_FLOATS = (DataType.HALF, DataType.BFLOAT16, DataType.FLOAT, DataType.DOUBLE)
_HEUR = {
    "a": BackendHeurMode.MODE_A,
    "b": BackendHeurMode.MODE_B,
    "instant": BackendHeurMode.MODE_INSTANT,
    "fallback": BackendHeurMode.MODE_FALLBACK,
}
#: scratch tensors start at this byte alignment inside the graph's workspace
_SCRATCH_ALIGN = 256


def _dtype(value: Any, argument: str, allow_none: bool = False) -> DataType | None:
    if value is None and allow_none:
        return None
    if isinstance(value, DataType):
        return value
    try:
        return as_data_type(value, argument=argument)
    except TypeError as exc:
        raise TypeError(f"{argument}: {exc}") from None


def _dims(value: Any, argument: str, lo: int = 1) -> tuple[int, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"{argument} must be a sequence of ints, got {value!r}")
    out = []
    for v in value:
        if isinstance(v, bool) or not hasattr(v, "__index__"):
            raise TypeError(f"{argument} must contain ints, got {value!r}")
        v = v.__index__()
        if v < lo:
            raise ValueError(f"{argument} must contain ints >= {lo}, got {tuple(value)!r}")
        out.append(v)
    if not out or len(out) > 8:
        raise ValueError(f"{argument} must have 1 to 8 values, got {tuple(value)!r}")
    return tuple(out)


def like_strides(dim: Sequence[int], ref_dim: Sequence[int], ref_stride: Sequence[int]
                  ) -> tuple[int, ...]:  # fmt: skip
    """Packed strides for *dim* in the memory order of a reference tensor of the same rank
    (row-major when the ranks differ): an output keeps its input's layout."""
    n = len(dim)
    if len(ref_dim) != n:
        return _layout.packed_strides(tuple(dim))
    # innermost first: by stride, ties broken by the later axis (row-major)
    order = sorted(range(n), key=lambda i: (ref_stride[i], -i))
    out = [0] * n
    acc = 1
    for i in order:
        out[i] = acc
        acc *= dim[i]
    return tuple(out)


class Tensor:
    """A tensor of a :class:`Graph`: an input declared with :meth:`Graph.tensor`, or an
    operation's output (virtual until :meth:`set_output`).

    The setters return the tensor, so they chain as in cudnn-frontend
    (``y.set_output(True).set_data_type("bfloat16")``).
    """

    __slots__ = (
        "_alignment",
        "_by_value",
        "_dim",
        "_dtype",
        "_graph",
        "_index",
        "_name",
        "_producer",
        "_scratch",
        "_stride",
        "_swap_last",
        "_uid",
        "_value",
        "_virtual",
    )

    def __init__(self, graph: Graph, index: int, name: str, dim: tuple[int, ...],
                 stride: tuple[int, ...], dtype: DataType | None, virtual: bool,
                 by_value: bool = False, producer: str | None = None) -> None:  # fmt: skip
        self._graph = graph
        self._index = index
        self._name = name
        self._dim, self._stride, self._dtype = dim, stride, dtype
        self._virtual, self._by_value = virtual, by_value
        self._value: ctypes._SimpleCData | None = None
        self._uid: int | None = None
        self._alignment = 16
        self._producer = producer
        self._scratch: str | None = None
        # described to cuDNN with the last two dims swapped (same memory): attention's K^T
        self._swap_last = False

    # -- pygraph-style setters -----------------------------------------------------------------
    def set_output(self, is_output: bool = True) -> Tensor:
        """Make this operation output a real (non-virtual) tensor that :meth:`Graph.execute`
        writes into a device array (``False``: an intermediate cuDNN may keep in registers)."""
        self._graph._mutable()
        if self._producer is None and not is_output:
            raise ValueError(f"tensor {self._name!r} is a graph input; it cannot be virtual")
        self._virtual = not bool(is_output)
        return self

    def set_data_type(self, data_type: Any) -> Tensor:
        """Set the data type (any dtype-like: ``"bfloat16"``, a numpy/torch dtype...)."""
        self._graph._mutable()
        self._dtype = _dtype(data_type, f"tensor {self._name!r}: data_type")
        return self

    def set_dim(self, dim: Sequence[int]) -> Tensor:
        """Set the dims (strides become packed row-major if the rank changes)."""
        self._graph._mutable()
        d = _dims(dim, f"tensor {self._name!r}: dim")
        if len(d) != len(self._stride):
            self._stride = _layout.packed_strides(d)
        self._dim = d
        return self

    def set_stride(self, stride: Sequence[int]) -> Tensor:
        """Set the element strides (one per dim)."""
        self._graph._mutable()
        s = _dims(stride, f"tensor {self._name!r}: stride")
        if len(s) != len(self._dim):
            raise ValueError(f"tensor {self._name!r}: stride {s} has {len(s)} values, its dim "
                             f"{self._dim} has {len(self._dim)}")  # fmt: skip
        self._stride = s
        return self

    def set_name(self, name: str) -> Tensor:
        """Set the name used in error messages and by execute() lookups."""
        if not isinstance(name, str) or not name:
            raise TypeError(f"a tensor name must be a non-empty str, got {name!r}")
        self._name = name
        return self

    def set_uid(self, uid: int) -> Tensor:
        """Pin the unique id the variant pack uses for this tensor."""
        self._graph._mutable()
        if isinstance(uid, bool) or not isinstance(uid, int) or not 0 < uid < 2**62:
            raise ValueError(f"tensor {self._name!r}: uid must be an int in [1, 2**62), "
                             f"got {uid!r}")  # fmt: skip
        self._uid = uid
        return self

    def set_alignment(self, alignment: int) -> Tensor:
        """Declare the byte alignment of the arrays this tensor will be given (default 16)."""
        self._graph._mutable()
        if isinstance(alignment, bool) or alignment not in (1, 2, 4, 8, 16, 32, 64, 128, 256):
            raise ValueError(f"tensor {self._name!r}: alignment must be a power of two from 1 "
                             f"to 256 bytes, got {alignment!r}")  # fmt: skip
        self._alignment = alignment
        return self

    # -- getters -------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        """The name of the tensor."""
        return self._name

    @property
    def dim(self) -> tuple[int, ...]:
        """The dims."""
        return self._dim

    @property
    def stride(self) -> tuple[int, ...]:
        """The element strides."""
        return self._stride

    @property
    def data_type(self) -> DataType | None:
        """The declared data type (None: resolved when the graph is built)."""
        return self._dtype

    @property
    def is_virtual(self) -> bool:
        """True for an intermediate that never reaches memory."""
        return self._virtual

    @property
    def is_pass_by_value(self) -> bool:
        """True for a host scalar passed by value."""
        return self._by_value

    def get_dim(self) -> list[int]:
        """The dims as a list (cudnn-frontend spelling)."""
        return list(self._dim)

    def get_stride(self) -> list[int]:
        """The element strides as a list."""
        return list(self._stride)

    def get_data_type(self) -> DataType | None:
        """The declared data type (None: resolved at build)."""
        return self._dtype

    def get_uid(self) -> int | None:
        """The unique id (assigned by :meth:`Graph.build` unless :meth:`set_uid` set one)."""
        return self._uid

    def __repr__(self) -> str:
        kind = "virtual" if self._virtual else "by value" if self._by_value else "tensor"
        dt = dtype_name(self._dtype) if self._dtype is not None else "auto"
        return f"<graph {kind} {self._name!r} dim={self._dim} stride={self._stride} {dt}>"


class Graph:
    """A cuDNN operation graph built from Python, then planned, cached and executed.

    Parameters
    ----------
    io_data_type : dtype-like, optional
        Data type of the graph's inputs and real outputs that do not set one (``"bfloat16"``,
        ``"float16"``, ``"float32"``, a numpy/torch dtype, a ``DataType``).
    intermediate_data_type : dtype-like
        Data type of virtual (intermediate) tensors; default float32.
    compute_data_type : dtype-like
        Math precision of the operations; default float32.
    name : str
        Used in error messages.

    Examples
    --------
    A convolution with its bias and ReLU, as one graph (run on a GPU)::

        g = pycudnn.graph.Graph(io_data_type="float16")
        x = g.tensor_like(x_gpu, name="x")
        w = g.tensor_like(w_gpu, name="w")
        b = g.tensor_like(b_gpu, name="b")
        y = g.relu(g.add(g.conv_fprop(x, w, padding=1), b)).set_output(True)
        g.build()
        g.execute({x: x_gpu, w: w_gpu, b: b_gpu, y: y_gpu})
    """

    def __init__(
        self,
        io_data_type: Any = None,
        intermediate_data_type: Any = "float32",
        compute_data_type: Any = "float32",
        *,
        name: str = "graph",
    ) -> None:
        self.io_data_type = _dtype(io_data_type, "io_data_type", allow_none=True)
        self.intermediate_data_type = _dtype(intermediate_data_type, "intermediate_data_type")
        self.compute_data_type = _dtype(compute_data_type, "compute_data_type")
        self.name = name
        self._tensors: list[Tensor] = []
        self._nodes: list[tuple[str, str, dict[str, Any], list[tuple[str, Tensor]]]] = []
        self._key: GraphKey | None = None
        self._plan: Any = None
        self._handle: Any = None
        self._label: str | None = None
        self._api = "pycudnn.graph"
        self._order: tuple[Tensor, ...] = ()

    if TYPE_CHECKING:  # the pointwise operations by name (add, relu, gelu...) are set below

        def __getattr__(self, name: str) -> Callable[..., Tensor]: ...

    # -- tensors -------------------------------------------------------------------------------
    def _mutable(self) -> None:
        if self._key is not None:
            raise RuntimeError(f"{self.name}: the graph was built; make a new Graph to change it")

    def _new(self, name: str | None, dim: tuple[int, ...], stride: tuple[int, ...],
             dtype: DataType | None, virtual: bool, by_value: bool = False,
             producer: str | None = None) -> Tensor:  # fmt: skip
        self._mutable()
        index = len(self._tensors)
        t = Tensor(self, index, name or f"t{index}", dim, stride, dtype, virtual, by_value,
                   producer)  # fmt: skip
        self._tensors.append(t)
        return t

    def tensor(
        self,
        dim: Sequence[int],
        stride: Sequence[int] | None = None,
        data_type: Any = None,
        *,
        name: str | None = None,
        is_pass_by_value: bool = False,
        uid: int | None = None,
        alignment: int = 16,
    ) -> Tensor:
        """A graph input of shape *dim* (element *stride*, packed row-major by default).

        ``is_pass_by_value``: a scalar passed at execute time as a Python number (not a device
        array), e.g. a scale; its dims must all be 1.
        """
        d = _dims(dim, f"{self.name}: tensor dim")
        s = (
            _layout.packed_strides(d)
            if stride is None
            else _dims(stride, f"{self.name}: tensor stride")
        )
        if len(s) != len(d):
            raise ValueError(f"{self.name}: stride {s} has {len(s)} values, dim {d} has {len(d)}")
        dt = _dtype(data_type, f"{self.name}: data_type", allow_none=True)
        if is_pass_by_value and math.prod(d) != 1:
            raise ValueError(f"{self.name}: a pass-by-value tensor is a scalar; dim {d} is not")
        t = self._new(name, d, s, dt, False, bool(is_pass_by_value))
        if uid is not None:
            t.set_uid(uid)
        if alignment != 16:
            t.set_alignment(alignment)
        return t

    def tensor_like(self, array: Any, *, name: str | None = None) -> Tensor:
        """A graph input with the shape, element strides and data type of a device array
        (torch tensor, CuPy/JAX array, ``DeviceArray``); its address's alignment is kept."""
        try:
            a = memory.asarray(array, check=False)
        except Exception as exc:
            raise TypeError(f"{self.name}: tensor_like needs a device array: {exc}") from None
        dt = _dtype(a.dtype, f"{self.name}: tensor_like dtype")
        isz = a.dtype.itemsize
        stride = tuple(max(s // isz, 1) for s in a.strides) if a.shape else (1,)
        t = self._new(name, tuple(a.shape) or (1,), stride, dt, False)
        t._alignment = alignment_of(a.ptr)
        return t

    def scalar(self, value: float, data_type: Any = "float32", *, name: str | None = None
               ) -> Tensor:  # fmt: skip
        """A constant scalar (a by-value tensor whose value the graph keeps and passes itself)."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{self.name}: scalar value must be a real number, got {value!r}")
        dt = _dtype(data_type, f"{self.name}: scalar data_type")
        t = self._new(name, (1, 1, 1, 1), (1, 1, 1, 1), dt, False, True)
        t._value = _host_scalar(value, dt)
        return t

    def _scratch(self, name: str, dim: tuple[int, ...], dtype: DataType, fill: str | None
                 ) -> Tensor:  # fmt: skip
        """A real tensor the graph keeps in its own workspace (*fill* ``'zero'``: zeroed before
        every run), e.g. an accumulator an engine needs."""
        t = self._new(name, dim, _layout.packed_strides(dim), dtype, False)
        t._scratch = fill or "keep"
        return t

    def _check(self, op: str, argument: str, t: Any, optional: bool = False) -> Tensor | None:
        if t is None and optional:
            return None
        if not isinstance(t, Tensor):
            raise TypeError(f"{self.name}.{op}: {argument} must be a Tensor of this graph, got "
                            f"{type(t).__name__}")  # fmt: skip
        if t._graph is not self:
            raise ValueError(f"{self.name}.{op}: {argument} ({t._name!r}) belongs to another "
                             "graph")  # fmt: skip
        return t

    def _node(self, kind: str, name: str | None, settings: dict[str, Any],
              tensors: list[tuple[str, Tensor]]) -> None:  # fmt: skip
        self._mutable()
        self._nodes.append((kind, name or f"{kind}{len(self._nodes)}", settings, tensors))

    def _out(self, op: str, name: str | None, dim: tuple[int, ...], like: Tensor | None,
             dtype: DataType | None = None) -> Tensor:  # fmt: skip
        stride = like_strides(dim, like._dim, like._stride) if like is not None else (
            _layout.packed_strides(dim)
        )  # fmt: skip
        return self._new(name, dim, stride, dtype, True, producer=op)

    def _compute(self, value: Any, op: str) -> DataType:
        if value is None:
            return self.compute_data_type
        return _dtype(value, f"{self.name}.{op}: compute_data_type")

    # -- convolutions --------------------------------------------------------------------------
    def _conv_settings(self, op: str, nd: int, padding: Any, stride: Any, dilation: Any,
                       post_padding: Any, mode: str, compute: Any, alpha: float, beta: float
                       ) -> dict[str, Any]:  # fmt: skip
        def spatial(v: Any, arg: str, lo: int) -> tuple[int, ...]:
            if isinstance(v, int) and not isinstance(v, bool):
                v = (v,) * nd
            vals = _dims(v, f"{self.name}.{op}: {arg}", lo)
            if len(vals) != nd:
                raise ValueError(f"{self.name}.{op}: {arg} must have {nd} values (one per "
                                 f"spatial dim), got {v!r}")  # fmt: skip
            return vals

        pre = spatial(padding, "padding", 0)
        post = pre if post_padding is None else spatial(post_padding, "post_padding", 0)
        modes = {"cross_correlation": ConvolutionMode.CROSS_CORRELATION,
                 "convolution": ConvolutionMode.CONVOLUTION}  # fmt: skip
        if mode not in modes:
            raise ValueError(f"{self.name}.{op}: mode={mode!r} is not one of {tuple(modes)}")
        return {
            "pre_padding": pre,
            "post_padding": post,
            "stride": spatial(stride, "stride", 1),
            "dilation": spatial(dilation, "dilation", 1),
            "mode": int(modes[mode]),
            "compute_data_type": int(self._compute(compute, op)),
            "alpha": float(alpha),
            "beta": float(beta),
        }

    def conv_fprop(self, image: Tensor, weight: Tensor, padding: Any = 0, stride: Any = 1,
                   dilation: Any = 1, *, post_padding: Any = None,
                   mode: str = "cross_correlation", compute_data_type: Any = None,
                   alpha: float = 1.0, beta: float = 0.0, name: str | None = None
                   ) -> Tensor:  # fmt: skip
        """Convolution forward: ``y = alpha * conv(image, weight) + beta * y``; image
        (N, C, *spatial), weight (K, C/groups, *kernel) -> y (N, K, *out)."""
        x = self._check("conv_fprop", "image", image)
        w = self._check("conv_fprop", "weight", weight)
        nd = len(x._dim) - 2
        if nd < 1 or len(w._dim) != len(x._dim):
            raise ValueError(f"{self.name}.conv_fprop: image {x._dim} and weight {w._dim} must "
                             "have the same rank, at least 3")  # fmt: skip
        s = self._conv_settings("conv_fprop", nd, padding, stride, dilation, post_padding,
                                mode, compute_data_type, alpha, beta)  # fmt: skip
        out = []
        for i in range(nd):
            span = x._dim[2 + i] + s["pre_padding"][i] + s["post_padding"][i]
            eff = s["dilation"][i] * (w._dim[2 + i] - 1) + 1
            if span < eff:
                raise ValueError(f"{self.name}.conv_fprop: the padded image ({span}) is smaller "
                                 f"than the dilated kernel ({eff}) in spatial dim {i}")  # fmt: skip
            out.append((span - eff) // s["stride"][i] + 1)
        y = self._out("conv_fprop", name and f"{name}::y", (x._dim[0], w._dim[0], *out), x)
        self._node("conv_fprop", name, s, [("OPERATION_CONVOLUTION_FORWARD_X", x),
                                           ("OPERATION_CONVOLUTION_FORWARD_W", w),
                                           ("OPERATION_CONVOLUTION_FORWARD_Y", y)])  # fmt: skip
        return y

    def conv_dgrad(self, loss: Tensor, filter: Tensor, padding: Any = 0, stride: Any = 1,
                   dilation: Any = 1, *, image_dim: Sequence[int] | None = None,
                   post_padding: Any = None, mode: str = "cross_correlation",
                   compute_data_type: Any = None, alpha: float = 1.0, beta: float = 0.0,
                   name: str | None = None) -> Tensor:  # fmt: skip
        """Convolution backward-data: the gradient of the image from ``loss`` (dy) and
        ``filter``; *image_dim* gives dx's shape where the stride makes it ambiguous."""
        dy = self._check("conv_dgrad", "loss", loss)
        w = self._check("conv_dgrad", "filter", filter)
        nd = len(dy._dim) - 2
        s = self._conv_settings("conv_dgrad", nd, padding, stride, dilation, post_padding,
                                mode, compute_data_type, alpha, beta)  # fmt: skip
        if image_dim is None:
            sp = [(dy._dim[2 + i] - 1) * s["stride"][i] - s["pre_padding"][i]
                  - s["post_padding"][i] + s["dilation"][i] * (w._dim[2 + i] - 1) + 1
                  for i in range(nd)]  # fmt: skip
            image_dim = (dy._dim[0], w._dim[1], *sp)
        dim = _dims(image_dim, f"{self.name}.conv_dgrad: image_dim")
        dx = self._out("conv_dgrad", name and f"{name}::dx", dim, dy)
        self._node("conv_dgrad", name, s, [("OPERATION_CONVOLUTION_BWD_DATA_W", w),
                                           ("OPERATION_CONVOLUTION_BWD_DATA_DY", dy),
                                           ("OPERATION_CONVOLUTION_BWD_DATA_DX", dx)])  # fmt: skip
        return dx

    def conv_wgrad(self, image: Tensor, loss: Tensor, padding: Any = 0, stride: Any = 1,
                   dilation: Any = 1, *, filter_dim: Sequence[int] | None = None,
                   post_padding: Any = None, mode: str = "cross_correlation",
                   compute_data_type: Any = None, alpha: float = 1.0, beta: float = 0.0,
                   name: str | None = None) -> Tensor:  # fmt: skip
        """Convolution backward-filter: the filter's gradient from ``image`` (x) and ``loss``
        (dy); *filter_dim* gives dw's shape where it is ambiguous."""
        x = self._check("conv_wgrad", "image", image)
        dy = self._check("conv_wgrad", "loss", loss)
        nd = len(x._dim) - 2
        s = self._conv_settings("conv_wgrad", nd, padding, stride, dilation, post_padding,
                                mode, compute_data_type, alpha, beta)  # fmt: skip
        if filter_dim is None:
            k = []
            for i in range(nd):
                span = x._dim[2 + i] + s["pre_padding"][i] + s["post_padding"][i]
                eff = span - (dy._dim[2 + i] - 1) * s["stride"][i]
                k.append(max((eff - 1) // s["dilation"][i] + 1, 1))
            filter_dim = (dy._dim[1], x._dim[1], *k)
        dim = _dims(filter_dim, f"{self.name}.conv_wgrad: filter_dim")
        dw = self._out("conv_wgrad", name and f"{name}::dw", dim, x)
        self._node(
            "conv_wgrad",
            name,
            s,
            [
                ("OPERATION_CONVOLUTION_BWD_FILTER_X", x),
                ("OPERATION_CONVOLUTION_BWD_FILTER_DY", dy),
                ("OPERATION_CONVOLUTION_BWD_FILTER_DW", dw),
            ],
        )
        return dw

    # -- matmul --------------------------------------------------------------------------------
    def matmul(self, A: Tensor, B: Tensor, *, compute_data_type: Any = None,
               padding_value: float | None = None, m_override: Tensor | None = None,
               n_override: Tensor | None = None, k_override: Tensor | None = None,
               name: str | None = None) -> Tensor:  # fmt: skip
        """Batched matrix product ``C = A @ B``: A (*batch, M, K), B (*batch, K, N) ->
        C (*batch, M, N); a batch dim of 1 in one operand broadcasts against the other's.
        Transposed operands are strides (a K-major B is B with swapped strides).
        *m_override*/*n_override*/*k_override*: int32 (batch..., 1, 1) tensors of per-batch
        valid sizes (variable lengths)."""
        return self._matmul(A, B, compute_data_type, padding_value,
                            (m_override, n_override, k_override), name, groups=False)  # fmt: skip

    def _matmul(self, A: Any, B: Any, compute: Any, padding_value: float | None,
                overrides: tuple, name: str | None, groups: bool) -> Tensor:  # fmt: skip
        a = self._check("matmul", "A", A)
        b = self._check("matmul", "B", B)
        ad, bd = _ddim(a), _ddim(b)
        if len(ad) != len(bd) or len(ad) < 2:
            raise ValueError(f"{self.name}.matmul: A {ad} and B {bd} must have the same "
                             "rank, at least 2 (add size-1 batch dims)")  # fmt: skip
        if ad[-1] != bd[-2]:
            raise ValueError(f"{self.name}.matmul: A's last dim ({ad[-1]}) must equal B's "
                             f"second to last ({bd[-2]}); A {ad}, B {bd}")  # fmt: skip
        batch = []
        for i, (m, n) in enumerate(zip(ad[:-2], bd[:-2], strict=True)):
            # grouped heads (attention): one operand's count divides the other's
            grouped = groups and max(m, n) % min(m, n) == 0
            if m != n and 1 not in (m, n) and not grouped:
                raise ValueError(f"{self.name}.matmul: batch dim {i} of A ({m}) and B ({n}) "
                                 "differ and neither is 1")  # fmt: skip
            batch.append(max(m, n))
        dim = (*batch, ad[-2], bd[-1])
        c = self._new(name and f"{name}::C", dim, _layout.packed_strides(dim), None, True,
                      producer="matmul")  # fmt: skip
        s = {"compute_data_type": int(self._compute(compute, "matmul"))}
        if padding_value is not None:
            s["padding_value"] = float(padding_value)
        roles = [("OPERATION_MATMUL_ADESC", a), ("OPERATION_MATMUL_BDESC", b),
                 ("OPERATION_MATMUL_CDESC", c)]  # fmt: skip
        for which, t in zip("MNK", overrides, strict=True):
            t = self._check("matmul", f"{which.lower()}_override", t, optional=True)
            if t is not None:
                roles.append((f"OPERATION_MATMUL_GEMM_{which}_OVERRIDE_DESC", t))
        self._node("matmul", name, s, roles)
        return c

    def reshape(self, input: Tensor, dim: Sequence[int], stride: Sequence[int], *,
                data_type: Any = None, name: str | None = None) -> Tensor:  # fmt: skip
        """A view of *input* with other dims/strides (cuDNN's reshape operation, view only)."""
        x = self._check("reshape", "input", input)
        d = _dims(dim, f"{self.name}.reshape: dim")
        st = _dims(stride, f"{self.name}.reshape: stride")
        if math.prod(d) != math.prod(x._dim):
            raise ValueError(f"{self.name}.reshape: dims {d} do not hold the input's "
                             f"{math.prod(x._dim)} elements ({x._dim})")  # fmt: skip
        y = self._new(name and f"{name}::y", d, st, _dtype(data_type, "data_type", True), True,
                      producer="reshape")  # fmt: skip
        self._node("reshape", name, {}, [("OPERATION_RESHAPE_XDESC", x),
                                         ("OPERATION_RESHAPE_YDESC", y)])  # fmt: skip
        return y

    # -- pointwise -----------------------------------------------------------------------------
    def pointwise(self, mode: Any, input0: Tensor, input1: Tensor | None = None,
                  input2: Tensor | None = None, *, compute_data_type: Any = None,
                  alpha1: float = 1.0, alpha2: float = 1.0, name: str | None = None,
                  **params: float) -> Tensor:  # fmt: skip
        """Any cuDNN pointwise mode (a ``PointwiseMode`` or its name, ``"add"``,
        ``"relu_fwd"``...): ``y = op(alpha1 * input0[, alpha2 * input1[, input2]])``. The
        backward modes (``*_bwd``) take ``input0=dy`` (the loss) and ``input1=x`` and give dx.
        *params*: ``relu_lower_clip``, ``relu_upper_clip``, ``relu_lower_clip_slope``,
        ``elu_alpha``, ``softplus_beta``, ``swish_beta``, ``axis`` (``gen_index``)."""
        from ..descriptors._validate import coerce_enum

        m = coerce_enum(mode, PointwiseMode, "mode")
        return self._pointwise(m, input0, input1, input2, compute_data_type, alpha1, alpha2,
                               name, params)  # fmt: skip

    def _pointwise(self, m: PointwiseMode, x: Any, b: Any, c: Any, compute: Any,
                   alpha1: float, alpha2: float, name: str | None,
                   params: dict[str, Any]) -> Tensor:  # fmt: skip
        op = m.name.lower()
        arity = _arity(m)
        x = self._check(op, "input0", x)
        b = self._check(op, "input1", b, optional=arity < 2)
        c = self._check(op, "input2", c, optional=arity < 3)
        if arity >= 2 and b is None:
            raise TypeError(f"{self.name}.{op} takes {arity} inputs, got 1")
        if (arity < 2 and b is not None) or (arity < 3 and c is not None):
            raise TypeError(f"{self.name}.{op} takes {arity} input(s)")
        for k in params:
            if k not in _PW_PARAM_NAMES:
                raise TypeError(f"{self.name}.{op}: unknown parameter {k!r}; expected one of "
                                f"{', '.join(_PW_PARAM_NAMES)}")  # fmt: skip
        for t in (b, c):  # a scalar takes the rank of the operation (as cudnn-frontend's)
            if (
                t is not None
                and t._by_value
                and math.prod(t._dim) == 1
                and len(t._dim) != len(x._dim)
            ):
                t._dim = t._stride = (1,) * len(x._dim)
        dims = [t._dim for t in (x, b, c) if t is not None]
        if len({len(d) for d in dims}) != 1:
            raise ValueError(f"{self.name}.{op}: inputs of different ranks {dims}; give size-1 "
                             "dims to broadcast")  # fmt: skip
        out_dim = []
        for i, sizes in enumerate(zip(*dims, strict=True)):
            big = max(sizes)
            if any(s not in (1, big) for s in sizes):
                raise ValueError(f"{self.name}.{op}: dim {i} of the inputs {dims} does not "
                                 "broadcast")  # fmt: skip
            out_dim.append(big)
        like = max((t for t in (x, b, c) if t is not None), key=lambda t: math.prod(t._dim))
        out_dtype = None
        if m in _BOOL_OUT:
            out_dtype = DataType.BOOLEAN
        elif m == PointwiseMode.GEN_INDEX:
            out_dtype = DataType.INT32
        y = self._out(op, name and f"{name}::y", tuple(out_dim), like, out_dtype)
        s: dict[str, Any] = {
            "mode": int(m),
            "compute_data_type": int(self._compute(compute, op)),
            "alpha1": float(alpha1),
            "alpha2": float(alpha2),
        }
        for k, v in params.items():
            if k == "axis":
                if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < len(out_dim):
                    raise ValueError(f"{self.name}.{op}: axis must be an int in [0, "
                                     f"{len(out_dim)}), got {v!r}")  # fmt: skip
                s[k] = v
            else:
                if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:
                    raise ValueError(f"{self.name}.{op}: {k} must be a real number, got {v!r}")
                s[k] = float(v)
        if m == PointwiseMode.GEN_INDEX and "axis" not in s:
            raise TypeError(f"{self.name}.gen_index needs axis=")
        if m >= 200 and m < 300:  # backward: dy, x -> dx
            roles = [("OPERATION_POINTWISE_DYDESC", x), ("OPERATION_POINTWISE_XDESC", b),
                     ("OPERATION_POINTWISE_DXDESC", y)]  # fmt: skip
        else:
            roles = [("OPERATION_POINTWISE_XDESC", x)]
            if b is not None:
                roles.append(("OPERATION_POINTWISE_BDESC", b))
            if c is not None:
                roles.append(("OPERATION_POINTWISE_TDESC", c))
            roles.append(("OPERATION_POINTWISE_YDESC", y))
        self._node("pointwise", name or op, s, roles)
        return y

    # -- reduction -----------------------------------------------------------------------------
    def reduction(self, input: Tensor, mode: Any = "add", *, dim: Sequence[int],
                  compute_data_type: Any = None, deterministic: bool | None = None,
                  name: str | None = None) -> Tensor:  # fmt: skip
        """Reduce *input* to the output shape *dim* (1 where a dim is reduced, the input's size
        where it is kept, a divisor to reduce consecutive groups): ``mode`` ``'add'``,
        ``'mul'``, ``'min'``, ``'max'``, ``'amax'``, ``'avg'``,
        ``'norm1'``, ``'norm2'``, ``'mul_no_zeros'``."""
        from ..descriptors._validate import coerce_enum

        x = self._check("reduction", "input", input)
        m = coerce_enum(mode, ReduceTensorOp, "mode")
        d = _dims(dim, f"{self.name}.reduction: dim")
        if len(d) != len(x._dim) or any(i % o for o, i in zip(d, x._dim, strict=True)):
            raise ValueError(f"{self.name}.reduction: dim {d} must have the input's rank with "
                             f"each size 1, the input's ({x._dim}) or a divisor of it (sums "
                             "over consecutive groups)")  # fmt: skip
        y = self._out("reduction", name and f"{name}::y", d, x)
        s: dict[str, Any] = {"mode": int(m),
                             "compute_data_type": int(self._compute(compute_data_type, "reduction"))}  # noqa: E501  # fmt: skip
        if deterministic is not None:
            s["deterministic"] = bool(deterministic)
        self._node("reduction", name, s, [("OPERATION_REDUCTION_XDESC", x),
                                          ("OPERATION_REDUCTION_YDESC", y)])  # fmt: skip
        return y

    def _rng(self, dim: tuple[int, ...], like: Tensor, probability: float, seed: Tensor,
             offset: Tensor, name: str) -> Tensor:  # fmt: skip
        """Bernoulli(*probability*) mask of shape *dim* from Philox *seed*/*offset* tensors."""
        y = self._out("rng", f"{name}::mask", dim, like)
        self._node("rng", name, {"probability": float(probability)},
                   [("OPERATION_RNG_SEED", seed), ("OPERATION_RNG_OFFSET_DESC", offset),
                    ("OPERATION_RNG_YDESC", y)])  # fmt: skip
        return y

    # -- normalization -------------------------------------------------------------------------
    def _stats_dim(self, mode: BackendNormMode, x: Tensor) -> tuple[int, ...]:
        n = len(x._dim)
        if mode in (BackendNormMode.LAYER_NORM, BackendNormMode.RMS_NORM):
            return (x._dim[0], *(1,) * (n - 1))
        if mode == BackendNormMode.INSTANCE_NORM:
            return (x._dim[0], x._dim[1], *(1,) * (n - 2))
        return (1, x._dim[1], *(1,) * (n - 2))  # batch norm

    def _norm_forward(self, op: str, mode: BackendNormMode, phase: Any, x: Any, scale: Any,
                      bias: Any, epsilon: Any, name: str | None, *,
                      running: tuple | None = None) -> tuple:  # fmt: skip
        x = self._check(op, "input", x)
        scale = self._check(op, "scale", scale, optional=mode == BackendNormMode.RMS_NORM)
        bias = self._check(op, "bias", bias, optional=True)
        eps = self._check(op, "epsilon", epsilon)
        ph = _phase(phase, f"{self.name}.{op}")
        if len(x._dim) < 2:
            raise ValueError(f"{self.name}.{op}: input needs at least 2 dims, got {x._dim}")
        sdim = self._stats_dim(mode, x)
        y = self._out(op, name and f"{name}::y", x._dim, x)
        roles: list[tuple[str, Tensor]] = [("OPERATION_NORM_FWD_XDESC", x)]
        if scale is not None:
            roles.append(("OPERATION_NORM_FWD_SCALE_DESC", scale))
        if bias is not None:
            roles.append(("OPERATION_NORM_FWD_BIAS_DESC", bias))
        roles.append(("OPERATION_NORM_FWD_EPSILON_DESC", eps))
        outs: list[Tensor | None] = [y]
        if ph == BackendNormFwdPhase.TRAINING:
            mean = None
            if mode != BackendNormMode.RMS_NORM:
                mean = self._new(name and f"{name}::mean", sdim, _layout.packed_strides(sdim),
                                 DataType.FLOAT, True, producer=op)  # fmt: skip
                roles.append(("OPERATION_NORM_FWD_MEAN_DESC", mean))
                outs.append(mean)
            inv = self._new(name and f"{name}::inv_variance", sdim, _layout.packed_strides(sdim),
                            DataType.FLOAT, True, producer=op)  # fmt: skip
            roles.append(("OPERATION_NORM_FWD_INV_VARIANCE_DESC", inv))
            outs.append(inv)
        else:  # inference: no statistics
            outs += [None] if mode == BackendNormMode.RMS_NORM else [None, None]
        if running is not None:
            in_mean, in_var, momentum = running
            roles += [("OPERATION_NORM_FWD_INPUT_RUNNING_MEAN_DESC", in_mean),
                      ("OPERATION_NORM_FWD_INPUT_RUNNING_VAR_DESC", in_var),
                      ("OPERATION_NORM_FWD_EXP_AVG_FACTOR_DESC", momentum)]  # fmt: skip
            nm = self._out(op, name and f"{name}::next_running_mean", in_mean._dim, in_mean)
            nv = self._out(op, name and f"{name}::next_running_var", in_var._dim, in_var)
            roles += [("OPERATION_NORM_FWD_OUTPUT_RUNNING_MEAN_DESC", nm),
                      ("OPERATION_NORM_FWD_OUTPUT_RUNNING_VAR_DESC", nv)]  # fmt: skip
            outs += [nm, nv]
        roles.append(("OPERATION_NORM_FWD_YDESC", y))
        self._node("norm_forward", name or op, {"mode": int(mode), "phase": int(ph)}, roles)
        return tuple(outs)

    def layernorm(self, input: Tensor, scale: Tensor, bias: Tensor, epsilon: Tensor,
                  norm_forward_phase: Any = "training", *, name: str | None = None
                  ) -> tuple[Tensor, Tensor | None, Tensor | None]:  # fmt: skip
        """Layer norm over every dim but the first: ``(y, mean, inv_variance)`` (the
        statistics are None in inference). *scale*/*bias* are shaped like one sample
        (1, *input.dim[1:]); *epsilon* a scalar tensor (:meth:`scalar`)."""
        return self._norm_forward("layernorm", BackendNormMode.LAYER_NORM, norm_forward_phase,
                                  input, scale, bias, epsilon, name)  # type: ignore[return-value]  # fmt: skip

    def rmsnorm(self, input: Tensor, scale: Tensor, bias: Tensor | None = None,
                epsilon: Tensor | None = None, norm_forward_phase: Any = "training", *,
                name: str | None = None) -> tuple[Tensor, Tensor | None]:  # fmt: skip
        """RMS norm over every dim but the first: ``(y, inv_variance)`` (None in inference)."""
        outs = self._norm_forward("rmsnorm", BackendNormMode.RMS_NORM, norm_forward_phase,
                                  input, scale, bias, epsilon, name)  # fmt: skip
        return outs[0], (outs[1] if len(outs) > 1 else None)

    def instancenorm(self, input: Tensor, scale: Tensor, bias: Tensor, epsilon: Tensor,
                     norm_forward_phase: Any = "training", *, name: str | None = None
                     ) -> tuple:  # fmt: skip
        """Instance norm (per sample and channel): ``(y, mean, inv_variance)``."""
        return self._norm_forward(
            "instancenorm",
            BackendNormMode.INSTANCE_NORM,
            norm_forward_phase,
            input,
            scale,
            bias,
            epsilon,
            name,
        )

    def batchnorm(self, input: Tensor, scale: Tensor, bias: Tensor, epsilon: Tensor, *,
                  in_running_mean: Tensor | None = None, in_running_var: Tensor | None = None,
                  momentum: Tensor | None = None, norm_forward_phase: Any = "training",
                  name: str | None = None) -> tuple:  # fmt: skip
        """Batch norm (per channel) in training: ``(y, mean, inv_variance[,
        next_running_mean, next_running_var])`` -- the running statistics when
        *in_running_mean*, *in_running_var* and *momentum* (a scalar) are given."""
        if _phase(norm_forward_phase, f"{self.name}.batchnorm") != BackendNormFwdPhase.TRAINING:
            raise ValueError(f"{self.name}.batchnorm: only the training phase is built here (an "
                             "inference batch norm is a scale and shift: use mul/add)")  # fmt: skip
        running = None
        if any(v is not None for v in (in_running_mean, in_running_var, momentum)):
            running = (self._check("batchnorm", "in_running_mean", in_running_mean),
                       self._check("batchnorm", "in_running_var", in_running_var),
                       self._check("batchnorm", "momentum", momentum))  # fmt: skip
        return self._norm_forward("batchnorm", BackendNormMode.BATCH_NORM, norm_forward_phase,
                                  input, scale, bias, epsilon, name, running=running)  # fmt: skip

    def _norm_backward(self, op: str, mode: BackendNormMode, grad: Any, x: Any, scale: Any,
                       mean: Any, inv_variance: Any, has_dbias: bool, name: str | None,
                       epsilon: Any = None) -> tuple:  # fmt: skip
        dy = self._check(op, "grad", grad)
        x = self._check(op, "input", x)
        scale = self._check(op, "scale", scale)
        mean = self._check(op, "mean", mean, optional=mode == BackendNormMode.RMS_NORM)
        inv = self._check(op, "inv_variance", inv_variance)
        eps = self._check(op, "epsilon", epsilon, optional=True)
        dx = self._out(op, name and f"{name}::dx", x._dim, x)
        dscale = self._out(op, name and f"{name}::dscale", scale._dim, scale)
        roles: list[tuple[str, Tensor]] = [("OPERATION_NORM_BWD_XDESC", x)]
        if mean is not None:
            roles.append(("OPERATION_NORM_BWD_MEAN_DESC", mean))
        roles += [
            ("OPERATION_NORM_BWD_INV_VARIANCE_DESC", inv),
            ("OPERATION_NORM_BWD_DYDESC", dy),
            ("OPERATION_NORM_BWD_SCALE_DESC", scale),
        ]
        if eps is not None:
            roles.append(("OPERATION_NORM_BWD_EPSILON_DESC", eps))
        roles.append(("OPERATION_NORM_BWD_DSCALE_DESC", dscale))
        dbias = None
        if has_dbias:
            dbias = self._out(op, name and f"{name}::dbias", scale._dim, scale)
            roles.append(("OPERATION_NORM_BWD_DBIAS_DESC", dbias))
        roles.append(("OPERATION_NORM_BWD_DXDESC", dx))
        self._node("norm_backward", name or op, {"mode": int(mode)}, roles)
        return dx, dscale, dbias

    def layernorm_backward(self, grad: Tensor, input: Tensor, scale: Tensor, mean: Tensor,
                           inv_variance: Tensor, *, name: str | None = None) -> tuple:  # fmt: skip
        """``(dx, dscale, dbias)`` of :meth:`layernorm` from its saved statistics."""
        return self._norm_backward("layernorm_backward", BackendNormMode.LAYER_NORM, grad,
                                   input, scale, mean, inv_variance, True, name)  # fmt: skip

    def rmsnorm_backward(self, grad: Tensor, input: Tensor, scale: Tensor,
                         inv_variance: Tensor, has_dbias: bool = False, *,
                         name: str | None = None) -> tuple:  # fmt: skip
        """``(dx, dscale, dbias)`` of :meth:`rmsnorm` (dbias None unless *has_dbias*)."""
        return self._norm_backward("rmsnorm_backward", BackendNormMode.RMS_NORM, grad, input,
                                   scale, None, inv_variance, has_dbias, name)  # fmt: skip

    def instancenorm_backward(
        self,
        grad: Tensor,
        input: Tensor,
        scale: Tensor,
        mean: Tensor,
        inv_variance: Tensor,
        *,
        name: str | None = None,
    ) -> tuple:
        """``(dx, dscale, dbias)`` of :meth:`instancenorm`."""
        return self._norm_backward("instancenorm_backward", BackendNormMode.INSTANCE_NORM,
                                   grad, input, scale, mean, inv_variance, True, name)  # fmt: skip

    def batchnorm_backward(self, grad: Tensor, input: Tensor, scale: Tensor, mean: Tensor,
                           inv_variance: Tensor, *, name: str | None = None) -> tuple:  # fmt: skip
        """``(dx, dscale, dbias)`` of :meth:`batchnorm`."""
        return self._norm_backward("batchnorm_backward", BackendNormMode.BATCH_NORM, grad,
                                   input, scale, mean, inv_variance, True, name)  # fmt: skip

    # -- attention (composite graphs, see _sdpa) -----------------------------------------------
    def sdpa(self, q: Tensor, k: Tensor, v: Tensor, *, attn_scale: float | Tensor | None = None,
             is_inference: bool = True, use_causal_mask: bool = False,
             seq_len_q: Tensor | None = None, seq_len_kv: Tensor | None = None,
             dropout: tuple[float, Tensor, Tensor] | None = None, name: str | None = None
             ) -> tuple[Tensor, Tensor | None]:  # fmt: skip
        """Scaled dot-product attention ``softmax(scale * q k^T + mask) v``: q (B, H, S_q, D),
        k (B, H_k, S_kv, D), v (B, H_k, S_kv, D_v) with H a multiple of H_k (grouped-query);
        any strides (a (B, S, H, D) array is the same dims with its strides). Returns ``(o,
        stats)``; *stats* (B, H, S_q, 1) float32, the softmax's log-sum-exp, only in training
        (``is_inference=False``). *seq_len_q*/*seq_len_kv*: int32 (B, 1, 1, 1) tensors of the
        valid lengths (padding mask). *dropout*: ``(probability, seed, offset)`` with int64
        (1, 1, 1, 1) seed/offset tensors."""
        from . import _sdpa

        return _sdpa.forward(self, q, k, v, attn_scale, is_inference, use_causal_mask,
                             seq_len_q, seq_len_kv, dropout, name or "sdpa")  # fmt: skip

    def sdpa_backward(self, q: Tensor, k: Tensor, v: Tensor, o: Tensor, dO: Tensor,
                      stats: Tensor, *, attn_scale: float | Tensor | None = None,
                      use_causal_mask: bool = False, seq_len_q: Tensor | None = None,
                      seq_len_kv: Tensor | None = None,
                      dropout: tuple[float, Tensor, Tensor] | None = None,
                      use_deterministic_algorithm: bool = False,
                      name: str | None = None) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
        """Gradients ``(dq, dk, dv)`` of :meth:`sdpa` from its output, its statistics and the
        output's gradient *dO* (the same options as the forward). The default form accumulates
        dQ in a float32 tensor the graph keeps in its workspace;
        ``use_deterministic_algorithm=True`` writes dQ directly (cuDNN's deterministic form)."""
        from . import _sdpa

        return _sdpa.backward(self, q, k, v, o, dO, stats, attn_scale, use_causal_mask,
                              seq_len_q, seq_len_kv, dropout, name or "sdpa_backward",
                              deterministic=use_deterministic_algorithm)  # fmt: skip

    # -- freeze, plan, execute ------------------------------------------------------------------
    def set_io_order(self, *tensors: Tensor) -> Graph:
        """Put these real tensors first, in this order, in the pointer order of ``plan.run``
        (for callers that run :attr:`plan` themselves; :meth:`execute` does not need it)."""
        for i, t in enumerate(tensors):
            self._check("set_io_order", f"tensors[{i}]", t)
        self._order = tuple(tensors)
        return self

    def validate(self) -> Graph:
        """Check what Python can before cuDNN sees the graph: every real tensor has a data
        type, outputs exist, uids are unique. Returns the graph."""
        self._freeze_tensors()
        return self

    def _freeze_tensors(self) -> tuple[tuple[TensorSpec, ...], tuple[int, ...]]:
        if not self._nodes:
            raise ValueError(f"{self.name}: the graph has no operations")
        if not any(not t._virtual and t._producer for t in self._tensors):
            raise ValueError(f"{self.name}: no operation output is marked set_output(True)")
        used: set[int] = {t._uid for t in self._tensors if t._uid is not None}
        if len(used) != sum(t._uid is not None for t in self._tensors):
            raise ValueError(f"{self.name}: two tensors were given the same uid")
        nxt = 1
        specs = []
        for t in self._tensors:
            if t._uid is None:
                while nxt in used:
                    nxt += 1
                used.add(nxt)
                uid = nxt
            else:
                uid = t._uid
            dt = t._dtype
            if dt is None:
                dt = self.intermediate_data_type if t._virtual else self.io_data_type
                if dt is None:
                    raise ValueError(
                        f"{self.name}: tensor {t._name!r} has no data type: call "
                        "set_data_type(...) or give the Graph an io_data_type"
                    )
            dim, stride = _ddim(t), _dstride(t)
            specs.append((t, TensorSpec(uid, dim, stride, int(dt), t._virtual,
                                        t._by_value, t._alignment, t._scratch)))  # fmt: skip
        # a call's pointer order: real data tensors as declared, then the by-value
        # constants, then the scratch tensors
        used = {id(t) for _k, _n, _s, roles in self._nodes for _r, t in roles}
        real = [(t, s) for t, s in specs if not s.is_virtual and not s.is_by_value
                and not s.scratch and id(t) in used]  # fmt: skip
        if self._order:
            rank = {id(t): i for i, t in enumerate(self._order)}
            real.sort(key=lambda ts: rank.get(id(ts[0]), len(rank) + ts[0]._index))
        real = [s for _t, s in real]
        byv = [s for t, s in specs if s.is_by_value and id(t) in used]
        scr = [s for t, s in specs if s.scratch]
        return tuple(s for _t, s in specs), tuple(s.uid for s in (*real, *byv, *scr))

    def key(self, *, device: int | None = None, policy: str = "heuristics",
            heur_mode: Any = ("a", "fallback"), deterministic: bool | None = None,
            allow_tf32: bool | None = None, workspace_limit: int | None = None,
            deny_numerical_notes: Sequence[Any] = (), deny_behavior_notes: Sequence[Any] = ()
            ) -> GraphKey:  # fmt: skip
        """The frozen graph with its search policy (what :meth:`build` plans and caches)."""
        tensors, uids = self._freeze_tensors()
        flags = _config.config.snapshot()
        if policy not in ("heuristics", "autotune"):
            raise ValueError(f"{self.name}: policy={policy!r} is not 'heuristics' or 'autotune'")
        modes = (heur_mode,) if isinstance(heur_mode, str) else tuple(heur_mode)
        try:
            hm = tuple(_HEUR[m.lower()] if isinstance(m, str) else BackendHeurMode(m)
                       for m in modes)  # fmt: skip
        except (KeyError, ValueError, AttributeError):
            raise ValueError(f"{self.name}: heur_mode={heur_mode!r}: expected names from "
                             f"{tuple(_HEUR)}") from None  # fmt: skip
        if not hm:
            raise ValueError(f"{self.name}: heur_mode is empty")
        from ..descriptors._validate import coerce_enum

        deny_n = frozenset(int(coerce_enum(n, BackendNumericalNote, "deny_numerical_notes"))
                           for n in deny_numerical_notes)  # fmt: skip
        deny_b = frozenset(int(coerce_enum(n, BackendBehaviorNote, "deny_behavior_notes"))
                           for n in deny_behavior_notes)  # fmt: skip
        wl = flags.workspace_limit if workspace_limit is None else workspace_limit
        if wl is not None and (isinstance(wl, bool) or not isinstance(wl, int) or wl < 0):
            raise ValueError(f"{self.name}: workspace_limit must be None or an int >= 0, "
                             f"got {wl!r}")  # fmt: skip
        real_types = [t.data_type for t in tensors if not t.is_virtual and not t.is_by_value
                      and not t.scratch and t.data_type in _FLOATS]  # fmt: skip
        main = self.io_data_type or (real_types[0] if real_types else DataType.FLOAT)
        nodes = tuple(NodeSpec(kind, tuple(sorted(s.items())),
                               tuple((role, tensors[t._index].uid) for role, t in roles))
                      for kind, _name, s, roles in self._nodes)  # fmt: skip
        return GraphKey(
            tensors, nodes, uids,
            names=(tuple(t._name for t in self._tensors), tuple(n[1] for n in self._nodes)),
            dtype=int(main),
            device=_cuda.current_device() if device is None else int(device),
            cudnn_version=cudnn_version(),
            allow_tf32=flags.allow_tf32 if allow_tf32 is None else bool(allow_tf32),
            deterministic=flags.deterministic if deterministic is None else bool(deterministic),
            workspace_limit=-1 if wl is None else wl,
            algo="time" if policy == "autotune" else "guess",
            heur_modes=hm, deny_numerical=deny_n, deny_behavior=deny_b,
            label=self._label, api=self._api,
        )  # fmt: skip

    def build(
        self,
        heur_mode: Any = ("a", "fallback"),
        *,
        policy: str = "heuristics",
        deterministic: bool | None = None,
        allow_tf32: bool | None = None,
        workspace_limit: int | None = None,
        deny_numerical_notes: Sequence[Any] = (),
        deny_behavior_notes: Sequence[Any] = (),
        device: int | None = None,
    ) -> Graph:
        """Freeze the graph and find its execution plan (cached per thread by structure).

        Parameters
        ----------
        heur_mode : str or sequence of str
            cuDNN heuristics modes tried in order: ``'a'``, ``'b'``, ``'instant'``,
            ``'fallback'``.
        policy : {'heuristics', 'autotune'}
            The first engine that builds, or the fastest of those that build (timed on
            zero-filled scratch buffers).
        deterministic, allow_tf32, workspace_limit
            Engine filters; default ``pycudnn.config``'s.
        deny_numerical_notes, deny_behavior_notes
            Engines with any of these notes (``BackendNumericalNote`` /
            ``BackendBehaviorNote`` members or names, e.g. ``"RUNTIME_COMPILATION"``) are
            skipped.
        device : int, optional
            Default the current device.

        Raises
        ------
        NotSupportedError
            No engine runs the graph here; the message lists every engine tried and why.
        CudnnError
            cuDNN refused a node: the message names the node, its kind and the attribute.
        """
        key = self.key(device=device, policy=policy, heur_mode=heur_mode,
                       deterministic=deterministic, allow_tf32=allow_tf32,
                       workspace_limit=workspace_limit,
                       deny_numerical_notes=deny_numerical_notes,
                       deny_behavior_notes=deny_behavior_notes)  # fmt: skip
        h = _handle.get_handle(key.device)
        with _cuda.DeviceContext(key.device):
            self._plan = plan_for(key, h, _scratch_timing(key, h) if key.algo == "time" else None)
        self._key, self._handle = key, h
        return self

    def check_support(self, **build_kw: Any) -> Graph:
        """:meth:`build` if not built yet (cuDNN's support check *is* finding an engine)."""
        if self._plan is None:
            self.build(**build_kw)
        return self

    @property
    def plan(self) -> Any:
        """The execution plan (:class:`pycudnn.graph._plans.GraphPlan`) after :meth:`build`."""
        if self._plan is None:
            raise RuntimeError(f"{self.name}: call build() first")
        return self._plan

    def describe(self) -> str:
        """The engine chosen and its workspace, e.g. ``engine 10 (workspace 0 B)``."""
        return self.plan.describe()

    def get_workspace_size(self) -> int:
        """Bytes of workspace :meth:`execute` needs (the engine's and the scratch tensors')."""
        return workspace_layout(self.plan.workspace, self._key.scratch)[0]

    def execute(self, variant_pack: Mapping[Any, Any], workspace: Any = None, *,
                stream: Any = None) -> None:  # fmt: skip
        """Run the plan on device arrays.

        Parameters
        ----------
        variant_pack : mapping
            Tensor (or its name, or its uid) -> device array, for every real input and output;
            by-value tensors (not :meth:`scalar` constants) -> a Python number.
        workspace : device array, optional
            At least :meth:`get_workspace_size` bytes; default the handle's workspace.
        stream : optional
            A CUDA stream (torch/CuPy/cuda.core stream or handle); default the handle's.

        Raises
        ------
        KeyError
            A real tensor has no array in *variant_pack* (the message names it).
        ValueError, TypeError
            An array's shape, strides, dtype or device differs from its tensor's.
        """
        plan, key = self.plan, self._key
        by_uid = {spec.uid: (t, spec) for t, spec in zip(self._tensors, key.tensors, strict=True)}
        pack: dict[int, Any] = {}
        for k, v in variant_pack.items():
            t = self._lookup(k)
            pack[by_uid[_uid_of(t, key)][1].uid] = v
        ptrs: list[int] = []
        keep: list[Any] = []
        device = key.device
        for uid in key.uids:
            t, spec = by_uid[uid]
            if spec.scratch:
                ptrs.append(0)  # filled from the workspace below
                continue
            if spec.is_by_value:
                if t._value is not None:
                    ptrs.append(ctypes.addressof(t._value))
                    continue
                if uid not in pack:
                    raise KeyError(f"{self.name}: no value for the by-value tensor {t._name!r}")
                c = _host_scalar(pack[uid], DataType(spec.data_type), t._name)
                keep.append(c)
                ptrs.append(ctypes.addressof(c))
                continue
            if uid not in pack:
                raise KeyError(f"{self.name}: no array for tensor {t._name!r} (uid {uid}) in "
                               "variant_pack")  # fmt: skip
            ptrs.append(_check_array(self.name, t, pack[uid], spec, device))
        h = self._handle
        with _cuda.DeviceContext(device):
            if stream is not None:
                h.set_stream(stream)
            total, offsets = workspace_layout(plan.workspace, key.scratch)
            if workspace is None:
                wsp = h.workspace(total)[0] if total else 0
            else:
                wa = memory.asarray(workspace, check=False)
                if wa.nbytes < total:
                    raise ValueError(f"{self.name}: workspace has {wa.nbytes} B, the plan needs "
                                     f"{total} B (get_workspace_size())")  # fmt: skip
                wsp = wa.ptr
            fill_scratch(key, ptrs, wsp, offsets, h.stream)
            plan.run(*ptrs, wsp if plan.workspace else 0)

    def constant_pointers(self) -> tuple[int, ...]:
        """Host addresses of the :meth:`scalar` constants, in a call's pointer order (after the
        real tensors); for callers that run :attr:`plan` themselves."""
        key = self._key if self._key is not None else self.key(device=0)
        by_uid = {spec.uid: t for t, spec in zip(self._tensors, key.tensors, strict=True)}
        out = []
        for uid in key.uids:
            t = by_uid[uid]
            if t._by_value:
                if t._value is None:
                    raise ValueError(f"{self.name}: by-value tensor {t._name!r} has no constant")
                out.append(ctypes.addressof(t._value))
        return tuple(out)

    def _lookup(self, k: Any) -> Tensor:
        if isinstance(k, Tensor):
            if k._graph is not self:
                raise ValueError(f"{self.name}: tensor {k._name!r} belongs to another graph")
            return k
        if isinstance(k, str):
            found = [t for t in self._tensors if t._name == k]
            if len(found) != 1:
                raise KeyError(f"{self.name}: {'no' if not found else 'more than one'} tensor "
                               f"named {k!r}")  # fmt: skip
            return found[0]
        if isinstance(k, int) and not isinstance(k, bool):
            for t, spec in zip(self._tensors, self._key.tensors, strict=True):
                if spec.uid == k:
                    return t
            raise KeyError(f"{self.name}: no tensor with uid {k}")
        raise TypeError(f"{self.name}: variant_pack keys are Tensors, names or uids; got {k!r}")

    # -- saving plans ----------------------------------------------------------------------------
    def to_json(self) -> str:
        """The graph's structure (tensors, nodes, data types) as JSON: no GPU needed."""
        tensors, _uids = self._freeze_tensors()
        return json.dumps({
            "format": "pycudnn.graph/1",
            "name": self.name,
            "tensors": [dict(spec._asdict(), name=t._name)
                        for t, spec in zip(self._tensors, tensors, strict=True)],
            "nodes": [{"kind": kind, "name": name, "settings": s,
                       "tensors": [[role, tensors[t._index].uid] for role, t in roles]}
                      for kind, name, s, roles in self._nodes],
        }, sort_keys=True)  # fmt: skip

    def serialize(self) -> str:
        """The built plan as JSON (cuDNN's plan representation and this graph's structure), for
        :meth:`deserialize` in a later process: an autotuned choice survives a restart."""
        plan = self.plan
        text = plan.plan.get(A.EXECUTION_PLAN_JSON_REPRESENTATION, T.CHAR)[0]
        return json.dumps({"graph": json.loads(self.to_json()), "plan": text,
                           "cudnn_version": self._key.cudnn_version,
                           "engine": plan.engine.index})  # fmt: skip

    def deserialize(self, data: str, *, device: int | None = None) -> Graph:
        """Load a plan saved by :meth:`serialize` for this same graph (no engine search).

        Raises
        ------
        ValueError
            *data* was saved for another graph structure or another cuDNN version.
        """
        saved = json.loads(data)
        if _unnamed(saved.get("graph")) != _unnamed(json.loads(self.to_json())):
            raise ValueError(f"{self.name}: the saved plan is for another graph structure")
        if saved.get("cudnn_version") != cudnn_version():
            raise ValueError(
                f"{self.name}: the plan was saved with cuDNN "
                f"{saved.get('cudnn_version')}, this is {cudnn_version()}"
            )
        key = self.key(device=device)
        h = _handle.get_handle(key.device)
        with _cuda.DeviceContext(key.device):
            gp = load_plan(saved["plan"], h, key.uids, engine=int(saved.get("engine", -1)))
        _plans.remember(key, gp)
        self._key, self._handle, self._plan = key, h, gp
        return self


# -- helpers shared with the high-level layer ----------------------------------------------
def plan_for(key: Any, h: Any, timing: Callable[[list], list[float]] | None = None) -> Any:
    """The cached plan of *key* in this thread, or a new one (searched on handle *h*)."""
    plan = _plans.cached_plan(key)
    if plan is not None:
        _plans.stats.hits += 1
        return plan
    _plans.stats.misses += 1

    def ws(nbytes: int) -> int:
        return h.workspace(nbytes)[0]

    return _plans.get_plan(key, lambda: _plans.search_graph_plan(key, h, ws, timing))


def _scratch_timing(key: GraphKey, h: Any) -> Callable[[list], list[float]]:
    """Time candidate plans on zero-filled buffers for every real tensor (zero lengths keep a
    variable-length graph in bounds)."""

    def timing(plans: list) -> list[float]:
        keep = []
        ptrs = []
        consts = []
        for uid in key.uids:
            spec = next(t for t in key.tensors if t.uid == uid)
            if spec.is_by_value:
                c = _host_scalar(1.0 if spec.data_type in _FLOATS else 0, DataType(spec.data_type))
                consts.append(c)
                ptrs.append(ctypes.addressof(c))
                continue
            n = max(_layout.span(spec.dim, spec.stride), 1) * itemsize(DataType(spec.data_type))
            buf = memory.zeros((n,), "uint8", key.device, h.stream)
            keep.append(buf)
            ptrs.append(buf.ptr)

        def run(gp: Any) -> None:
            total, offsets = workspace_layout(gp.workspace, key.scratch)
            wsp = h.workspace(total)[0] if total else 0
            fill_scratch(key, ptrs, wsp, offsets, h.stream)
            gp.run(*ptrs, wsp if gp.workspace else 0)

        try:
            return _plans.time_plans(plans, run, h.stream)
        finally:
            for gp in plans:
                gp.close()
            del keep, consts

    return timing


def workspace_layout(engine_ws: int, scratch: Sequence[TensorSpec]) -> tuple[int, list[int]]:
    """``(total bytes, offset of each scratch tensor)``: the engine's workspace first, each
    scratch tensor after it at a 256-byte boundary."""
    off = -(-engine_ws // _SCRATCH_ALIGN) * _SCRATCH_ALIGN
    offsets = []
    for s in scratch:
        offsets.append(off)
        n = _layout.span(s.dim, s.stride) * itemsize(DataType(s.data_type))
        off += -(-n // _SCRATCH_ALIGN) * _SCRATCH_ALIGN
    return (off if scratch else engine_ws), offsets


def fill_scratch(key: GraphKey, ptrs: list[int], wsp: int, offsets: list[int], stream: int
                 ) -> None:  # fmt: skip
    """Point the scratch slots of *ptrs* (the last ones) into the workspace; zero those that
    must start at zero (stream-ordered)."""
    scratch = key.scratch
    if not scratch:
        return
    n = len(ptrs) - len(scratch)
    rt = None
    for i, (s, off) in enumerate(zip(scratch, offsets, strict=True)):
        ptrs[n + i] = wsp + off
        if s.scratch == "zero":
            rt = rt or _cuda.runtime()
            nbytes = _layout.span(s.dim, s.stride) * itemsize(DataType(s.data_type))
            _cuda.check(rt.cudaMemsetAsync(wsp + off, 0, nbytes, stream), "cudaMemsetAsync")


def load_plan(text: str, h: Any, uids: Sequence[int], *, engine: int = -1) -> Any:
    """A :class:`~pycudnn.graph._plans.GraphPlan` from cuDNN's JSON plan representation."""
    plan = BackendDescriptor(BackendDescriptorType.EXECUTION_PLAN_DESCRIPTOR)
    plan.set(A.EXECUTION_PLAN_HANDLE, T.HANDLE, h)
    plan.set(A.EXECUTION_PLAN_JSON_REPRESENTATION, T.CHAR, text)
    plan.finalize()
    ws = int(plan.get(A.EXECUTION_PLAN_WORKSPACE_SIZE, T.INT64, 1)[0])
    info = _plans.EngineInfo(engine, frozenset(), frozenset(), ws)
    return _plans.GraphPlan(plan, None, h, info, ws, uids, "loaded from JSON")


def _unnamed(graph: Any) -> Any:
    """A :meth:`Graph.to_json` structure without its names (they only label messages)."""
    if not isinstance(graph, dict):
        return graph
    return {
        "tensors": [{k: v for k, v in t.items() if k != "name"} for t in graph.get("tensors", [])],
        "nodes": [{k: v for k, v in n.items() if k != "name"} for n in graph.get("nodes", [])],
    }


def alignment_of(ptr: int) -> int:
    """The byte alignment (16 at most) a tensor may declare for an address."""
    a = 16
    while a > 1 and ptr % a:
        a //= 2
    return a


def _ddim(t: Tensor) -> tuple[int, ...]:
    """The dims cuDNN sees (the last two swapped for a transposed view)."""
    d = t._dim
    return (*d[:-2], d[-1], d[-2]) if t._swap_last else d


def _dstride(t: Tensor) -> tuple[int, ...]:
    s = t._stride
    return (*s[:-2], s[-1], s[-2]) if t._swap_last else s


def _uid_of(t: Tensor, key: GraphKey) -> int:
    return key.tensors[t._index].uid


def _check_array(graph: str, t: Tensor, obj: Any, spec: TensorSpec, device: int) -> int:
    """The array's address after checking it against tensor *t* (its own dims and strides,
    not the transposed view cuDNN may be given)."""
    name = t._name
    try:
        a = memory.asarray(obj, check=False)
    except Exception as exc:
        raise TypeError(f"{graph}: tensor {name!r} needs a device array: {exc}") from None
    try:
        dt = as_data_type(a.dtype)
    except TypeError:
        dt = None
    if dt != spec.data_type:
        raise TypeError(f"{graph}: tensor {name!r} is {dtype_name(DataType(spec.data_type))}, "
                        f"the array {a.dtype}")  # fmt: skip
    shape = tuple(a.shape) or (1,)
    if shape != t._dim:
        raise ValueError(f"{graph}: tensor {name!r} has dims {t._dim}, the array {shape}")
    isz = a.dtype.itemsize
    strides = tuple(s // isz for s in a.strides) or (1,)
    if not _layout.matches(shape, strides, t._stride):
        raise ValueError(f"{graph}: tensor {name!r} has strides {t._stride}, the array "
                         f"{strides} (elements)")  # fmt: skip
    if a.device != device:
        raise ValueError(f"{graph}: tensor {name!r}'s array is on device {a.device}, the graph "
                         f"was built for device {device}")  # fmt: skip
    if a.ptr % spec.alignment:
        raise ValueError(f"{graph}: tensor {name!r}'s address 0x{a.ptr:x} is not aligned to "
                         f"{spec.alignment} B as declared")  # fmt: skip
    return a.ptr


def _host_scalar(value: Any, dt: DataType, name: str = "scalar") -> ctypes._SimpleCData:
    ct = {DataType.FLOAT: ctypes.c_float, DataType.DOUBLE: ctypes.c_double,
          DataType.INT32: ctypes.c_int32, DataType.INT64: ctypes.c_int64,
          DataType.HALF: ctypes.c_uint16, DataType.BFLOAT16: ctypes.c_uint16}.get(dt)  # fmt: skip
    if ct is None:
        raise TypeError(f"by-value tensor {name!r}: data type {dtype_name(dt)} is not supported "
                        "for scalars")  # fmt: skip
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"by-value tensor {name!r} needs a real number, got {value!r}")
    if dt in (DataType.HALF, DataType.BFLOAT16):
        import numpy as np

        if dt == DataType.HALF:
            return ct(int(np.array(value, np.float16).view(np.uint16)))
        bits = int(np.array(value, np.float32).view(np.uint32))
        return ct((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16)  # round to nearest even
    if ct in (ctypes.c_int32, ctypes.c_int64):
        if value != int(value):
            raise ValueError(f"by-value tensor {name!r} is an integer, got {value!r}")
        return ct(int(value))
    return ct(float(value))


_cached_version: int | None = None


def cudnn_version() -> int:
    """The loaded cuDNN's version (cached)."""
    global _cached_version
    if _cached_version is None:
        _cached_version = int(errors.checked("cudnnGetVersion", warn=False)())
    return _cached_version


def _phase(value: Any, where: str) -> BackendNormFwdPhase:
    if isinstance(value, BackendNormFwdPhase):
        return value
    if isinstance(value, str) and value.upper() in ("TRAINING", "INFERENCE"):
        return BackendNormFwdPhase[value.upper()]
    raise ValueError(f"{where}: norm_forward_phase={value!r} is not 'training' or 'inference'")


_PW_PARAM_NAMES = ("relu_lower_clip", "relu_upper_clip", "relu_lower_clip_slope", "elu_alpha",
                   "softplus_beta", "swish_beta", "axis")  # fmt: skip
_BINARY = {PointwiseMode.ADD, PointwiseMode.ADD_SQUARE, PointwiseMode.DIV, PointwiseMode.MAX,
           PointwiseMode.MIN, PointwiseMode.MOD, PointwiseMode.MUL, PointwiseMode.POW,
           PointwiseMode.SUB, PointwiseMode.ATAN2, PointwiseMode.FLOOR_MOD,
           PointwiseMode.CMP_EQ, PointwiseMode.CMP_NEQ, PointwiseMode.CMP_GT,
           PointwiseMode.CMP_GE, PointwiseMode.CMP_LT, PointwiseMode.CMP_LE,
           PointwiseMode.LOGICAL_AND, PointwiseMode.LOGICAL_OR}  # fmt: skip
_BOOL_OUT = {
    PointwiseMode.CMP_EQ,
    PointwiseMode.CMP_NEQ,
    PointwiseMode.CMP_GT,
    PointwiseMode.CMP_GE,
    PointwiseMode.CMP_LT,
    PointwiseMode.CMP_LE,
    PointwiseMode.LOGICAL_AND,
    PointwiseMode.LOGICAL_OR,
    PointwiseMode.LOGICAL_NOT,
}


def _arity(m: PointwiseMode) -> int:
    if m == PointwiseMode.BINARY_SELECT:
        return 3
    if m in _BINARY or 200 <= m < 300:
        return 2
    return 1


def _named(mode: PointwiseMode, doc: str) -> Callable[..., Tensor]:
    arity = _arity(mode)

    if arity == 1:

        def op(self: Graph, input: Tensor, *, compute_data_type: Any = None,
               name: str | None = None, **params: float) -> Tensor:  # fmt: skip
            return self._pointwise(mode, input, None, None, compute_data_type, 1.0, 1.0, name,
                                   params)  # fmt: skip
    elif arity == 2:

        def op(self: Graph, a: Tensor, b: Tensor, *, compute_data_type: Any = None,  # type: ignore[misc]
               alpha1: float = 1.0, alpha2: float = 1.0, name: str | None = None,
               **params: float) -> Tensor:  # fmt: skip
            return self._pointwise(mode, a, b, None, compute_data_type, alpha1, alpha2, name,
                                   params)  # fmt: skip
    else:

        def op(self: Graph, input0: Tensor, input1: Tensor, mask: Tensor, *,  # type: ignore[misc]
               compute_data_type: Any = None, name: str | None = None) -> Tensor:  # fmt: skip
            return self._pointwise(mode, input0, input1, mask, compute_data_type, 1.0, 1.0,
                                   name, {})  # fmt: skip

    op.__doc__ = doc
    return op


#: pygraph's pointwise names -> mode
POINTWISE_NAMES: dict[str, PointwiseMode] = {
    "add": PointwiseMode.ADD, "add_square": PointwiseMode.ADD_SQUARE, "div": PointwiseMode.DIV,
    "max": PointwiseMode.MAX, "min": PointwiseMode.MIN, "mod": PointwiseMode.MOD,
    "mul": PointwiseMode.MUL, "pow": PointwiseMode.POW, "sub": PointwiseMode.SUB,
    "abs": PointwiseMode.ABS, "ceil": PointwiseMode.CEIL, "cos": PointwiseMode.COS,
    "exp": PointwiseMode.EXP, "floor": PointwiseMode.FLOOR, "log": PointwiseMode.LOG,
    "neg": PointwiseMode.NEG, "rsqrt": PointwiseMode.RSQRT, "sin": PointwiseMode.SIN,
    "sqrt": PointwiseMode.SQRT, "tan": PointwiseMode.TAN, "erf": PointwiseMode.ERF,
    "identity": PointwiseMode.IDENTITY, "reciprocal": PointwiseMode.RECIPROCAL,
    "relu": PointwiseMode.RELU_FWD, "tanh": PointwiseMode.TANH_FWD,
    "sigmoid": PointwiseMode.SIGMOID_FWD, "elu": PointwiseMode.ELU_FWD,
    "gelu": PointwiseMode.GELU_FWD, "softplus": PointwiseMode.SOFTPLUS_FWD,
    "swish": PointwiseMode.SWISH_FWD, "gelu_approx_tanh": PointwiseMode.GELU_APPROX_TANH_FWD,
    "relu_backward": PointwiseMode.RELU_BWD, "tanh_backward": PointwiseMode.TANH_BWD,
    "sigmoid_backward": PointwiseMode.SIGMOID_BWD, "elu_backward": PointwiseMode.ELU_BWD,
    "gelu_backward": PointwiseMode.GELU_BWD, "softplus_backward": PointwiseMode.SOFTPLUS_BWD,
    "swish_backward": PointwiseMode.SWISH_BWD,
    "gelu_approx_tanh_backward": PointwiseMode.GELU_APPROX_TANH_BWD,
    "cmp_eq": PointwiseMode.CMP_EQ, "cmp_neq": PointwiseMode.CMP_NEQ,
    "cmp_gt": PointwiseMode.CMP_GT, "cmp_ge": PointwiseMode.CMP_GE,
    "cmp_lt": PointwiseMode.CMP_LT, "cmp_le": PointwiseMode.CMP_LE,
    "logical_and": PointwiseMode.LOGICAL_AND, "logical_or": PointwiseMode.LOGICAL_OR,
    "logical_not": PointwiseMode.LOGICAL_NOT, "gen_index": PointwiseMode.GEN_INDEX,
    "binary_select": PointwiseMode.BINARY_SELECT,
}  # fmt: skip
for _n, _m in POINTWISE_NAMES.items():
    _kind = "backward (loss, input) -> dx" if 200 <= _m < 300 else f"{_arity(_m)}-input"
    setattr(Graph, _n, _named(_m, f"Pointwise ``{_m.name}`` ({_kind}); see :meth:`pointwise`."))
# cudnn-frontend's spellings of two common ones
Graph.bias = Graph.add  # type: ignore[attr-defined]
Graph.scale = Graph.mul  # type: ignore[attr-defined]
