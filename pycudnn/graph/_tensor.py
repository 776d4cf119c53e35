"""A builder graph's tensors: :class:`Tensor`, and :class:`GraphBase`, the record of tensors and
nodes that every node family (:mod:`.nodes`) adds to through its node protocol.

The bottom of the builder: the node families build on this module, and
:class:`~pycudnn.graph._builder.Graph` (the public face) builds on both.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import numbers
import sys
from collections.abc import Iterator, Sequence
from typing import Any, Literal, overload

from .. import _layout, memory
from .._config import parse_bool
from .._types import as_data_type, dtype_name
from ..enums import DataType

__all__ = [
    "NODE_PROTOCOL",
    "GraphBase",
    "Tensor",
    "alignment_of",
    "as_dims",
    "as_dtype",
    "check_array",
    "check_extent",
    "check_ragged",
    "check_type",
    "described_dim",
    "described_stride",
    "finite",
    "host_scalar",
    "like_layout",
    "like_strides",
    "own_or_io_type",
    "resolved_type",
]


def as_dtype(value: Any, argument: str, allow_none: bool = False) -> DataType | None:
    """*value* as a ``DataType`` (any dtype-like); errors name *argument*."""
    if value is None and allow_none:
        return None
    if isinstance(value, DataType):
        return value
    try:
        return as_data_type(value, argument=argument)
    except TypeError as exc:
        text = str(exc)  # named already, or prefixed here
        raise TypeError(text if text.startswith(argument) else f"{argument}: {text}") from None


def as_dims(value: Any, argument: str, lo: int = 1) -> tuple[int, ...]:
    """*value* as 1 to 8 ints, each at least *lo*; errors name *argument*."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"{argument} must be a sequence of ints, got {value!r}")
    out = []
    for v in value:
        if isinstance(v, bool) or not hasattr(v, "__index__"):
            raise TypeError(f"{argument} must contain ints, got {value!r}")
        v = v.__index__()
        if v < lo:
            raise ValueError(f"{argument} must contain ints >= {lo}, got {tuple(value)!r}")
        if v > _layout.INT64_MAX:
            raise ValueError(
                f"{argument} must contain ints <= 2**63 - 1 (cuDNN's int64), got {tuple(value)!r}"
            )
        out.append(v)
    if not out or len(out) > 8:
        raise ValueError(f"{argument} must have 1 to 8 values, got {tuple(value)!r}")
    return tuple(out)


