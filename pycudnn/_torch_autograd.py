"""The torch side of :mod:`pycudnn.torch` (imports torch): streams, memory, and the
``autograd.Function`` over each pair of pycudnn forward and backward functions
(:mod:`pycudnn._torch_nn` builds the modules on them).

Memory: :class:`TorchMemoryResource` makes every pycudnn allocation a ``torch.empty`` of bytes on
the current stream; :func:`to_torch` turns a pycudnn array over such a block back into a torch
tensor without a copy (``as_strided`` over the block's tensor), and over any other memory through
DLPack.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch.autograd.function import once_differentiable

from .highlevel import (
    DropoutState,
    RNNBlock,
    dnn_activation,
    dnn_activation_grad,
    dnn_batch_normalization_grad,
    dnn_batch_normalization_test,
    dnn_batch_normalization_train,
    dnn_conv,
    dnn_conv3d,
    dnn_dropout,
    dnn_dropout_grad,
    dnn_gradinput,
    dnn_gradinput3d,
    dnn_gradweight,
    dnn_gradweight3d,
    dnn_layer_norm,
    dnn_layer_norm_grad,
    dnn_lrn,
    dnn_lrn_grad,
    dnn_pool,
    dnn_pool_grad,
    dnn_rms_norm,
    dnn_rms_norm_grad,
    dnn_sdpa,
    dnn_sdpa_grad,
    dnn_softmax,
    dnn_softmax_grad,
)
from .memory import allocator

__all__ = [
    "FLOATS",
    "FUSED_BIAS",
    "HALVES",
    "NORM_FLOATS",
    "NO_BF16",
    "Y_ONLY",
    "ActFn",
    "BNEvalFn",
    "BNTrainFn",
    "ConvFn",
    "DropoutFn",
    "DropoutPool",
    "LRNFn",
    "LayerNormFn",
    "PoolFn",
    "RMSNormFn",
    "RNNFn",
    "RNNRun",
    "SDPAFn",
    "SoftmaxFn",
    "TorchMemoryResource",
    "as_tuple",
    "attention_out",
    "cuda_ok",
    "dense",
    "hy_shape",
    "no_broadcast",
    "ready",
    "stream_of",
    "to_torch",
    "use_torch_allocator",
]

FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
NO_BF16 = (torch.float16, torch.float32, torch.float64)  # dropout, LRN, RNNs
NORM_FLOATS = (torch.float16, torch.bfloat16, torch.float32)  # layer and RMS norm
HALVES = (torch.float16, torch.bfloat16)  # fused attention
# dnn_conv fuses the bias into the convolution once it takes bias= (the fused-epilogue work)
FUSED_BIAS = "bias" in inspect.signature(dnn_conv).parameters


# ==================================================================================================
# Streams and memory
# ==================================================================================================
def _current_stream_slow(device: int) -> int:
    return torch.cuda.current_stream(device).cuda_stream


#: ``cudaStream_t`` of torch's current stream on a device: torch's own fast accessor (the one
#: its compiled kernels use, ~0.3 us) where it exists, else the public ``current_stream``
_raw_stream: Callable[[int], int] = getattr(
    torch._C, "_cuda_getCurrentRawStream", _current_stream_slow
)
_DEVICES: dict[int, torch.device] = {}


def _device(index: int) -> torch.device:
    dev = _DEVICES.get(index)
    if dev is None:
        dev = _DEVICES[index] = torch.device("cuda", index)
    return dev


class _TorchBlock:
    """A :class:`~pycudnn.memory.allocator.Block` over a torch uint8 tensor: the memory goes back
    to torch's caching allocator when the last pycudnn array (and torch view) over it is gone."""

    __slots__ = ("device", "keep", "nbytes", "ptr", "stream", "tensor")

    def __init__(self, tensor: torch.Tensor, device: int, stream: int, keep: Any):
        self.tensor = tensor
        self.ptr = tensor.data_ptr()
        self.nbytes = tensor.numel()
        self.device = device
        self.stream = stream
        self.keep = keep


