"""CTC loss on cuDNN's v8 API (``cudnnCTCLoss_v8``): labels and lengths in device memory.

``dnn_ctc_loss(log_probs, labels, label_lengths, input_lengths, algo)`` returns the loss and its
gradient in one call, as PyTorch's ``F.ctc_loss`` with blank 0 computes them:

* *log_probs* ``(T, N, C)`` are log-probabilities (``log_softmax`` output). cuDNN is run with
  ``CUDNN_LOSS_NORMALIZATION_SOFTMAX``, i.e. it applies a softmax to its input, which gives back
  the probabilities for log-probabilities (``softmax(log p) = p``); unnormalised logits are
  accepted too (the loss is then that of ``log_softmax(logits)``). The gradient is cuDNN's, the
  gradient w.r.t. that softmax's input: ``exp(log_probs) - posterior``, which is what PyTorch's
  ``F.ctc_loss`` returns for *log_probs* (both equal the gradient w.r.t. the logits once passed
  back through ``log_softmax``). Time steps past a sample's input length get 0 (cuDNN leaves
  them unwritten: the gradient buffer is zeroed first).
* A sample whose labels cannot fit in its input length (label length plus repeats greater than
  the input length) gets loss 0 and a zero gradient (cuDNN's ``CUDNN_CTC_ZERO_OOB_GRADIENTS``;
  PyTorch gives ``inf`` unless ``zero_infinity=True``).
* Measured limits of cuDNN 9.19: float32 and float64 only (float16 is ``NOT_SUPPORTED``), the
  compute type must be the data type, label lengths 1 to 255 (256 is ``NOT_SUPPORTED``; an
  empty label gives a wrong loss, so it is refused), the gradient is written packed whatever
  its descriptor says (a strided ``out`` is filled through a packed buffer).

With ``check_values=True`` (the default) the labels and lengths are copied to the host (a
synchronising copy) and checked before cuDNN reads them on the device, where bad values give
wrong results or illegal memory accesses. The call goes through the shared call path
(:mod:`._call`): descriptors and workspace size are cached per layout.
"""

from __future__ import annotations

import ctypes
import threading
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import numpy as np

from .. import _layout, memory
from .._config import parse_bool
from .._types import numpy_dtype
from ..descriptors import CTCLossDescriptor, OpTensorDescriptor, ReduceTensorDescriptor
from ..enums import CTCLossAlgo, DataType
from . import _call, _checks, _operand, _staging

if TYPE_CHECKING:
    from ..typing import DeviceArrayLike, StreamLike
    from ._annotations import Out, Out2

__all__ = ["dnn_ctc_loss"]

_TYPES = (DataType.FLOAT, DataType.DOUBLE)
_INT = (DataType.INT32,)
_ALGOS = {
    "deterministic": CTCLossAlgo.DETERMINISTIC,
    "non_deterministic": CTCLossAlgo.NON_DETERMINISTIC,
}
_REDUCTIONS = {"none": "none", "sum": "sum", "mean": "mean"}
_MAX_LABEL = 255  # cuDNN refuses a descriptor with a larger maximum (NOT_SUPPORTED)
_IP = ctypes.POINTER(ctypes.c_int)
_KEY = "ctc"


def _vector(func: str, name: str, g: _operand.Operand, n: int | None, what: str) -> None:
    if len(g.shape) != 1 or (n is not None and g.shape[0] != n):
        raise ValueError(f"{func}: {name} has shape {tuple(g.shape)}; expected {what}")
    _checks.check_strides(func, name, g)
    if g.shape[0] > 1 and g.strides[0] != 1:
        raise ValueError(
            f"{func}: {name} has stride {g.strides[0]}; cuDNN reads it as a packed int32 vector"
        )


class _Plan(NamedTuple):
    """What a CTC call computes with: shapes, cuDNN's choices, descriptors, workspace sizes."""

    dt: DataType
    shape: tuple[int, int, int]  # (T, N, C)
    algo: CTCLossAlgo
    reduction: str  # 'none', 'sum' or 'mean'
    grad_direct: bool  # cuDNN writes the gradient straight into its output
    ctc: CTCLossDescriptor
    probs: Any  # packed (T, N, C): log_probs and cuDNN's gradient
    grad_out: Any  # the gradient output as given
    loss_out: Any  # the reduced loss (None for reduction='none')
    reduce: Any  # the sum over N (None unless reduced over N > 1)
    workspace: int
    reduce_workspace: int