def finite(value: Any, argument: str, *, allow_inf: bool = False) -> float:
    """*value* as a finite float (``allow_inf``: or an infinity, never NaN); errors name
    *argument* (``graph.op: name``) and the value."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{argument} must be a real number, got {value!r}")
    try:
        v = float(value)
    except (OverflowError, ValueError):
        raise ValueError(f"{argument}={value!r} does not fit in a float") from None
    if v != v or (not allow_inf and v in (math.inf, -math.inf)):
        what = "a real number, not NaN" if allow_inf else "a finite number"
        raise ValueError(f"{argument} must be {what}, got {value!r}")
    return v


def check_extent(
    argument: str, dim: tuple[int, ...], stride: tuple[int, ...], dtype: DataType | None = None
) -> None:
    """The elements and the span of (*dim*, *stride*) fit cuDNN's int64, and so does the span in
    bytes when the data type is known (a stride of 2**62 float16 elements addresses no memory)."""
    span = _layout.span(dim, stride)
    if math.prod(dim) > _layout.INT64_MAX or span > _layout.INT64_MAX:
        raise ValueError(
            f"{argument}: dims {dim} with strides {stride} hold more elements (or span more) "
            "than cuDNN's int64 counts (2**63 - 1)"
        )
    size = _ITEMSIZE.get(dtype, 1) if dtype is not None else 1
    if span * size > _layout.INT64_MAX:
        raise ValueError(
            f"{argument}: dims {dim} with strides {stride} span {span} {dtype_name(dtype)} "
            f"elements, {span * size} bytes: more than a 64-bit address space holds "
            "(2**63 - 1 bytes)"
        )


#: bytes per element of the types a tensor may have (others: 1, a lower bound)
_ITEMSIZE = {
    DataType.FLOAT: 4,
    DataType.DOUBLE: 8,
    DataType.HALF: 2,
    DataType.BFLOAT16: 2,
    DataType.INT32: 4,
    DataType.INT64: 8,
    DataType.INT8: 1,
    DataType.UINT8: 1,
    DataType.BOOLEAN: 1,
}


def like_layout(argument: str, a: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The dims and element strides of the device array *a* under :meth:`Graph.tensor`'s
    rules (1 to 8 dims, each at least 1), its strides as they are: a byte stride that is not
    a whole number of elements, or a zero or negative stride over more than one element, is
    refused (a size-1 dim's stride is never read: it is described as 1)."""
    shape = tuple(a.shape) or (1,)
    isz = a.dtype.itemsize
    dim = as_dims(shape, f"{argument}: the array's shape")
    byte_strides = tuple(a.strides) or (isz,)
    stride = []
    for i, (d, s) in enumerate(zip(dim, byte_strides, strict=True)):
        if d == 1:
            stride.append(1)
            continue
        if s % isz or s <= 0:
            what = "not a whole number of elements" if s % isz else "zero or negative"
            raise ValueError(
                f"{argument}: the array's stride {s} B in dim {i} is {what} (strides "
                f"{byte_strides} B, {isz} B elements); cuDNN cannot describe it"
            )
        stride.append(s // isz)
    return dim, tuple(stride)


def like_strides(
    dim: Sequence[int], ref_dim: Sequence[int], ref_stride: Sequence[int]
) -> tuple[int, ...]:
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


def alignment_of(ptr: int) -> int:
    """The byte alignment (16 at most) a tensor may declare for an address."""
    a = 16
    while a > 1 and ptr % a:
        a //= 2
    return a


_SCALAR_CTYPES = {
    DataType.FLOAT: ctypes.c_float,
    DataType.DOUBLE: ctypes.c_double,
    DataType.INT32: ctypes.c_int32,
    DataType.INT64: ctypes.c_int64,
    DataType.HALF: ctypes.c_uint16,
    DataType.BFLOAT16: ctypes.c_uint16,
}


#: the largest finite value of each floating data type a by-value scalar may have
_FLOAT_MAX = {
    DataType.HALF: 65504.0,
    DataType.BFLOAT16: 3.3895313892515355e38,
    DataType.FLOAT: 3.4028234663852886e38,
    DataType.DOUBLE: sys.float_info.max,
}


def _fits_float(value: Any, dt: DataType, name: str) -> float:
    """*value* as a float that *dt* holds: a finite value that would round to an infinity
    (``1e300`` as float16) is refused; explicit infinities and NaN are kept."""
    try:
        v = float(value)
    except OverflowError:
        v = math.inf
    else:
        if not math.isfinite(v):
            return v
    if abs(v) > _FLOAT_MAX[dt]:
        raise OverflowError(
            f"by-value tensor {name!r}: {value!r} does not fit in {dtype_name(dt)} (its largest "
            f"finite value is {_FLOAT_MAX[dt]:g})"
        )
    return v


def host_scalar(value: Any, dt: DataType, name: str = "scalar") -> ctypes._SimpleCData[Any]:
    """*value* as the host scalar a by-value tensor of type *dt* passes (half and bfloat16 as
    their bits)."""
    ct = _SCALAR_CTYPES.get(dt)
    if ct is None:
        raise TypeError(
            f"by-value tensor {name!r}: data type {dtype_name(dt)} is not supported for scalars"
        )
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"by-value tensor {name!r} needs a real number, got {value!r}")
    if dt in (DataType.HALF, DataType.BFLOAT16):
        import numpy as np

        value = _fits_float(value, dt, name)
        if dt == DataType.HALF:
            return ct(int(np.array(value, np.float16).view(np.uint16)))
        bits = int(np.array(value, np.float32).view(np.uint32))
        return ct((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16)  # round to nearest even
    if ct in (ctypes.c_int32, ctypes.c_int64):
        if (isinstance(value, float) and not math.isfinite(value)) or value != int(value):
            raise ValueError(f"by-value tensor {name!r} is an integer, got {value!r}")
        bits = 8 * ctypes.sizeof(ct)
        if not -(2 ** (bits - 1)) <= int(value) < 2 ** (bits - 1):
            raise OverflowError(
                f"by-value tensor {name!r}: {value!r} does not fit in {dtype_name(dt)}"
            )
        return ct(int(value))
    return ct(_fits_float(value, dt, name))


class Tensor:
    """A tensor of a :class:`~pycudnn.graph.Graph`: an input declared with
    :meth:`~pycudnn.graph.Graph.tensor`, or an operation's output (virtual until
    :meth:`set_output`).

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
        "_ragged",
        "_scratch",
        "_stride",
        "_uid",
        "_value",
        "_virtual",
    )

    def __init__(
        self,
        graph: GraphBase,
        index: int,
        name: str,
        layout: tuple[tuple[int, ...], tuple[int, ...], DataType | None],
        virtual: bool,
        by_value: bool = False,
        producer: str | None = None,
    ) -> None:
        self._graph = graph
        self._index = index
        self._name = name
        self._dim, self._stride, self._dtype = layout
        self._virtual, self._by_value = virtual, by_value
        self._value: ctypes._SimpleCData[Any] | None = None
        self._uid: int | None = None
        self._alignment = 16
        self._producer = producer
        self._scratch: str | None = None
        self._ragged: Tensor | None = None  # cuDNN's ragged offsets (packed sequences)

    # -- pygraph-style setters -----------------------------------------------------------------
    def set_output(self, is_output: bool = True) -> Tensor:
        """Make this operation output a real (non-virtual) tensor that
        :meth:`~pycudnn.graph.Graph.execute` writes into a device array (``False``: an
        intermediate cuDNN may keep in registers)."""
        self._graph._mutable()
        is_output = parse_bool(
            is_output, f"{self._graph.name}: tensor {self._name!r}.set_output", "is_output"
        )
        if self._producer is None and not is_output:
            raise ValueError(f"tensor {self._name!r} is a graph input; it cannot be virtual")
        self._check_written(self._stride)
        self._virtual = not is_output
        return self

    def _check_written(self, stride: tuple[int, ...]) -> None:
        """An operation's real output must not address one element twice (cuDNN would write
        it from two places): strides that overlap are refused when the tensor is an output."""
        if self._producer is not None and not _layout.non_overlapping(self._dim, stride):
            raise ValueError(
                f"{self._graph.name}: output tensor {self._name!r}: strides {stride} make the "
                f"elements of dims {self._dim} overlap; an output cannot be written so"
            )

    def set_data_type(self, data_type: Any) -> Tensor:
        """Set the data type (any dtype-like: ``"bfloat16"``, a numpy/torch dtype...)."""
        self._graph._mutable()
        dt = as_dtype(data_type, f"{self._graph.name}: tensor {self._name!r}: data_type")
        check_extent(f"{self._graph.name}: tensor {self._name!r}", self._dim, self._stride, dt)
        self._dtype = dt
        return self

    def set_dim(self, dim: Sequence[int]) -> Tensor:
        """Set the dims (strides become packed row-major if the rank changes)."""
        self._graph._mutable()
        d = as_dims(dim, f"tensor {self._name!r}: dim")
        if d != self._dim and self._graph._uses(self):
            raise ValueError(
                f"{self._graph.name}: tensor {self._name!r} is used by an operation with dims "
                f"{self._dim}; set_dim({d}) would make the graph inconsistent (set the dims "
                "before the tensor is used)"
            )
        stride = self._stride if len(d) == len(self._stride) else _layout.packed_strides(d)
        check_extent(f"{self._graph.name}: tensor {self._name!r}", d, stride, resolved_type(self))
        self._stride = stride
        self._dim = d
        return self

    def set_stride(self, stride: Sequence[int]) -> Tensor:
        """Set the element strides (one per dim)."""
        self._graph._mutable()
        s = as_dims(stride, f"tensor {self._name!r}: stride")
        if len(s) != len(self._dim):
            raise ValueError(
                f"tensor {self._name!r}: stride {s} has {len(s)} values, its dim "
                f"{self._dim} has {len(self._dim)}"
            )
        check_extent(
            f"{self._graph.name}: tensor {self._name!r}", self._dim, s, resolved_type(self)
        )
        self._check_written(s)
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
            raise ValueError(
                f"tensor {self._name!r}: uid must be an int in [1, 2**62), got {uid!r}"
            )
        self._uid = uid
        return self

    def set_alignment(self, alignment: int) -> Tensor:
        """Declare the byte alignment of the arrays this tensor will be given (default 16)."""
        self._graph._mutable()
        if isinstance(alignment, bool) or alignment not in (1, 2, 4, 8, 16, 32, 64, 128, 256):
            raise ValueError(
                f"tensor {self._name!r}: alignment must be a power of two from 1 "
                f"to 256 bytes, got {alignment!r}"
            )
        self._alignment = alignment
        return self

    def set_ragged_offset(self, offset: Tensor | None) -> Tensor:
        """Give this tensor cuDNN's ragged offsets (packed variable-length sequences, the
        "THD" layout): *offset* is an int32/int64 graph input of dims ``(B + 1, 1, ..., 1)``
        holding the element offset where each batch's rows start (``cu_seqlens * token
        stride``; the batch stride is then unused). The arrays of a ragged tensor are checked
        for data type, device and alignment only: the offsets must stay inside them. None
        removes the offsets."""
        self._graph._mutable()
        if offset is not None:
            check_ragged(self, offset)
        self._ragged = offset
        return self

    # -- getters -------------------------------------------------------------------------------
    @property
    def ragged_offset(self) -> Tensor | None:
        """The ragged offset tensor (:meth:`set_ragged_offset`), or None."""
        return self._ragged

    def get_ragged_offset(self) -> Tensor | None:
        """The ragged offset tensor, or None (cudnn-frontend spelling)."""
        return self._ragged

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
        """The unique id (assigned by :meth:`~pycudnn.graph.Graph.build` unless
        :meth:`set_uid` set one)."""
        return self._uid

    def __repr__(self) -> str:
        kind = "virtual" if self._virtual else "by value" if self._by_value else "tensor"
        dt = dtype_name(self._dtype) if self._dtype is not None else "auto"
        return f"<graph {kind} {self._name!r} dim={self._dim} stride={self._stride} {dt}>"


_OFFSET_TYPES = (DataType.INT32, DataType.INT64)


def own_or_io_type(t: Tensor) -> DataType | None:
    """*t*'s own data type, else its graph's io data type (None when neither is set).

    ``DataType.FLOAT`` is 0: never write ``t.data_type or io`` (float32 would read as unset)."""
    return t._dtype if t._dtype is not None else t._graph.io_data_type


def resolved_type(t: Tensor) -> DataType | None:
    """The data type *t* is frozen with (:func:`._key.freeze`'s rule): its own, else the graph's
    intermediate type for a virtual tensor or its io type for a real one (None: neither set)."""
    if t._dtype is not None:
        return t._dtype
    g = t._graph
    return g.intermediate_data_type if t._virtual else g.io_data_type


def check_type(where: str, argument: str, t: Tensor, allowed: tuple[DataType, ...]) -> None:
    """*t* (the operation's *argument*) resolves to one of *allowed*: a tensor with no data type
    takes the graph's (float16, say), so "unset" is refused unless the graph's type is allowed."""
    dt = resolved_type(t)
    if dt in allowed:
        return
    want = " or ".join(dtype_name(a) for a in allowed)
    if t._dtype is not None:
        got = dtype_name(t._dtype)
    elif dt is not None:
        kind = "intermediate" if t._virtual else "io"
        got = f"no data type of its own (it would be the graph's {kind} type, {dtype_name(dt)})"
    else:
        got = "no data type (and the graph has no io_data_type)"
    raise TypeError(
        f"{where}: {argument} ({t._name!r}) must be {want}, got {got}; "
        f"declare it with data_type={dtype_name(allowed[0])!r} or call set_data_type"
    )


def check_ragged(t: Tensor, offset: Any) -> None:
    """*offset* may be *t*'s ragged offset tensor: an int32/int64 input of this graph, of
    dims ``(t.dim[0] + 1, 1, ..., 1)`` (checked when set and again when the graph freezes)."""
    where = f"{t._graph.name}: tensor {t._name!r}: ragged offset"
    if not isinstance(offset, Tensor):
        raise TypeError(f"{where} must be a Tensor of this graph, got {type(offset).__name__}")
    if offset._graph is not t._graph:
        raise ValueError(f"{where} ({offset._name!r}) belongs to another graph")
    if offset is t or offset._producer is not None or offset._by_value or t._by_value:
        raise ValueError(
            f"{where} ({offset._name!r}) must be another graph input of device memory (not an "
            "operation output or a by-value scalar), for a tensor that is not by value"
        )
    if offset._dtype not in _OFFSET_TYPES:
        got = "unset" if offset._dtype is None else dtype_name(offset._dtype)
        raise TypeError(f"{where} ({offset._name!r}) must be int32 or int64, got {got}")
    want = (t._dim[0] + 1,) + (1,) * (len(t._dim) - 1)
    if offset._dim != want:
        raise ValueError(
            f"{where} ({offset._name!r}) must have dims {want} (one offset per batch and "
            f"the end), got {offset._dim}"
        )


def is_transposed(t: Tensor) -> bool:
    """Whether *t*'s graph describes it to cuDNN with its last two dims swapped (attention's
    K^T: the same memory; :meth:`GraphBase._reading_transposed`). The tensor object itself is
    never changed: its dims and strides stay the ones it was declared with."""
    return t._index in t._graph._transposed


def described_dim(t: Tensor) -> tuple[int, ...]:
    """The dims cuDNN sees (the last two swapped for a transposed view)."""
    d = t._dim
    return (*d[:-2], d[-1], d[-2]) if is_transposed(t) else d


def described_stride(t: Tensor) -> tuple[int, ...]:
    """The strides cuDNN sees (as :func:`described_dim`)."""
    s = t._stride
    return (*s[:-2], s[-1], s[-2]) if is_transposed(t) else s


def check_array(graph: str, t: Tensor, obj: Any, spec: Any, device: int) -> int:
    """The array's address after checking it against tensor *t* (its own dims and strides,
    not the transposed view cuDNN may be given) and its frozen *spec* (data type,
    alignment)."""
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
        raise TypeError(
            f"{graph}: tensor {name!r} is {dtype_name(DataType(spec.data_type))}, "
            f"the array {a.dtype}"
        )
    shape = tuple(a.shape) or (1,)
    ragged = t._ragged is not None  # packed rows: the offsets (device data) place them
    if not ragged and shape != t._dim:
        raise ValueError(f"{graph}: tensor {name!r} has dims {t._dim}, the array {shape}")
    isz = a.dtype.itemsize
    strides = tuple(s // isz for s in a.strides) or (1,)
    if not ragged and not _layout.matches(shape, strides, t._stride):
        raise ValueError(
            f"{graph}: tensor {name!r} has strides {t._stride}, the array {strides} (elements)"
        )
    if a.device != device:
        raise ValueError(
            f"{graph}: tensor {name!r}'s array is on device {a.device}, the graph "
            f"was built for device {device}"
        )
    if a.ptr % spec.alignment:
        raise ValueError(
            f"{graph}: tensor {name!r}'s address 0x{a.ptr:x} is not aligned to "
            f"{spec.alignment} B as declared"
        )
    return a.ptr


#: one recorded operation: (kind, name, settings, [(role, tensor)...], inputs first)
Node = tuple[str, str, dict[str, Any], list[tuple[str, Tensor]]]


#: the graph's members the node families (:mod:`.nodes`) use: :class:`GraphBase`'s protocol
NODE_PROTOCOL = frozenset(
    {"name", "_check", "_compute", "_constant", "_new", "_node", "_out", "_uses"}
    | {"_reading_transposed", "_to_scratch"}
)


class GraphBase:
    """What a graph records -- its tensors and its nodes -- and the primitives the node families
    (:mod:`.nodes`) add them with: check an argument, make an output, record a node. Each family's
    methods are a subclass of it (its ``...Operations`` class); :class:`~pycudnn.graph.Graph`
    subclasses them all.

    The node protocol (:data:`NODE_PROTOCOL`, held by ``tests/graph/test_node_protocol.py``): a
    family reads the graph's ``name`` and calls :meth:`_check` (an argument is a tensor of this
    graph), :meth:`_compute` (an operation's compute type), :meth:`_new`, :meth:`_out` and
    :meth:`_constant` (a tensor, an operation's virtual output, a constant), :meth:`_node` (record
    an operation), :meth:`_uses`, :meth:`_reading_transposed` (an attention's scope) and
    :meth:`_to_scratch`: private to the package, not to this class.
    """

    def __init__(
        self, io_data_type: Any, intermediate_data_type: Any, compute_data_type: Any, name: str
    ) -> None:
        self.io_data_type = as_dtype(io_data_type, "io_data_type", allow_none=True)
        self.intermediate_data_type = as_dtype(intermediate_data_type, "intermediate_data_type")
        self.compute_data_type = as_dtype(compute_data_type, "compute_data_type")
        if not isinstance(name, str) or not name:
            raise TypeError(f"Graph: name must be a non-empty str (used in messages), got {name!r}")
        self.name = name
        self._tensors: list[Tensor] = []
        self._nodes: list[Node] = []
        self._key: Any = None  # the frozen graph (GraphKey) once built
        # tensors cuDNN reads with their last two dims swapped (attention's K^T), by index:
        # the attention that reads them so; only attention nodes may use them
        self._transposed: dict[int, str] = {}
        self._attention_reads: frozenset[int] = frozenset()  # allowed while one is recorded

    def _mutable(self) -> None:
        if self._key is not None:
            raise RuntimeError(f"{self.name}: the graph was built; make a new Graph to change it")

    def _new(
        self,
        name: str | None,
        layout: tuple[tuple[int, ...], tuple[int, ...], DataType | None],
        virtual: bool,
        by_value: bool = False,
        producer: str | None = None,
    ) -> Tensor:
        """A new tensor of *layout* ``(dim, stride, data type)``."""
        self._mutable()
        index = len(self._tensors)
        dt = layout[2] if layout[2] is not None or virtual else self.io_data_type
        check_extent(f"{self.name}: tensor {name or f't{index}'!r}", layout[0], layout[1], dt)
        t = Tensor(self, index, name or f"t{index}", layout, virtual, by_value, producer)
        self._tensors.append(t)
        return t

    @overload
    def _check(
        self, op: str, argument: str, t: Any, optional: Literal[False] = False
    ) -> Tensor: ...

    @overload
    def _check(self, op: str, argument: str, t: Any, optional: bool) -> Tensor | None: ...

    def _check(self, op: str, argument: str, t: Any, optional: bool = False) -> Tensor | None:
        """*t* if it is a tensor of this graph (None if *optional* and None)."""
        if t is None and optional:
            return None
        if not isinstance(t, Tensor):
            raise TypeError(
                f"{self.name}.{op}: {argument} must be a Tensor of this graph, got "
                f"{type(t).__name__}"
            )
        if t._graph is not self:
            raise ValueError(f"{self.name}.{op}: {argument} ({t._name!r}) belongs to another graph")
        return t

    def _node(
        self, kind: str, name: str | None, settings: dict[str, Any], roles: list[tuple[str, Tensor]]
    ) -> None:
        """Record a node of *kind* (its settings, its tensors by role, inputs first)."""
        self._mutable()
        for _role, t in roles:
            if t._index in self._transposed and t._index not in self._attention_reads:
                raise ValueError(
                    f"{self.name}.{name or kind}: tensor {t._name!r} is an attention's k or v "
                    f"({self._transposed[t._index]!r}), which cuDNN reads transposed (the same "
                    "memory with its last two dims swapped); it cannot be an input of another "
                    "operation: declare a second tensor for the same array (g.tensor_like)"
                )
        self._nodes.append((kind, name or f"{kind}{len(self._nodes)}", settings, roles))

    @contextlib.contextmanager
    def _reading_transposed(
        self, op: str, owner: str, swapped: dict[str, Tensor], others: dict[str, Tensor | None]
    ) -> Iterator[None]:
        """The scope in which the attention *owner* records its nodes, reading the tensors
        *swapped* (``{argument: tensor}``) as K^T: checked first that none of them is also one of
        its *others* operands or an input of an operation recorded before, and that no other
        operand is read transposed by another attention (nothing is marked when a check fails).
        The tensors stay marked as transposed; only nodes recorded inside the scope may read
        them."""
        where = f"{self.name}.{op}"
        for nm, t in swapped.items():
            for other, u in others.items():
                if u is t:
                    raise ValueError(
                        f"{where}: {nm} and {other} are the same tensor ({t._name!r}); cuDNN "
                        f"reads {nm} transposed (the same memory with its last two dims "
                        f"swapped), so {nm} must be a tensor of its own: declare a second "
                        "tensor for the same array (g.tensor_like)"
                    )
            if t._index not in self._transposed and self._uses(t):
                raise ValueError(
                    f"{where}: {nm} ({t._name!r}) is already an input of another operation; "
                    f"cuDNN reads an attention's {nm} transposed (the same memory with its last "
                    "two dims swapped), so it cannot be shared: declare a second tensor for the "
                    "same array (g.tensor_like)"
                )
        for other, u in others.items():
            if u is not None and u._index in self._transposed:
                raise ValueError(
                    f"{where}: {other} ({u._name!r}) is the k or v of attention "
                    f"{self._transposed[u._index]!r}, which cuDNN reads transposed; it cannot "
                    f"also be this attention's {other}: declare a second tensor for the same "
                    "array (g.tensor_like)"
                )
        for t in swapped.values():
            self._transposed.setdefault(t._index, owner)
        self._attention_reads = frozenset(t._index for t in swapped.values())
        try:
            yield
        finally:
            self._attention_reads = frozenset()

    def _uses(self, t: Tensor) -> bool:
        """Whether a recorded operation refers to *t*."""
        return any(u is t for node in self._nodes for _role, u in node[3])

    def _out(
        self,
        op: str,
        name: str | None,
        dim: tuple[int, ...],
        like: Tensor | None,
        dtype: DataType | None = None,
    ) -> Tensor:
        """A virtual output of *op*, packed in *like*'s memory order (row-major without)."""
        if like is not None:
            stride = like_strides(dim, like._dim, like._stride)
        else:
            stride = _layout.packed_strides(dim)
        return self._new(name, (dim, stride, dtype), True, producer=op)

    def _compute(self, value: Any, op: str) -> DataType:
        """An operation's compute data type: *value*, or the graph's."""
        if value is None:
            return self.compute_data_type
        return as_dtype(value, f"{self.name}.{op}: compute_data_type")

    def _constant(self, value: float, dtype: DataType, name: str | None) -> Tensor:
        """A by-value scalar whose value the graph keeps and passes itself."""
        try:
            value = host_scalar(value, dtype, name or "scalar")
        except (TypeError, ValueError, OverflowError) as exc:
            raise type(exc)(f"{self.name}: {exc}") from None
        t = self._new(name, ((1, 1, 1, 1), (1, 1, 1, 1), dtype), False, True)
        t._value = value
        return t

    def _scratch(
        self, name: str, dim: tuple[int, ...], dtype: DataType, fill: str | None
    ) -> Tensor:
        """A real tensor the graph keeps in its own workspace (*fill* ``'zero'``: zeroed before
        every run), e.g. an accumulator an engine needs."""
        t = self._new(name, (dim, _layout.packed_strides(dim), dtype), False)
        t._scratch = fill or "keep"
        return t

    def _to_scratch(self, t: Tensor, dtype: DataType, fill: str | None) -> None:
        """Make the operation output *t* a real tensor of *dtype*, packed, that the graph keeps
        in its own workspace (*fill* as :meth:`_scratch`'s), e.g. an accumulator an engine
        writes."""
        self._mutable()
        t._virtual = False
        t._scratch = fill or "keep"
        t._dtype = dtype
        t._stride = _layout.packed_strides(t._dim)