class TorchMemoryResource:
    """A pycudnn :class:`~pycudnn.memory.allocator.MemoryResource` over torch's CUDA caching
    allocator.

    ``allocate(nbytes, device, stream)`` is ``torch.empty(nbytes, dtype=torch.uint8)`` on
    *device* with *stream* made torch's current stream (it usually already is: the adapter
    passes torch's current stream to pycudnn). The memory is then counted by
    ``torch.cuda.memory_allocated()``, freed and reused by torch's rules (stream-ordered on the
    allocation stream), and taken from a graph's private pool under ``torch.cuda.graph``.
    Install it with :func:`use_torch_allocator`.
    """

    def allocate(self, nbytes: int, device: int, stream: int, keep: Any = None) -> _TorchBlock:
        """*nbytes* of torch-owned memory on (*device*, *stream*)."""
        dev = _device(device)
        try:
            if stream == _raw_stream(device):
                t = torch.empty(nbytes, dtype=torch.uint8, device=dev)
            else:
                with torch.cuda.stream(torch.cuda.ExternalStream(stream, device=dev)):
                    t = torch.empty(nbytes, dtype=torch.uint8, device=dev)
        except torch.cuda.OutOfMemoryError as exc:
            raise allocator.allocation_error(
                nbytes, device, "torch.empty", f"torch's caching allocator is out of memory ({exc})"
            ) from None
        return _TorchBlock(t, device, stream, keep)

    def __repr__(self) -> str:
        return "TorchMemoryResource()"


_RESOURCE = TorchMemoryResource()
_AUTO = [True]  # install the resource on first use (until use_torch_allocator decides)


def use_torch_allocator(enabled: bool = True) -> None:
    """Make pycudnn allocate through torch's caching allocator (or stop doing so).

    The adapter does this by itself on first use, unless a resource other than pycudnn's own
    caching allocator is installed then; calling this function settles the choice either way.
    With it, every pycudnn allocation in the process (outputs, workspaces, staging copies,
    statistics, reserve spaces -- also of pycudnn calls made outside the adapter) is torch
    memory: ``torch.cuda.memory_allocated()`` counts it, ``torch.cuda.empty_cache()`` releases
    it, and CUDA-graph capture takes it from the graph's pool.

    Parameters
    ----------
    enabled : bool
        False restores pycudnn's own caching allocator (if the torch one is installed).
    """
    _AUTO[0] = False
    if enabled:
        allocator.set_memory_resource(_RESOURCE)
    elif allocator.memory_resource() is _RESOURCE:
        allocator.set_memory_resource(None)


def ready() -> None:
    """First use: install torch's allocator unless the user chose otherwise."""
    if _AUTO[0]:
        _AUTO[0] = False
        if isinstance(allocator.memory_resource(), allocator.CachingAllocator):
            allocator.set_memory_resource(_RESOURCE)


_TORCH_DTYPES = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
    "uint8": torch.uint8,
    "int8": torch.int8,
    "int32": torch.int32,
    "int64": torch.int64,
    "bool": torch.bool,
}