#: the per-call arguments that are not in the key (pure Python; read by launch)
_RUN = threading.local()


class _CTCLoss(_call.Call):
    """cudnnCTCLoss_v8 into packed buffers (zeroed gradient), then the reduction/copy:
    log_probs, labels, label_lengths, input_lengths, then loss[, grad]. The per-call value
    checks and 'mean' weights come from :data:`_RUN` (set around the run)."""

    __slots__ = (
        "algo",
        "cd",
        "copy",
        "fn",
        "g4d",
        "gd",
        "god",
        "grad_direct",
        "hp",
        "ld",
        "lod",
        "mul",
        "n",
        "npdt",
        "one",
        "opd",
        "pd",
        "rd",
        "red",
        "reduce",
        "rws",
        "set",
        "shape",
        "wd",
        "ws",
    )
    lean = False  # launch reads the per-call arguments

    def __init__(self, func, h, allocs, spans, stage, plan: _Plan):
        dt, shape, n = plan.dt, plan.shape, plan.shape[1]
        one, zero = _call.scales(dt, 1.0, 0.0)
        # the element-wise calls take 4-D descriptors (cudnnSetTensor refuses 3-D ones)
        g4d = _staging.tensor_descriptor(*_staging.padded(shape, _layout.packed_strides(shape)), dt)
        wd = _staging.tensor_descriptor(
            *_staging.padded((1, n, 1), (n, 1, 1)), dt
        )  # over (T, N, C)
        ld = _staging.tensor_descriptor(*_staging.padded((n,), (1,)), dt)  # a vector of N
        opd = OpTensorDescriptor("mul", dt) if plan.reduction == "mean" else None
        super().__init__(func, h, allocs, spans, stage, keepalive=(plan, g4d, wd, ld, opd))
        self.shape, self.n, self.algo = shape, n, plan.algo
        self.cd, self.pd, self.gd, self.god, self.lod = (
            plan.ctc,
            plan.probs,
            plan.probs,
            plan.grad_out,
            plan.loss_out,
        )
        self.g4d, self.wd, self.ld, self.opd = g4d, wd, ld, opd
        self.ws, self.red, self.grad_direct = plan.workspace, plan.reduction, plan.grad_direct
        self.rd, self.rws = plan.reduce, plan.reduce_workspace
        self.npdt = np.dtype(numpy_dtype(dt))
        self.hp = h.ptr
        self.one = (ctypes.byref(one), ctypes.byref(zero), one, zero)
        self.fn = _call.quiet("cudnnCTCLoss_v8")
        self.set = _call.quiet("cudnnSetTensor")
        self.copy = _call.quiet("cudnnTransformTensor")
        self.mul = _call.quiet("cudnnOpTensor")
        self.reduce = _call.quiet("cudnnReduceTensor")

    def _weights(self) -> np.ndarray | None:
        """Check the values (when asked to) and make the 'mean' weights, before any C call."""
        check, labels, label_lengths, input_lengths = _RUN.args
        lens = None
        if check:
            lens = _check_values(self.func, self, labels, label_lengths, input_lengths)
        if self.red != "mean":
            return None
        if lens is None:
            lens = _host(label_lengths, self.handle)
        return (1.0 / (self.n * np.maximum(lens, 1))).astype(self.npdt)

    def launch(self, ptrs):
        weights = self._weights()
        lp, labels, lens, ilens = ptrs[:4]
        loss = ptrs[4]
        grad = ptrs[5] if len(ptrs) > 5 else None
        h = self.handle
        dev, stream = h.device, h.stream
        one, zero = self.one[0], self.one[1]
        keep = []
        gp = None
        if grad is not None:
            if self.grad_direct:
                gp = grad
            else:
                tmp = memory.empty(self.shape, self.npdt, dev, stream)
                keep.append(tmp)
                gp = tmp.ptr
            self.set(self.hp, self.g4d, gp, ctypes.byref(self.one[3]))  # zero
        if self.red == "none":
            cp = loss
        else:
            costs = memory.empty((self.n,), self.npdt, dev, stream)
            keep.append(costs)
            cp = costs.ptr
        wp = _call.workspace(h, self.ws) if self.ws else None
        self.fn(
            self.hp,
            self.algo,
            self.cd,
            self.pd,
            lp,
            ctypes.cast(labels, _IP),
            ctypes.cast(lens, _IP),
            ctypes.cast(ilens, _IP),
            cp,
            self.gd,
            gp,
            self.ws,
            wp,
        )
        w = None
        if self.red == "mean":
            w = memory.to_device(weights, stream)
            keep.append(w)
            scaled = memory.empty((self.n,), self.npdt, dev, stream)
            keep.append(scaled)
            self.mul(
                self.hp, self.opd, one, self.ld, cp, one, self.ld, w.ptr, zero, self.ld, scaled.ptr
            )
            cp = scaled.ptr
        if self.red != "none":
            if self.n == 1:
                self.copy(self.hp, one, self.ld, cp, zero, self.lod, loss)
            else:
                rwp = _call.workspace(h, self.rws) if self.rws else None
                self.reduce(
                    self.hp, self.rd, None, 0, rwp, self.rws, one, self.ld, cp, zero, self.lod, loss
                )
        if grad is not None and not self.grad_direct:
            if w is not None:
                self.mul(
                    self.hp, self.opd, one, self.g4d, gp, one, self.wd, w.ptr, zero, self.god, grad
                )
            else:
                self.copy(self.hp, one, self.g4d, gp, zero, self.god, grad)
        del keep  # temporaries are freed stream-ordered, after the queued calls


