"""Fused regions under ``torch.compile`` (imports torch): a region as **one custom op per
direction** that replays its launch programs, instead of one custom op per chain.

Under ``torch.compile`` a region used to trace into its chains' ops (``pycudnn::conv_fused``,
``pycudnn::conv_bn_train``): each a Python call through torch's dispatcher with the lean path's
cost, twice per chain in training, so a compiled converted model was host-bound. Now the traced
region is (programs: :mod:`.program`):

* ``pycudnn::region_eval(key, inputs, params, eps) -> outputs``: the chains with batch norm
  folded in, one program per signature. *params* are each chain's raw parameters and the op
  folds them (:mod:`.region_folds`: few launches per region, kept between calls while they do
  not change, made anew inside a CUDA-graph capture);
* ``pycudnn::region_train(key, inputs, weights, gammas, betas, running, params) -> outputs +
  [arena, running]`` (*running* every chain's running mean and variance in one tensor, which
  comes back updated and the traced graph copies into the modules: torch's functionalization
  takes no op that both mutates an argument and returns a list) and
  ``pycudnn::region_train_grad(key, douts, outs, inputs, weights, gammas, betas, arena, params,
  need) -> gradients``: the training forward and backward programs. What the backward reads
  (each chain's convolution output, statistics, reserve space and inner results) travels as
  one ``uint8`` *arena* whose layout (:func:`saved_layout`) the fakes compute too, so the
  compiled graph owns it like any activation: CUDA graphs (``mode="reduce-overhead"``) capture
  and replay it with no state outside the graph.

*key* names a region's :class:`Spec` (its wiring and per-chain convolution and activation,
fixed at ``convert``; copies of a model share it, as they share the structure) and its programs
per signature, which the real implementations keep. A signature's first run walks the chains
(:mod:`.chains`) under a tape; a run that cannot become a program (a torch operation between
launches) walks them every time, with the same results.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import torch

from .._config import config
from ..highlevel import _bound
from . import _lean
from ._compile import define
from ._runtime import dense, format_of, like, ready, stream_of
from .chains import chain_operands, like_layout, ref, walk_backward, walk_forward
from .conv import conv_out_shape
from .fused import conv_fused_call
from .fused_train import CUDNN, SEPARATE, TrainBlock, cfg_of, chain_path
from .program import ALIGN, Program, record
from .region_folds import PER_CHAIN, fold

__all__ = [
    "MAX_SIGNATURES",
    "Spec",
    "op_region_eval",
    "op_region_train",
    "op_region_train_grad",
    "register",
    "saved_layout",
    "spec_of",
]

#: signatures whose programs a spec keeps per direction (the oldest is dropped for a new one)
MAX_SIGNATURES = 8


class _Programs:
    """One signature's programs, or why its runs walk the chains: the forward's (*fwd*, or
    *reason*), the training forward's arena layout, and per pattern of wanted gradients the
    backward's ``(program, which results it returns, the arena offsets it reads)`` or why
    not (*bwd*)."""

    __slots__ = ("bwd", "fwd", "layout", "reason")

    def __init__(self) -> None:
        self.fwd: Program | None = None
        self.reason = ""
        self.layout: tuple | None = None
        self.bwd: dict[tuple, Any] = {}


def _what(p: _Programs) -> str:
    """What runs for one compiled signature (:meth:`Spec.describe`)."""
    if p.reason:
        return f"the chains one by one: {p.reason}"
    if p.fwd is None:
        return "binding"
    what = f"forward program of {len(p.fwd)} launches"
    for got in p.bwd.values():  # (per pattern of wanted gradients)
        if isinstance(got, tuple):
            what += f", backward program of {len(got[0])} launches"
        else:
            what += f", a backward of the chains one by one: {got}"
    return what + f", arena of {p.fwd.arena_bytes / 2**20:.1f} MiB"


class Spec:
    """What the region ops know of a region: per chain where its input and residual come from
    (*wiring*), which chains leave it (*outputs*), each chain's convolution (``cfg_list``
    form, or None where cuDNN takes no such padding) and activation ``(name, coef)`` or None;
    the signatures cuDNN's fused batch norm refused per chain; the programs per signature; the
    eval folds kept (:func:`~.region_folds.fold`)."""

    __slots__ = ("acts", "convs", "eval", "folds", "outputs", "refused", "train", "wiring")

    def __init__(self, wiring: Sequence[tuple], outputs: Sequence[int], convs, acts) -> None:
        self.wiring = tuple(wiring)
        self.outputs = tuple(outputs)
        self.convs = tuple(None if c is None else tuple(c) for c in convs)
        self.acts = tuple(acts)
        self.refused: tuple[set, ...] = tuple(set() for _ in self.wiring)
        self.eval: OrderedDict = OrderedDict()
        self.train: OrderedDict = OrderedDict()
        self.folds: OrderedDict = OrderedDict()

    def describe(self) -> list[tuple[tuple, str]]:
        """The compiled runs' programs per signature, as :meth:`FusedRegion.programs
        <pycudnn.torch.region.FusedRegion.programs>` says them: ``(signature, 'compiled,
        training: forward program of N launches, backward program of M launches, arena of X
        MiB')``, eval's first."""
        out = []
        for mode, store in (("eval", self.eval), ("training", self.train)):
            out += [(sig, f"compiled, {mode}: {_what(p)}") for sig, p in store.items()]
        return out

    def programs(self, store: OrderedDict, sig: tuple) -> _Programs:
        got = store.get(sig)
        if got is None:
            if len(store) >= MAX_SIGNATURES:
                store.popitem(last=False)
            got = store[sig] = _Programs()
        return got


_SPECS: dict[int, Spec] = {}
_KEYS = itertools.count(1)


def register(spec: Spec) -> int:
    """Keep *spec* for the ops; returns its key (an int the traced graph carries)."""
    key = next(_KEYS)
    _SPECS[key] = spec
    return key


def spec_of(key: int) -> Spec:
    """The :class:`Spec` registered under *key*."""
    spec = _SPECS.get(key)
    if spec is None:
        raise KeyError(f"pycudnn.torch: no fused region is registered under key {key}")
    return spec


def _blocks(spec: Spec, params: Sequence[float]) -> list[TrainBlock]:
    """Per chain its :class:`~.fused_train.TrainBlock` (*params* per chain ``eps, factor``)."""
    out = []
    for c, (conv, act) in enumerate(zip(spec.convs, spec.acts, strict=True)):
        eps, factor = params[2 * c], params[2 * c + 1]
        out.append(TrainBlock(cfg_of(list(conv)), eps, factor, act, spec.refused[c]))
    return out


def _signature(
    inputs: Sequence[torch.Tensor],
    weights: Sequence[torch.Tensor],
    gammas: Sequence[torch.Tensor],
) -> tuple:
    """A run's signature: the inputs' shapes, strides, dtypes, devices and alignments, the
    dtypes of the weights and of the batch-norm parameters (eval: the folded biases) and their
    joint alignment (their layouts are fixed by the traced graph or the folds' layout), the
    current device, ``pycudnn.config`` and the thread (entries hold its handle)."""
    metas = tuple((t.shape, t.stride(), t.dtype, t.get_device(), t.data_ptr() & 15) for t in inputs)
    align = 0
    for group in (weights, gammas):
        for t in group:
            align |= t.data_ptr()
    dts = (weights[0].dtype, gammas[0].dtype if gammas else None)
    return (
        metas,
        dts,
        align & 15,
        _bound.current_device(),
        config.snapshot(),
        threading.get_ident(),
    )


def _view(arena: torch.Tensor, place: tuple) -> torch.Tensor:
    """The tensor at *place* ``(shape, strides, dtype, offset)`` of *arena* (no copy)."""
    shape, stride, dtype, off = place
    span = (sum((n - 1) * s for n, s in zip(shape, stride, strict=True)) + 1) * dtype.itemsize
    if 0 in shape:
        span = 0
    return arena[off : off + span].view(dtype).as_strided(shape, stride)


def _meta(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(tuple(t.shape), t.stride(), dtype=t.dtype, device="meta")


def _place(t: torch.Tensor, top: int) -> tuple[tuple, int]:
    size = (t.numel() * t.element_size() + ALIGN - 1) // ALIGN * ALIGN
    return (tuple(int(n) for n in t.shape), t.stride(), t.dtype, top), top + size


# -- what a training forward leaves its backward -----------------------------------------------
def saved_layout(
    spec: Spec,
    inputs: Sequence[torch.Tensor],
    weights: Sequence[torch.Tensor],
    gammas: Sequence[torch.Tensor],
    params: Sequence[float],
) -> tuple[list[tuple], int, list[tuple]]:
    """Where a training forward leaves what its backward reads, in one arena. Returns
    ``(places, arena bytes, outputs)``: *places* per chain ``(out, conv_out, mean, invstd,
    reserve)``, each ``(shape, strides, dtype, offset)`` or None (*out* None for a chain whose
    output leaves the region, returned on its own; *reserve* None where the chain runs cuDNN's
    separate kernels); *outputs* the region outputs' ``(shape, strides, dtype)``. Computed from
    shapes alone (meta tensors), so the fakes give the real runs' layout."""
    dev = inputs[0].get_device()
    ins = [_meta(t) for t in inputs]
    vals: list[torch.Tensor] = []
    leaves = set(spec.outputs)
    blks = _blocks(spec, params)
    top = 0
    places: list[tuple] = []
    for c, (xr, zr) in enumerate(spec.wiring):
        x = dense(ref(xr, vals, ins))
        yc = like(conv_out_shape(x, weights[c], blks[c].cfg), x)
        vals.append(yc)  # the chain's output is laid out as its convolution's
        stat = torch.empty(tuple(gammas[c].shape), dtype=gammas[c].dtype, device="meta")
        out = None
        if c not in leaves:
            out, top = _place(yc, top)
        conv_out, top = _place(yc, top)
        mean, top = _place(stat, top)
        invstd, top = _place(stat, top)
        reserve = None
        path, n = chain_path(yc, gammas[c].dtype, blks[c].act, zr is not None, dev)
        if path:
            reserve, top = _place(torch.empty(n, dtype=torch.uint8, device="meta"), top)
        places.append((out, conv_out, mean, invstd, reserve))
    outs = [
        (tuple(int(n) for n in vals[i].shape), vals[i].stride(), vals[i].dtype)
        for i in spec.outputs
    ]
    return places, top, outs


# -- pycudnn::region_eval ----------------------------------------------------------------------
def _eval_impl(
    key: int,
    inputs: list[torch.Tensor],
    params: list[torch.Tensor | None],
    eps: list[float],
) -> list[torch.Tensor]:
    spec = spec_of(key)
    x = inputs[0]
    weights, biases = fold(spec.folds, params, eps, x, format_of(x))
    ext = list(inputs)
    for w, b in zip(weights, biases, strict=True):
        ext += [w, b]
    b = spec.programs(spec.eval, _signature(inputs, weights, biases))
    if b.fwd is not None:
        _, outs, _ = b.fwd.run([t.data_ptr() for t in ext], x.device, stream_of(x))
        return outs
    vals: list[torch.Tensor] = []
    with _lean.Tape() as tape:
        for c, (xr, zr) in enumerate(spec.wiring):
            name, coef = spec.acts[c] or ("", 0.0)
            z = None if zr is None else ref(zr, vals, inputs)
            xc = ref(xr, vals, inputs)
            conv = list(spec.convs[c])
            vals.append(conv_fused_call(xc, weights[c], biases[c], z, conv, name, coef))
    outs = [vals[i] for i in spec.outputs]
    if not b.reason:
        got = record(tape.launches, ext, outs, reuse=True)
        if isinstance(got, str):
            b.reason = got
        else:
            b.fwd = got[0]
    return outs


def _eval_fake(key, inputs, params, eps):
    spec = spec_of(key)
    weights = params[0::PER_CHAIN]
    vals: list[torch.Tensor] = []
    for c, (xr, _) in enumerate(spec.wiring):
        x = dense(ref(xr, vals, inputs))
        vals.append(like(conv_out_shape(x, weights[c], cfg_of(list(spec.convs[c]))), x))
    return [vals[i] for i in spec.outputs]


# -- pycudnn::region_train ---------------------------------------------------------------------
def _train_ext(inputs, weights, gammas, betas, running) -> list[torch.Tensor]:
    """The forward's external operands: the inputs, then per chain the weight, gamma, beta
    and the running mean and variance (views of *running*: per chain the mean, then the
    variance, each of the chain's channels)."""
    ext = list(inputs)
    at = 0
    for c, w in enumerate(weights):
        n = gammas[c].shape[0]
        ext += [w, gammas[c], betas[c], running[at : at + n], running[at + n : at + 2 * n]]
        at += 2 * n
    return ext


def _train_ptrs(inputs, weights, gammas, betas, running) -> list[int]:
    """:func:`_train_ext`'s pointers, without making the views."""
    ptrs = [t.data_ptr() for t in inputs]
    at, isz = running.data_ptr(), running.element_size()
    for c, w in enumerate(weights):
        n = gammas[c].shape[0] * isz
        ptrs += [w.data_ptr(), gammas[c].data_ptr(), betas[c].data_ptr(), at, at + n]
        at += 2 * n
    return ptrs


def _train_impl(
    key: int,
    inputs: list[torch.Tensor],
    weights: list[torch.Tensor],
    gammas: list[torch.Tensor],
    betas: list[torch.Tensor],
    running: torch.Tensor,
    params: list[float],
) -> list[torch.Tensor]:
    spec = spec_of(key)
    x = inputs[0]
    b = spec.programs(spec.train, _signature(inputs, weights, gammas))
    running = running.clone()  # updated below and returned: an op that mutates returns no list
    if b.fwd is not None:
        ptrs = _train_ptrs(inputs, weights, gammas, betas, running)
        chunks, outs, _ = b.fwd.run(ptrs, x.device, stream_of(x))
        return [*outs, chunks[0], running]  # (a fixed layout: one chunk)
    ready()
    ext = _train_ext(inputs, weights, gammas, betas, running)
    places, nbytes, _ = _layout(b, spec, inputs, weights, gammas, params)
    blks = _blocks(spec, params)
    operands = chain_operands(ext, len(inputs), len(blks))

    def prepare(c: int, xc: torch.Tensor, z: torch.Tensor | None) -> tuple:
        return dense(xc), None if z is None else dense(z), blks[c]

    outs, recs, why, launches = walk_forward(spec.wiring, spec.outputs, inputs, operands, prepare)
    arena = torch.empty(nbytes, dtype=torch.uint8, device=x.device)
    pins: dict[int, int] = {}
    for c, rec in enumerate(recs):
        _, yc, mean, invstd, y, reserve = rec[6]
        for t, p in zip((y, yc, mean, invstd, reserve), places[c], strict=True):
            if p is None or t is None:
                continue
            got = (tuple(t.shape), t.stride(), t.dtype)
            if got != p[:3]:  # the backward reads the arena: it would read what is not there
                raise RuntimeError(
                    f"pycudnn.torch: chain {c} of a compiled region saved {got} where the "
                    f"region's layout has {p[:3]}; please report this"
                )
            _view(arena, p).copy_(t)
            pins[id(t)] = p[3]
    if why:
        b.reason = b.reason or why
    elif not b.reason:
        got = record(launches, ext, outs, reuse=False, places=pins, arena_bytes=nbytes)
        if isinstance(got, str):
            b.reason = got
        else:
            b.fwd = got[0]
    return [*outs, arena, running]


def _layout(b: _Programs, spec: Spec, inputs, weights, gammas, params) -> tuple:
    """The signature's :func:`saved_layout`, computed once (by its first forward or backward)."""
    if b.layout is None:
        b.layout = saved_layout(spec, inputs, weights, gammas, params)
    return b.layout


def _train_fake(key, inputs, weights, gammas, betas, running, params):
    _, nbytes, outs = saved_layout(spec_of(key), inputs, weights, gammas, params)
    dev = inputs[0].device
    made = [torch.empty_strided(s, st, dtype=dt, device=dev) for s, st, dt in outs]
    return [*made, inputs[0].new_empty(nbytes, dtype=torch.uint8), torch.empty_like(running)]


# -- pycudnn::region_train_grad ----------------------------------------------------------------
def _grad_impl(
    key: int,
    douts: list[torch.Tensor],
    outs: list[torch.Tensor],
    inputs: list[torch.Tensor],
    weights: list[torch.Tensor],
    gammas: list[torch.Tensor],
    betas: list[torch.Tensor],
    arena: torch.Tensor,
    params: list[float],
    need: list[int],
) -> list[torch.Tensor]:
    spec = spec_of(key)
    x = inputs[0]
    b = spec.programs(spec.train, _signature(inputs, weights, gammas))
    places = _layout(b, spec, inputs, weights, gammas, params)[0]
    douts = [like_layout(d, o.stride(), o.dtype) for d, o in zip(douts, outs, strict=True)]
    wanted = tuple(bool(n) for n in need)
    bound = b.bwd.get(wanted)
    if isinstance(bound, tuple):
        prog, pattern, offs = bound
        base = arena.data_ptr()
        ptrs = [t.data_ptr() for g in (douts, inputs, weights, gammas, betas, outs) for t in g]
        _, grads, _ = prog.run(ptrs + [base + o for o in offs], x.device, stream_of(x))
        it = iter(grads)
        results: list[Any] = [next(it) if p else None for p in pattern]
    else:
        ready()
        results, launches, flat = _walk_back(
            spec, places, douts, outs, inputs, weights, gammas, betas, arena, params, wanted
        )
        if bound is None:
            if launches is None:
                b.bwd[wanted] = "a torch operation between the backward's launches"
            else:
                ext = [*douts, *inputs, *weights, *gammas, *betas, *outs, *flat]
                got = record(launches, ext, results, reuse=True)
                if isinstance(got, str):
                    b.bwd[wanted] = got
                else:
                    offs = [p[3] for chain in places for p in chain if p is not None]
                    b.bwd[wanted] = (got[0], [r is not None for r in results], offs)
    return [x.new_empty(0) if r is None else r for r in results]  # one new empty each


def _walk_back(spec, places, douts, outs, inputs, weights, gammas, betas, arena, params, need):
    """The backward's first run (or every run where it cannot be a program): the chains'
    records rebuilt from the arena, then :func:`~.chains.walk_backward`. Returns ``(results,
    launches, the arena's views in layout order)``."""
    blks = _blocks(spec, params)
    leaving = {c: i for i, c in enumerate(spec.outputs)}
    views, flat, ys = [], [], []
    for c, chain in enumerate(places):
        v = [None if p is None else _view(arena, p) for p in chain]
        flat += [t for t in v if t is not None]
        views.append(v)
        ys.append(outs[leaving[c]] if c in leaving else v[0])
    recs = []
    for c, (xr, zr) in enumerate(spec.wiring):
        _, yc, mean, invstd, reserve = views[c]
        path = chain_path(yc, gammas[c].dtype, blks[c].act, zr is not None)[0]  # the forward's
        if path == CUDNN and (yc.shape, yc.dtype) in spec.refused[c]:
            path = SEPARATE
        saved = (path, yc, mean, invstd, ys[c], reserve if path else None)
        z = None if zr is None else ref(zr, ys, inputs)
        recs.append((ref(xr, ys, inputs), weights[c], gammas[c], betas[c], z, blks[c], saved))
    results, launches = walk_backward(spec.outputs, inputs, recs, douts, need)
    return results, launches, flat


def _grad_fake(key, douts, outs, inputs, weights, gammas, betas, arena, params, need):
    n_in = len(inputs)
    res = [torch.empty_like(t) if need[i] else t.new_empty(0) for i, t in enumerate(inputs)]
    for c, w in enumerate(weights):
        res.append(torch.empty_like(w) if need[n_in + 3 * c] else w.new_empty(0))
        for k in (1, 2):
            g = gammas[c]
            res.append(torch.empty_like(g) if need[n_in + 3 * c + k] else g.new_empty(0))
    return res


#: ``pycudnn::region_eval(key, inputs, params, eps) -> outputs``: a region in eval mode;
#: *params* per chain the convolution's weight and bias, batch norm's weight, bias, running
#: mean and variance (:data:`~.region_folds.PER_CHAIN`), *eps* per chain batch norm's epsilon
op_region_eval = define("region_eval", _eval_impl, _eval_fake)
#: ``pycudnn::region_train(key, inputs, weights, gammas, betas, running, params) -> [*outputs,
#: arena, new running]``: a region's training forward (*running* one tensor of every chain's
#: mean then variance, returned updated; *params* per chain eps and momentum)
op_region_train = define("region_train", _train_impl, _train_fake)
#: ``pycudnn::region_train_grad(key, douts, outs, inputs, weights, gammas, betas, arena,
#: params, need) -> gradients`` of the inputs, then per chain of the weight, gamma and beta
#: (empty where *need*, in that order, says 0)
op_region_train_grad = define("region_train_grad", _grad_impl, _grad_fake)
