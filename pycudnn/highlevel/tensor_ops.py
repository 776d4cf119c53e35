"""Element-wise tensor arithmetic around a convolution: a broadcast add (a bias) and cuDNN's
binary/unary ``cudnnOpTensor``.

``dnn_add_tensor(a, c)`` is ``c = alpha * a + beta * c`` in place (``cudnnAddTensor``), with
*a* broadcast over *c*: each of its dimensions is 1 or *c*'s (a ``(1, C, 1, 1)`` bias over an
``(N, C, H, W)`` activation). ``dnn_op_tensor(op, a, b)`` is ``out = op(alpha1 * a, alpha2 * b) +
beta * out`` with *b* broadcast the same way (``'sqrt'`` and ``'not'`` take *a* alone). Both
read any strides; cuDNN handles up to 5 dimensions here.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any, Literal

from ..descriptors import OpTensorDescriptor
from ..enums import DataType, OpTensorOp
from . import _call, _checks, _operand, _staging

if TYPE_CHECKING:
    from ..typing import DeviceArrayLike, StreamLike
    from ._annotations import Given, Out

__all__ = ["dnn_add_tensor", "dnn_op_tensor"]

_OPS = {
    "add": OpTensorOp.ADD,
    "mul": OpTensorOp.MUL,
    "min": OpTensorOp.MIN,
    "max": OpTensorOp.MAX,
    "sqrt": OpTensorOp.SQRT,
    "not": OpTensorOp.NOT,
}
_UNARY = (OpTensorOp.SQRT, OpTensorOp.NOT)


def _desc(func: str, name: str, g: _operand.Operand) -> Any:
    if not 1 <= len(g.shape) <= 5:
        raise ValueError(
            f"{func}: {name} has {len(g.shape)} dims; cuDNN's tensor arithmetic takes 1 to 5"
        )
    _checks.check_strides(func, name, g)
    if 0 in g.shape:
        return None  # nothing to compute
    return _staging.tensor_descriptor(*_staging.padded(g.shape, g.strides), g.dtype)


def _check_broadcast(
    func: str, name: str, g: _operand.Operand, target: tuple[int, ...], tname: str
) -> None:
    if len(g.shape) != len(target) or any(
        s not in (1, t) for s, t in zip(g.shape, target, strict=True)
    ):
        raise ValueError(
            f"{func}: {name} of shape {tuple(g.shape)} does not broadcast over {tname} of shape "
            f"{target}: it needs the same number of dims, each 1 or equal (reshape a bias to "
            f"(1, C, 1, 1) for (N, C, H, W))"
        )


# ==================================================================================================
# dnn_add_tensor
# ==================================================================================================
class _AddTensor(_call.Call):
    """``cudnnAddTensor``: a, then c (given: read and written)."""

    __slots__ = ("ad", "cd", "fn", "hp", "scale")

    def __init__(self, func, h, spans, ad, cd, alpha, beta):
        super().__init__(func, h, (None,), spans, keepalive=(ad, cd))
        self.fn = _call.quiet("cudnnAddTensor")
        self.hp, self.ad, self.cd = h.ptr, ad, cd
        self.scale = (alpha, beta, ctypes.byref(alpha), ctypes.byref(beta))

    def launch(self, ptrs):
        self.fn(self.hp, self.scale[2], self.ad, ptrs[0], self.scale[3], self.cd, ptrs[1])


def dnn_add_tensor(
    a: DeviceArrayLike,
    c: Given,
    alpha: float = 1.0,
    beta: float = 1.0,
    *,
    stream: StreamLike = None,
) -> Given:
    """``c = alpha * a + beta * c`` in place, *a* broadcast over *c* (``cudnnAddTensor``).

    Parameters
    ----------
    a : device array
        Each dimension 1 or equal to *c*'s (same number of dims, 1 to 5), e.g. a bias
        ``(1, C, 1, 1)`` for ``(N, C, H, W)``; same dtype as *c*.
    c : device array
        The destination (read and written); must not overlap *a*.
    alpha, beta : float
        Scaling factors.
    stream : optional
        CUDA stream; default the operands' framework's current stream (torch, CuPy), else the
        handle's stream.

    Returns
    -------
    The type of *c*
        *c* itself.

    Raises
    ------
    TypeError
        Host arrays, a dtype other than the four floating types, mixed dtypes.
    ValueError
        Shapes that do not broadcast, more than 5 dims, overlap, bad strides, devices.

    Examples
    --------
    >>> pycudnn.dnn_add_tensor(bias.reshape(1, -1, 1, 1), y)   # y += bias, per channel
    """
    if stream is None:  # the operands' framework's current stream (torch, CuPy)
        stream = _operand.producer_stream(a)
    pa, ka = _operand.key_of(a)
    pc, kc = _operand.key_of(c)
    key = ("add_tensor", ka, kc, alpha, beta, alpha.__class__, beta.__class__)
    args = (a, c, alpha, beta, stream)
    return _call.run_cached(key, _build_add, args, (pa,), (c,), (pc,), stream)[0]


def _build_add(a, c, alpha, beta, stream) -> _call.Call:
    func = "dnn_add_tensor"
    ga, gc = _operand.operand(a), _operand.operand(c)
    dt, device = _checks.same_dtype_and_device(func, (("a", ga), ("c", gc)))
    ad, cd = _desc(func, "a", ga), _desc(func, "c", gc)
    _check_broadcast(func, "a", ga, tuple(gc.shape), "c")
    _checks.check_out(func, gc, gc.shape, name="c")
    al, be = _call.scales(dt, _checks.real(alpha, "alpha", func), _checks.real(beta, "beta", func))
    h = _call.handle_for(device, stream, func)
    spans = (ga.nbytes_span, gc.nbytes_span)
    if any(n == 0 for n in gc.shape):
        return _call.Call(func, h, (None,), spans, noop=True)
    return _AddTensor(func, h, spans, ad, cd, al, be)


# ==================================================================================================
# dnn_op_tensor
# ==================================================================================================
class _OpTensor(_call.Call):
    """``cudnnOpTensor``: a[, b], then out."""

    __slots__ = ("ad", "bd", "cd", "fn", "hp", "opd", "scale", "unary")

    def __init__(self, func, h, alloc, spans, inplace, opd, descs, scales, unary):
        """*descs*: the descriptors of a, b (a's again when unary) and out."""
        super().__init__(func, h, (alloc,), spans, inplace=inplace, keepalive=(opd, descs))
        self.fn = _call.quiet("cudnnOpTensor")
        self.hp, self.opd = h.ptr, opd
        self.ad, self.bd, self.cd = descs
        self.scale = (*scales, *(ctypes.byref(s) for s in scales))
        self.unary = unary

    def launch(self, ptrs):
        if self.unary:  # b is not read: a stands in for it
            a, c = ptrs
            b = a
        else:
            a, b, c = ptrs
        _a1, _a2, _b, a1, a2, be = self.scale
        self.fn(self.hp, self.opd, a1, self.ad, a, a2, self.bd, b, be, self.cd, c)


def dnn_op_tensor(
    op: Literal["add", "mul", "min", "max", "sqrt", "not"],
    a: DeviceArrayLike,
    b: DeviceArrayLike | None = None,
    alpha1: float = 1.0,
    alpha2: float = 1.0,
    beta: float = 0.0,
    *,
    out: Out | None = None,
    stream: StreamLike = None,
) -> Out:
    """``out = op(alpha1 * a, alpha2 * b) + beta * out`` element-wise (``cudnnOpTensor``).

    Parameters
    ----------
    op : {'add', 'mul', 'min', 'max', 'sqrt', 'not'}
        ``'sqrt'`` is ``sqrt(alpha1 * a)`` and ``'not'`` is ``1 - alpha1 * a``: both ignore *b*
        (pass None).
    a : device array
        1 to 5 dims; the output has its shape.
    b : device array, optional
        Broadcast over *a*: same number of dims, each 1 or equal to *a*'s. Required for the
        binary ops.
    alpha1, alpha2, beta : float
        Scaling factors (*beta* != 0 accumulates into *out*).
    out : device array, optional
        Shaped like *a*; may be *a* itself, or *b* when *b* has *a*'s shape and layout (in
        place); no other overlap.
    stream : optional
        CUDA stream; default the operands' framework's current stream (torch, CuPy), else the
        handle's stream.

    Returns
    -------
    DeviceArray or the type of *out*
        In *a*'s memory order when new.

    Raises
    ------
    TypeError
        Host arrays, a dtype other than the four floating types, mixed dtypes; *b* missing for
        a binary op.
    ValueError
        An unknown op, shapes that do not broadcast, more than 5 dims, overlap, bad strides,
        devices.

    Examples
    --------
    >>> z = pycudnn.dnn_op_tensor("mul", x, y)             # x * y
    >>> pycudnn.dnn_op_tensor("max", x, zero, out=x)       # in place
    """
    if stream is None:  # the operands' framework's current stream (torch, CuPy)
        stream = _operand.producer_stream(a)
    pa, ka = _operand.key_of(a)
    if b is None:
        pb = kb = None
    else:
        pb, kb = _operand.key_of(b)
    po, ko = (None, None) if out is None else _operand.key_of(out)
    key = ("op_tensor", op, ka, kb, ko, alpha1, alpha2, beta)
    key += (alpha1.__class__, alpha2.__class__, beta.__class__)  # True == 1.0: types apart
    ptrs = (pa,) if b is None else (pa, pb)
    args = (op, a, b, alpha1, alpha2, beta, out, stream)
    return _call.run_cached(key, _build_op_tensor, args, ptrs, (out,), (po,), stream)[0]


def _build_op_tensor(op, a, b, alpha1, alpha2, beta, out, stream) -> _call.Call:
    func = "dnn_op_tensor"
    kind = _checks.choose(op, _OPS, "op", func)
    unary = kind in _UNARY
    ga = _operand.operand(a)
    gb = None if b is None else _operand.operand(b)
    if gb is None and not unary:
        raise TypeError(f"{func}: op={op!r} is binary; pass b (only 'sqrt' and 'not' take a alone)")
    if gb is not None and unary:
        raise TypeError(f"{func}: op={op!r} takes a alone; pass b=None")
    go = None if out is None else _operand.operand(out)
    dt, device = _checks.same_dtype_and_device(func, (("a", ga), ("b", gb), ("out", go)))
    ad = _desc(func, "a", ga)
    bd = ad
    if gb is not None:
        bd = _desc(func, "b", gb)
        _check_broadcast(func, "b", gb, tuple(ga.shape), "a")
    compute = DataType.DOUBLE if dt == DataType.DOUBLE else DataType.FLOAT
    opd = OpTensorDescriptor(kind, compute, nan_propagation=True)
    scales = _call.scales(
        dt,
        *(
            _checks.real(v, n, func)
            for v, n in ((alpha1, "alpha1"), (alpha2, "alpha2"), (beta, "beta"))
        ),
    )
    _checks.beta_needs_out(func, beta, out)
    if go is None:
        spec = _call.like_spec(ga)
        cd = None
        if 0 not in spec.shape:
            cd = _staging.tensor_descriptor(*_staging.padded(spec.shape, spec.element_strides), dt)
        so = spec.nbytes_span
        inplace: tuple[int, ...] = ()
    else:
        spec = None
        cd = _desc(func, "out", go)
        _checks.check_out(func, go, ga.shape)
        so = go.nbytes_span
        inplace = tuple(
            i for i, g in enumerate((ga, gb)) if g is not None and _staging.same_layout(g, go)
        )
    h = _call.handle_for(device, stream, func)
    spans = (ga.nbytes_span, *(() if gb is None else (gb.nbytes_span,)), so)
    if any(n == 0 for n in ga.shape):
        return _call.Call(func, h, (spec,), spans, noop=True)
    return _OpTensor(func, h, spec, spans, inplace, opd, (ad, bd, cd), scales, unary)