def dnn_ctc_loss(
    log_probs: DeviceArrayLike,
    labels: DeviceArrayLike,
    label_lengths: DeviceArrayLike,
    input_lengths: DeviceArrayLike,
    algo: Literal["deterministic", "non_deterministic"] = "deterministic",
    *,
    reduction: Literal["none", "sum", "mean"] = "none",
    compute_grad: bool = True,
    check_values: bool = True,
    out: tuple[Out | None, Out2 | None] | None = None,
    stream: StreamLike = None,
) -> tuple[Out, Out2 | None]:
    """Connectionist temporal classification loss and its gradient (``cudnnCTCLoss_v8``).

    Parameters
    ----------
    log_probs : device array
        ``(T, N, C)`` log-probabilities over ``C`` classes, class 0 the blank; float32 or
        float64; copied to C order first if strided.
    labels : device array
        int32, 1-D: the label sequences of the batch one after the other (PyTorch's
        concatenated targets), each label in ``1 .. C - 1``.
    label_lengths : device array
        int32 ``(N,)``, each 1 to 255.
    input_lengths : device array
        int32 ``(N,)``, each 1 to ``T`` and at least the sample's label length.
    algo : {'deterministic', 'non_deterministic'}
        cuDNN's algorithm (the second is faster and not bitwise reproducible).
    reduction : {'none', 'sum', 'mean'}
        ``'none'``: the loss per sample, ``(N,)``; ``'sum'``: their sum; ``'mean'``: PyTorch's
        mean, ``mean(loss / label_lengths)`` (reads *label_lengths* on the host). The gradient
        is that of the returned loss.
    compute_grad : bool
        False: the loss only (the gradient returned is None).
    check_values : bool
        Copy labels and lengths to the host and check them first (a synchronising copy; turn
        off in graphs or hot loops once the data is known to be good).
    out : (device array or None, device array or None), optional
        ``(loss, grad)``: *loss* ``(N,)`` (C-contiguous) or ``()``, *grad* ``(T, N, C)`` any
        strides; the dtype of *log_probs*.
    stream : optional
        CUDA stream; default the operands' framework's current stream (torch, CuPy), else the
        handle's stream.

    Returns
    -------
    (loss, grad)
        New arrays (or the given ones); *grad* is None without *compute_grad*.

    Raises
    ------
    TypeError
        Host arrays, dtypes other than float32/float64 (*log_probs*) and int32 (the rest),
        non-bool flags, *out* not a pair.
    ValueError
        Bad shapes (*log_probs* not 3-D with C >= 2 and N >= 1, vectors not 1-D of N, strided
        vectors), devices, an unknown algo or reduction, a bad *out*; with *check_values*, any
        length or label out of range, or label lengths that do not add up to ``len(labels)``.

    Examples
    --------
    >>> lp = torch.randn(50, 4, 20, device="cuda").log_softmax(2)
    >>> loss, grad = pycudnn.dnn_ctc_loss(lp, labels, label_lengths, input_lengths)
    """
    if stream is None:  # the operands' framework's current stream (torch, CuPy)
        stream = _operand.producer_stream(log_probs)
    func = "dnn_ctc_loss"
    outs = _checks.out_pair(func, out, "loss, grad")
    ptrs, keys = [], []
    for obj in (log_probs, labels, label_lengths, input_lengths):
        p, k = _operand.key_of(obj)
        ptrs.append(p)
        keys.append(k)
    pos, kos = zip(*((None, None) if o is None else _operand.key_of(o) for o in outs), strict=True)
    compute_grad = parse_bool(compute_grad, func, "compute_grad")
    check_values = parse_bool(check_values, func, "check_values")
    key = (_KEY, *keys, kos, algo, reduction, compute_grad)
    args = (
        log_probs,
        labels,
        label_lengths,
        input_lengths,
        outs,
        algo,
        reduction,
        compute_grad,
        stream,
    )
    n_out = 2 if compute_grad else 1
    # read by launch, which runs on the call's stream (the values are read in order on it)
    _RUN.args = (
        parse_bool(check_values, func, "check_values"),
        labels,
        label_lengths,
        input_lengths,
    )
    try:
        result = _call.run_cached(key, _build, args, tuple(ptrs), outs[:n_out], pos[:n_out], stream)
    finally:
        _RUN.args = None  # the arrays are not kept
    return (result[0], result[1]) if n_out == 2 else (result[0], None)