def to_torch(a: Any) -> torch.Tensor:
    """A torch tensor over the memory of *a*, without a copy.

    Parameters
    ----------
    a : DeviceArray or torch.Tensor
        A pycudnn array (what the high-level functions return), or a tensor.

    Returns
    -------
    torch.Tensor
        Over a :class:`TorchMemoryResource` block: a view of the block's tensor (shape,
        strides and dtype of *a*; no DLPack round trip). Over any other memory:
        ``torch.from_dlpack(a)`` (which orders torch's current stream after *a*'s). A tensor
        is returned as it is.
    """
    if isinstance(a, torch.Tensor):
        return a
    base = getattr(a, "base", None)
    if type(base) is _TorchBlock:
        isz = a.dtype.itemsize
        off = a.ptr - base.ptr
        dt = _TORCH_DTYPES.get(a.dtype.name)
        if dt is not None and off % isz == 0 and base.nbytes % isz == 0:
            return base.tensor.view(dt).as_strided(
                a.shape, tuple(s // isz for s in a.strides), off // isz
            )
    return torch.from_dlpack(a)


def dense(t: torch.Tensor) -> torch.Tensor:
    """*t* when its elements are packed in C order or channels-last, else a contiguous copy
    (gradients arrive as expanded zero-stride views, which cuDNN refuses)."""
    if t.is_contiguous():
        return t
    nd = t.dim()
    if (nd == 4 and t.is_contiguous(memory_format=torch.channels_last)) or (
        nd == 5 and t.is_contiguous(memory_format=torch.channels_last_3d)
    ):
        return t
    return t.contiguous()


def no_broadcast(t: torch.Tensor, unit_last: bool = False) -> torch.Tensor:
    """*t*, or a contiguous copy when it has a zero (broadcast) stride, which cuDNN refuses, or
    (*unit_last*) a last dim that is not contiguous."""
    if unit_last and t.stride(-1) != 1 and t.shape[-1] != 1:
        return t.contiguous()
    for n, st in zip(t.shape, t.stride(), strict=True):
        if st == 0 and n > 1:
            return t.contiguous()
    return t


# tensors pycudnn reads as they are (subclasses such as FakeTensor run torch's implementation)
_PLAIN = (torch.Tensor, torch.nn.Parameter)


def cuda_ok(x: Any, dtypes: tuple = FLOATS) -> bool:
    """*x* is a CUDA tensor of one of *dtypes* (else torch's own implementation runs)."""
    return type(x) in _PLAIN and x.is_cuda and x.dtype in dtypes


def stream_of(t: torch.Tensor) -> int:
    return _raw_stream(t.get_device())


def as_tuple(v: Any, nd: int) -> tuple[int, ...]:
    return tuple(int(i) for i in v) if isinstance(v, (tuple, list)) else (int(v),) * nd


# ==================================================================================================
# autograd.Functions
# ==================================================================================================
_CONV = {
    2: (dnn_conv, dnn_gradinput, dnn_gradweight),
    3: (dnn_conv3d, dnn_gradinput3d, dnn_gradweight3d),
}


class ConvFn(torch.autograd.Function):
    """``dnn_conv`` (cross-correlation, PyTorch's convolution) with its two gradients; the bias
    is fused when ``dnn_conv`` takes ``bias=``, its gradient is ``dy`` summed over N and space."""

    @staticmethod
    def forward(ctx, x, w, b, nd, pad, stride, dil, groups):
        ready()
        s = stream_of(x)
        fwd = _CONV[nd][0]
        kw = {"border_mode": pad, "subsample": stride, "dilation": dil, "conv_mode": "cross",
              "num_groups": groups, "stream": s}  # fmt: skip
        if b is not None and FUSED_BIAS:
            y = to_torch(fwd(x, w, bias=b, **kw))
        else:
            y = to_torch(fwd(x, w, **kw))
            if b is not None:
                y.add_(b.view((1, -1) + (1,) * nd))
        ctx.save_for_backward(x, w)
        ctx.cfg = (nd, pad, stride, dil, groups, b is not None)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        nd, pad, stride, dil, groups, has_bias = ctx.cfg
        dy = dense(dy)
        s = stream_of(dy)
        _fwd, gradinput, gradweight = _CONV[nd]
        kw = {"border_mode": pad, "subsample": stride, "dilation": dil, "conv_mode": "cross",
              "num_groups": groups, "stream": s}  # fmt: skip
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            dx = gradinput(w, dy, tuple(x.shape), out=torch.empty_like(x), **kw)
        if ctx.needs_input_grad[1]:
            dw = gradweight(x, dy, tuple(w.shape), out=torch.empty_like(w), **kw)
        if has_bias and ctx.needs_input_grad[2]:
            db = dy.sum(dim=(0, *range(2, 2 + nd)))
        return dx, dw, db, None, None, None, None, None


class PoolFn(torch.autograd.Function):
    """``dnn_pool`` / ``dnn_pool_grad``."""

    @staticmethod
    def forward(ctx, x, ws, stride, pad, mode):
        ready()
        y = to_torch(dnn_pool(x, ws, stride, mode, pad, stream=stream_of(x)))
        ctx.save_for_backward(x, y)
        ctx.cfg = (ws, stride, pad, mode)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x, y = ctx.saved_tensors
        ws, stride, pad, mode = ctx.cfg
        dy = dense(dy)
        dx = dnn_pool_grad(x, y, dy, ws, stride, mode, pad, img_grad=torch.empty_like(x),
                           stream=stream_of(dy))  # fmt: skip
        return dx, None, None, None, None


class BNTrainFn(torch.autograd.Function):
    """``dnn_batch_normalization_train`` (running averages updated in place) and
    ``dnn_batch_normalization_grad``. *running* is ``(mean, var)`` or None: a tuple, so autograd
    does not take the buffers for inputs."""

    @staticmethod
    def forward(ctx, x, w, b, running, eps, factor):
        ready()
        s = stream_of(x)
        y = torch.empty_like(x)
        if running is not None:
            _, mean, invstd, _, _ = dnn_batch_normalization_train(
                x, w, b, "spatial", eps, factor, running[0], running[1], inplace_running=True,
                out=y, stream=s)  # fmt: skip
        else:
            _, mean, invstd = dnn_batch_normalization_train(
                x, w, b, "spatial", eps, factor, out=y, stream=s
            )
        ctx.save_for_backward(x, w, to_torch(mean), to_torch(invstd))
        ctx.eps = eps
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x, w, mean, invstd = ctx.saved_tensors
        dy = dense(dy)
        dx, dw, db = dnn_batch_normalization_grad(
            x, dy, w, mean, invstd, "spatial", ctx.eps, out=torch.empty_like(x),
            stream=stream_of(dy))  # fmt: skip
        return dx, to_torch(dw), to_torch(db), None, None, None


class BNEvalFn(torch.autograd.Function):
    """``dnn_batch_normalization_test``; its gradient (cuDNN has none for inference) is an
    affine map's: ``dx = dy * w * invstd``, ``dw = sum(dy * xhat)``, ``db = sum(dy)``."""

    @staticmethod
    def forward(ctx, x, w, b, mean, var, eps):
        ready()
        y = torch.empty_like(x)
        dnn_batch_normalization_test(x, w, b, mean, var, "spatial", eps, out=y, stream=stream_of(x))
        ctx.save_for_backward(x, w, mean, var)
        ctx.eps = eps
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x, w, mean, var = ctx.saved_tensors
        shape = (1, -1) + (1,) * (x.dim() - 2)
        dims = (0, *range(2, x.dim()))
        invstd = torch.rsqrt(var + ctx.eps)
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            dx = dy * (w * invstd).view(shape).to(dy.dtype)
        if ctx.needs_input_grad[1]:
            xhat = (x.to(w.dtype) - mean.view(shape)) * invstd.view(shape)
            dw = (dy.to(w.dtype) * xhat).sum(dims)
        if ctx.needs_input_grad[2]:
            db = dy.to(w.dtype).sum(dims)
        return dx, dw, db, None, None, None


# modes whose gradient cuDNN reads from y alone: in place, y stands in for x
Y_ONLY = ("relu", "sigmoid", "tanh", "clipped_relu")


class ActFn(torch.autograd.Function):
    """``dnn_activation`` / ``dnn_activation_grad``; in place (``out=x``) for the modes whose
    gradient needs only the output."""

    @staticmethod
    def forward(ctx, x, mode, coef, inplace):
        ready()
        s = stream_of(x)
        if inplace:
            dnn_activation(x, mode, coef, out=x, stream=s)
            ctx.mark_dirty(x)
            ctx.save_for_backward(x, x)
            y = x
        else:
            y = torch.empty_like(x)
            dnn_activation(x, mode, coef, out=y, stream=s)
            ctx.save_for_backward(x, y)
        ctx.cfg = (mode, coef, inplace)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x, y = ctx.saved_tensors
        mode, coef, inplace = ctx.cfg
        dy = dense(dy)
        if y.dtype == torch.bfloat16 or (mode == "clipped_relu" and inplace):
            # cuDNN's legacy activation backward has no bfloat16 kernel (NOT_SUPPORTED on an
            # H100, cuDNN 9.19), and its clipped-ReLU gradient keeps dy where x == coef: after an
            # in-place forward x is the clipped output, equal to coef exactly where it clipped
            return _act_grad(mode, coef, x, y, dy), None, None, None
        dx = dnn_activation_grad(y, dy, x, mode, coef, out=torch.empty_like(y),
                                 stream=stream_of(dy))  # fmt: skip
        return dx, None, None, None


def _act_grad(mode: str, coef: float, x: Any, y: Any, dy: Any) -> Any:
    """The activations' gradients as torch expressions (torch's own formulas, from y where
    the mode allows it)."""
    if mode == "relu":
        return dy * (y > 0)
    if mode == "clipped_relu":
        return dy * ((y > 0) & (y < coef))
    if mode == "sigmoid":
        return dy * y * (1 - y)
    if mode == "tanh":
        return dy * (1 - y * y)
    if mode == "elu":
        return dy * torch.where(x > 0, torch.ones_like(y), y + coef)
    if mode == "swish":
        sg = torch.sigmoid(coef * x)
        return dy * (sg + coef * x * sg * (1 - sg))
    return dy


class SoftmaxFn(torch.autograd.Function):
    """``dnn_softmax`` / ``dnn_softmax_grad`` over dim 1 (``algo`` ``'accurate'`` or ``'log'``)."""

    @staticmethod
    def forward(ctx, x, algo):
        ready()
        y = torch.empty_like(x)
        dnn_softmax(x, algo, "channel", out=y, stream=stream_of(x))
        ctx.save_for_backward(y)
        ctx.algo = algo
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        dy = dense(dy)
        dx = dnn_softmax_grad(dy, y, ctx.algo, "channel", out=torch.empty_like(y),
                              stream=stream_of(dy))  # fmt: skip
        return dx, None


class DropoutPool:
    """The :class:`~pycudnn.DropoutState` objects of one module: one per forward whose backward
    is pending (a state holds the mask of its last forward), reused afterwards (creating one
    initialises cuDNN's RNG states, ~20 ms). Seeds come from torch's CPU generator, so
    ``torch.manual_seed`` makes the masks reproducible."""

    def __init__(self) -> None:
        self.free: list[DropoutState] = []

    def take(self) -> DropoutState:
        if self.free:
            return self.free.pop()
        return DropoutState(seed=int(torch.randint(0, 2**62, (1,)).item()))

    def give(self, state: DropoutState) -> None:
        self.free.append(state)


class DropoutFn(torch.autograd.Function):
    """``dnn_dropout`` / ``dnn_dropout_grad`` with a state of the module's pool."""

    @staticmethod
    def forward(ctx, x, p, pool, inplace, keep):
        ready()
        state = pool.take()
        s = stream_of(x)
        if inplace:
            dnn_dropout(x, p, state=state, out=x, stream=s)
            ctx.mark_dirty(x)
            y = x
        else:
            y = torch.empty_like(x)
            dnn_dropout(x, p, state=state, out=y, stream=s)
        if keep:  # a backward will come: the state keeps its mask until then
            ctx.state, ctx.pool = state, pool
        else:
            pool.give(state)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        state = ctx.state
        dy = dense(dy)
        dx = dnn_dropout_grad(dy, state, out=torch.empty_like(dy), stream=stream_of(dy))
        ctx.pool.give(state)
        ctx.state = None
        return dx, None, None, None, None


class LRNFn(torch.autograd.Function):
    """``dnn_lrn`` / ``dnn_lrn_grad``."""

    @staticmethod
    def forward(ctx, x, n, alpha, beta, k):
        ready()
        y = torch.empty_like(x)
        dnn_lrn(x, n, alpha, beta, k, out=y, stream=stream_of(x))
        ctx.save_for_backward(x, y)
        ctx.cfg = (n, alpha, beta, k)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x, y = ctx.saved_tensors
        dy = dense(dy)
        dx = dnn_lrn_grad(y, dy, x, *ctx.cfg, out=torch.empty_like(x), stream=stream_of(dy))
        return dx, None, None, None, None


class RNNRun:
    """What one RNN forward hands its backward: the block, whether it trained, its generation
    (the block's reserve space holds the last training forward's intermediates)."""

    __slots__ = ("block", "dropout", "gen", "lstm", "track", "training")

    def __init__(self, block: RNNBlock, track: dict, training: bool, lstm: bool, dropout: float):
        self.block, self.track, self.training, self.lstm = block, track, training, lstm
        self.dropout = dropout
        self.gen = 0


class RNNFn(torch.autograd.Function):
    """``RNNBlock.apply`` (training mode when a gradient is wanted) and ``RNNBlock.backward``."""

    @staticmethod
    def forward(ctx, run, x, hx, cx, w):
        ready()
        block = run.block
        y, hy, cy = _rnn_outputs(block, x, run.lstm)
        outs = (y, hy, cy) if run.lstm else (y, hy)
        block.apply(w, x, hx, cx, training=run.training, out=outs, stream=stream_of(x))
        if run.training:
            gen = run.track["gen"] = run.track.get("gen", 0) + 1
            run.track[id(block)] = run.gen = gen
        ctx.run = run
        ctx.save_for_backward(x, hx, cx, w, y)
        ctx.set_materialize_grads(False)
        if run.lstm:
            return y, hy, cy
        return y, hy, None

    @staticmethod
    @once_differentiable
    def backward(ctx, dy, dhy, dcy):
        run = ctx.run
        x, hx, cx, w, y = ctx.saved_tensors
        if not run.training:
            raise RuntimeError(
                "pycudnn.torch: this RNN forward ran in inference mode (no gradient was needed "
                "then); cuDNN's RNN backward needs a training-mode forward"
            )
        block = run.block
        s = stream_of(x)
        if run.track.get(id(block)) != run.gen:
            # another training forward of this module ran since, or a backward consumed the
            # reserve space (cuDNN's backward updates it): recompute it
            if run.dropout:
                raise RuntimeError(
                    "pycudnn.torch: the RNN module ran another training forward (or a backward) "
                    "since this forward; with dropout > 0 its dropout mask cannot be recomputed "
                    "(run one backward per forward, before the next forward, or use dropout=0)"
                )
            scratch = _rnn_outputs(block, x, run.lstm)
            block.apply(w, x, hx, cx, training=True, out=scratch if run.lstm else scratch[:2],
                        stream=s)  # fmt: skip
            run.track[id(block)] = run.gen
        dy = torch.zeros_like(y) if dy is None else dy.contiguous()
        dhy = None if dhy is None else dhy.contiguous()
        dcy = None if dcy is None or not run.lstm else dcy.contiguous()
        dx = torch.empty_like(x)
        dhx = torch.empty(hy_shape(x, block), dtype=x.dtype, device=x.device)
        outs: tuple = (dx, dhx)
        if run.lstm:
            dcx = torch.empty((dhx.shape[0], dhx.shape[1], block.hidden_size), dtype=x.dtype,
                              device=x.device)  # fmt: skip
            outs = (dx, dhx, dcx)
        need_w = ctx.needs_input_grad[4]
        dw = torch.empty_like(w) if need_w else None
        block.backward(w, x, hx, cx, y, dy, dhy, dcy, dw=dw, weights=need_w, out=outs, stream=s)
        run.track[id(block)] = None  # consumed: a second backward (retain_graph) recomputes
        dh = outs[1] if hx is not None else None
        dc = outs[2] if run.lstm and cx is not None else None
        return None, dx, dh, dc, dw


def hy_shape(x: torch.Tensor, block: RNNBlock) -> tuple[int, int, int]:
    """``(num_layers * num_directions, N, proj_size or hidden_size)`` for input *x*."""
    n = x.shape[0] if block.batch_first else x.shape[1]
    return (block.num_layers * block.num_directions, n, block.out_size)


def _rnn_outputs(block: RNNBlock, x: torch.Tensor, lstm: bool) -> tuple:
    """New ``(y, hy, cy)`` tensors (cy None unless LSTM)."""
    t, n = (x.shape[1], x.shape[0]) if block.batch_first else (x.shape[0], x.shape[1])
    ysh = (n, t, block.output_size) if block.batch_first else (t, n, block.output_size)
    kw = {"dtype": x.dtype, "device": x.device}
    hsh = hy_shape(x, block)
    y = torch.empty(ysh, **kw)
    hy = torch.empty(hsh, **kw)
    cy = torch.empty((hsh[0], n, block.hidden_size), **kw) if lstm else None
    return y, hy, cy


class LayerNormFn(torch.autograd.Function):
    """``dnn_layer_norm`` (cuDNN's training phase when a gradient is wanted, else its inference
    phase, which keeps no statistics) and ``dnn_layer_norm_grad``. *w* and *b* may be None
    (``elementwise_affine=False``, ``bias=False``)."""

    @staticmethod
    def forward(ctx, x, w, b, shape, eps, grad):
        ready()
        y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        _, mean, invstd = dnn_layer_norm(x, shape, w, b, eps, training=grad, out=y,
                                         stream=stream_of(x))  # fmt: skip
        if grad:
            ctx.save_for_backward(x, w, to_torch(mean), to_torch(invstd))
            ctx.cfg = (shape, b is not None)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x, w, mean, invstd = ctx.saved_tensors
        shape, has_bias = ctx.cfg
        dy = dense(dy)
        dx, dw, db = dnn_layer_norm_grad(dy, x, mean, invstd, shape, w, stream=stream_of(dy))
        need = ctx.needs_input_grad
        return (
            to_torch(dx) if need[0] else None,
            to_torch(dw) if need[1] and dw is not None else None,
            to_torch(db) if need[2] and has_bias and db is not None else None,
            None,
            None,
            None,
        )


class RMSNormFn(torch.autograd.Function):
    """``dnn_rms_norm`` (training phase when a gradient is wanted) and ``dnn_rms_norm_grad``;
    *w* may be None."""

    @staticmethod
    def forward(ctx, x, w, shape, eps, grad):
        ready()
        y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        _, invrms = dnn_rms_norm(x, shape, w, eps, training=grad, out=y, stream=stream_of(x))
        if grad:
            ctx.save_for_backward(x, w, to_torch(invrms))
            ctx.shape = shape
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x, w, invrms = ctx.saved_tensors
        dy = dense(dy)
        dx, dw = dnn_rms_norm_grad(dy, x, invrms, ctx.shape, w, stream=stream_of(dy))
        need = ctx.needs_input_grad
        return (
            to_torch(dx) if need[0] else None,
            to_torch(dw) if need[1] and dw is not None else None,
            None,
            None,
            None,
        )


def attention_out(q: torch.Tensor, dv: int) -> torch.Tensor:
    """An empty ``(B, H, S_q, dv)`` output in *q*'s memory order: the ``transpose(1, 2)`` view of
    a ``(B, S_q, H, dv)`` tensor when q is such a view (heads inside sequence), else packed."""
    b, h, s, _ = q.shape
    if h > 1 and s > 1 and q.stride(1) < q.stride(2):
        return torch.empty((b, s, h, dv), dtype=q.dtype, device=q.device).transpose(1, 2)
    return torch.empty((b, h, s, dv), dtype=q.dtype, device=q.device)


class SDPAFn(torch.autograd.Function):
    """``dnn_sdpa`` / ``dnn_sdpa_grad`` on 4-D ``(B, H, S, D)`` operands (no mask tensor).

    The forward runs cuDNN's training variant (which also returns the softmax statistics) when
    a gradient is wanted or dropout is on, the inference variant otherwise. With dropout the
    backward passes the forward's *seed*, so cuDNN regenerates the same mask."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale, p, seed, grad):
        ready()
        out = attention_out(q, v.shape[3])
        r = dnn_sdpa(q, k, v, None, causal, scale, p, seed, grad or p > 0.0, out=out,
                     stream=stream_of(q))  # fmt: skip
        if grad:
            ctx.save_for_backward(q, k, v, out, to_torch(r[1]))
            ctx.cfg = (causal, scale, p, seed)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        q, k, v, out, stats = ctx.saved_tensors
        causal, scale, p, seed = ctx.cfg
        if dout.stride() != out.stride():  # an expanded or otherwise laid-out gradient
            dout = torch.empty_like(out).copy_(dout)
        det = True if torch.are_deterministic_algorithms_enabled() else None
        dq, dk, dv = dnn_sdpa_grad(q, k, v, out, dout, stats, None, causal, scale, p, seed,
                                   deterministic=det, stream=stream_of(dout))  # fmt: skip
        need = ctx.needs_input_grad
        return (
            to_torch(dq) if need[0] else None,
            to_torch(dk) if need[1] else None,
            to_torch(dv) if need[2] else None,
            None,
            None,
            None,
            None,
            None,
        )