def _host(obj: Any, h: Any) -> np.ndarray:
    return memory.asarray(obj).get(h.stream).astype(np.int64)


def _check_values(func, call, labels, label_lengths, input_lengths) -> np.ndarray:
    t, _, c = call.shape
    lens = _host(label_lengths, call.handle)
    ilens = _host(input_lengths, call.handle)
    labs = _host(labels, call.handle)
    for name, arr, lo, hi, what in (
        (
            "label_lengths",
            lens,
            1,
            _MAX_LABEL,
            "1 to 255 (cuDNN's limit; an empty label is refused)",
        ),
        ("input_lengths", ilens, 1, t, f"1 to T = {t}"),
    ):
        bad = np.flatnonzero((arr < lo) | (arr > hi))
        if bad.size:
            i = int(bad[0])
            raise ValueError(f"{func}: {name}[{i}]={int(arr[i])} is out of range; expected {what}")
    bad = np.flatnonzero(lens > ilens)
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"{func}: label_lengths[{i}]={int(lens[i])} exceeds input_lengths[{i}]={int(ilens[i])}"
        )
    total = int(lens.sum())
    if total != labs.size:
        raise ValueError(
            f"{func}: labels has {labs.size} elements but label_lengths add up to {total}"
        )
    bad = np.flatnonzero((labs < 1) | (labs >= c))
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"{func}: labels[{i}]={int(labs[i])} is out of range; expected 1 to C - 1 = {c - 1} "
            "(0 is the blank)"
        )
    return lens


def _output(func, out, shape, dt_device, what, allocs, spans) -> Any:
    """Append one output's allocation spec (None when given) and byte span to *allocs* and
    *spans*; the given *out* as an operand, or None."""
    dt, device = dt_device
    if out is None:
        spec = _call.output_spec(shape, dt, device)
        allocs.append(spec)
        spans.append(spec.nbytes_span)
        return None
    o = _checks.out_operand(func, out, shape, dt, device, what)
    allocs.append(None)
    spans.append(o.nbytes_span)
    return o


def _build(
    log_probs, labels, label_lengths, input_lengths, outs, algo, reduction, compute_grad, stream
) -> _CTCLoss:
    func = "dnn_ctc_loss"
    glp = _operand.operand(log_probs)
    dt, device = _checks.same_dtype_and_device(func, (("log_probs", glp),), _TYPES)
    if len(glp.shape) != 3:
        raise ValueError(f"{func}: log_probs has shape {tuple(glp.shape)}; expected (T, N, C)")
    t, n, c = glp.shape
    if t < 1 or n < 1 or c < 2:
        raise ValueError(
            f"{func}: log_probs has shape {tuple(glp.shape)}; expected T >= 1, N >= 1 and C >= 2 "
            "(the blank and at least one label)"
        )
    _checks.check_strides(func, "log_probs", glp)
    gl, gll, gil = (_operand.operand(o) for o in (labels, label_lengths, input_lengths))
    _, ldev = _checks.same_dtype_and_device(
        func, (("labels", gl), ("label_lengths", gll), ("input_lengths", gil)), _INT
    )
    if ldev != device:
        raise ValueError(f"{func}: log_probs is on device {device} but labels on device {ldev}")
    _vector(func, "labels", gl, None, "1-D (the concatenated label sequences)")
    _vector(func, "label_lengths", gll, n, f"({n},) (N of log_probs)")
    _vector(func, "input_lengths", gil, n, f"({n},) (N of log_probs)")
    algo_v = _checks.choose(algo, _ALGOS, "algo", func)
    red = _checks.choose(reduction, _REDUCTIONS, "reduction", func)
    with_grad = parse_bool(compute_grad, func, "compute_grad")
    if not with_grad and outs[1] is not None:
        raise ValueError(f"{func}: out[1] (grad) was given with compute_grad=False")
    shape = (t, n, c)
    packed = _layout.packed_strides(shape)
    lshape = (n,) if red == "none" else ()
    allocs: list[Any] = []
    spans: list[int] = []
    o = _output(func, outs[0], lshape, (dt, device), "out[0] (loss)", allocs, spans)
    if o is not None and red == "none" and n > 1 and o.strides[0] != 1:
        raise ValueError(f"{func}: out[0] (loss) has stride {o.strides[0]}; cuDNN writes it packed")
    grad_direct = True
    gstrides = packed
    if with_grad:
        og = _output(func, outs[1], shape, (dt, device), "out[1] (grad)", allocs, spans)
        if og is not None:
            gstrides = tuple(og.strides)
            grad_direct = _layout.matches(shape, gstrides, packed)
        grad_direct = grad_direct and red != "mean"
    stage: list = []
    if not _layout.is_c_contiguous(glp.shape, glp.strides):
        shape4, strides4 = _staging.padded(shape, glp.strides)
        stage.append(
            (0, glp._replace(shape=shape4, strides=strides4), _staging.padded(shape, packed)[1])
        )
    h = _call.handle_for(device, stream, func)
    cd = CTCLossDescriptor(
        dt, normalization="softmax", grad_mode="zero_oob", max_label_length=_MAX_LABEL
    )
    pd = _staging.tensor_descriptor(shape, packed, dt)
    god = _staging.tensor_descriptor(*_staging.padded(shape, gstrides), dt)
    size = ctypes.c_size_t()
    _call.quiet("cudnnGetCTCLossWorkspaceSize_v8")(h.ptr, algo_v, cd, pd, pd, ctypes.byref(size))
    lod = None if red == "none" else _staging.tensor_descriptor((1, 1, 1, 1), (1, 1, 1, 1), dt)
    rd, rws = None, 0
    if red != "none" and n > 1:
        rd = ReduceTensorDescriptor("add", dt)
        ld = _staging.tensor_descriptor(*_staging.padded((n,), (1,)), dt)
        rsize = ctypes.c_size_t()
        _call.quiet("cudnnGetReductionWorkspaceSize")(h.ptr, rd, ld, lod, ctypes.byref(rsize))
        rws = rsize.value
    spans = [glp.nbytes_span, gl.nbytes_span, gll.nbytes_span, gil.nbytes_span, *spans]
    staging = _staging.Stage(dt, stage, None, 1.0, 0.0) if stage else None
    plan = _Plan(dt, shape, algo_v, red, grad_direct, cd, pd, god, lod, rd, size.value, rws)
    return _CTCLoss(func, h, tuple(allocs), tuple(spans), staging, plan)
