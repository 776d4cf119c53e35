"""Fused regions (imports torch): the connected fused convolution chains of a traced graph
(``convert(model, fuse=True)``) as one module that runs **launch programs** (:mod:`.program`).

A ResNet's blocks are such a region: every chain's input is the previous chain's output or the
region's input, and the residual is another chain's output. Per input signature (the inputs'
shapes, strides, dtypes, devices and alignments; training or eval; whether a gradient is wanted;
autocast's dtype; ``pycudnn.config``), the region's first run goes through the chains' own
forward (:class:`~.fused.FusedConv`: every check, every binding) while a tape records the
launches; later runs replay them as one program:

* **eval without a gradient**: one launch per chain (the convolution with batch norm folded in
  and its epilogue); intermediate results share one arena by lifetime. The folded weights are
  recomputed when a parameter or running statistic changes (its version counter or storage).
* **training**: the whole region is **one autograd node**, its forward one program (convolution
  and batch norm + residual + ReLU per chain; the running averages updated by cuDNN and
  ``num_batches_tracked`` counted, as the modules would) and its backward another (per chain,
  batch norm's fused gradient, then the data gradient accumulated in place where a tensor feeds
  several chains, then the weight gradient), both in one arena (the backward's gradients take
  the bytes of forward results it has read for the last time; what does not fit there goes to
  a buffer the backward makes as it runs, so the arena held through the forward is the
  forward's own size).

Programs are per thread (their entries hold the thread's cuDNN handle, as the lean path's do).
A region whose run cannot become a program (a chain that runs unfused for that signature: hooks,
a SiLU/GELU, CPU tensors, autocast in training, float32 ``Linear``..., or a torch operation
between its launches) runs its chains one by one, exactly as before, and says why in
:meth:`FusedRegion.programs`.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import torch
from torch import nn
from torch.autograd.function import once_differentiable

from .._config import config
from ..highlevel import _bound
from . import _lean
from ._compile import compiling
from ._module import state
from ._runtime import autocast_dtype, cuda_ok, dense, format_of, stream_of
from .chains import chain_operands, like_layout, ref, walk_backward, walk_forward
from .fold_kernel import warm
from .fused import hooked
from .fused_train import CUDNN, OWN, SEPARATE, TRAIN_ACTS, cfg_list
from .program import Program, held, record
from .region_folds import fold
from .region_ops import (
    Spec,
    op_region_eval,
    op_region_train,
    op_region_train_grad,
    register,
    spec_of,
)

__all__ = ["MAX_SIGNATURES", "FusedRegion", "use_programs"]

#: input signatures whose programs a region keeps (the oldest is dropped for a new one)
MAX_SIGNATURES = 8

#: chunks a training forward's arena is made of (a ``torch.empty`` each, per run): its backward
#: gives each back after the last launch that reads it, so the step's peak is not the whole
#: arena plus every gradient (a few: each costs an allocation per run)
ARENA_CHUNKS = 8
_ENABLED = [True]


def use_programs(enabled: bool) -> None:
    """Run fused regions as launch programs (the default) or, with False, their chains one by
    one as before programs existed (to compare, or to rule programs out when debugging).

    Parameters
    ----------
    enabled : bool
        Strictly a bool.
    """
    if type(enabled) is not bool:
        raise TypeError(f"use_programs: enabled must be a bool, got {enabled!r}")
    _ENABLED[0] = enabled


class _Bound:
    """What a region keeps per signature: its programs, or why there are none."""

    __slots__ = (
        "bwd",
        "casts",
        "ext",
        "fwd",
        "kept",
        "kernels",
        "pattern",
        "reason",
        "versions",
    )

    def __init__(self) -> None:
        self.fwd: Program | None = None
        self.bwd: Program | None = None
        self.pattern: list[bool] = []  # which gradients the backward program returns
        self.casts: tuple = (None, None, None)  # weights, batch-norm parameters, statistics
        self.reason = ""
        self.ext: list[int] = []  # eval: the folded weights' and biases' pointers
        self.versions: list[Any] = []
        self.kernels: tuple[str, ...] = ()  # training: each chain's batch-norm path
        # training: which of the forward's outputs its backward reads (the others are not kept
        # for it: they go when their readers are done, as a saved tensor's would)
        self.kept: tuple[bool, ...] = ()


#: how :meth:`FusedRegion.programs` names a chain's batch-norm path (``chain_path``'s)
_PATHS = {
    OWN: "pycudnn's kernels",
    CUDNN: "cuDNN's fused kernel",
    SEPARATE: "cuDNN's separate calls",
}


def _kernels(paths: tuple[str, ...]) -> str:
    """``'; batch norms: 4 on pycudnn's kernels, 12 on cuDNN's fused kernel'`` (the chains per
    path, in that order; '' without any: eval, or a signature not yet run)."""
    if not paths:
        return ""
    counts = [f"{paths.count(p)} on {name}" for p, name in _PATHS.items() if p in paths]
    return "; batch norms: " + ", ".join(counts)


class FusedRegion(nn.Module):
    """Connected :class:`~.fused.FusedConv` chains of a traced graph as one module (see the
    module docstring); registers nothing (``state_dict`` unchanged).

    Parameters
    ----------
    chains : sequence of FusedConv
        The chains in graph order.
    wiring : sequence of (int, int or None)
        Per chain, where its input and its residual come from: ``i >= 0`` the output of chain
        *i*, ``-1 - j`` the region's input *j*.
    outputs : sequence of int
        The chains whose outputs leave the region, in the order ``forward`` returns them.
    """

    def __init__(self, chains: Any, wiring: Any, outputs: Any) -> None:
        super().__init__()
        self.parts = tuple(chains)  # a tuple: nothing registered
        self.wiring = tuple(wiring)
        self.outputs = tuple(outputs)
        convs = [c.parts[0] for c in self.parts]
        bns = [c.parts[1] for c in self.parts]
        self._bns = tuple(bns)
        # the autograd inputs besides the region's: per chain the weight, then gamma and beta
        params: list[Any] = []
        for conv, bn in zip(convs, bns, strict=True):
            params += [conv.weight, bn.weight, bn.bias]
        self._params = tuple(params)
        # under torch.compile the region is its custom ops (region_ops), which know it by key
        convs = [None if c._cfg() is None else cfg_list(c._cfg()) for c in self.parts]
        acts = [None if c.act is None else (c.act.name, c.act.coef or 0.0) for c in self.parts]
        self.op_key = register(Spec(self.wiring, self.outputs, convs, acts))
        self._folds: OrderedDict = OrderedDict()  # the fold layouts of captured eval runs
        self._op_ok = None not in convs  # (read while dynamo traces: no registry lookup there)

    def extra_repr(self) -> str:
        return f"{len(self.parts)} chains, {len(self.outputs)} outputs"

    # -- the per-module path ----------------------------------------------------------------------
    def _chains(self, inputs: tuple) -> tuple:
        vals: list[torch.Tensor] = []
        for fc, (xr, zr) in zip(self.parts, self.wiring, strict=True):
            x = ref(xr, vals, inputs)
            vals.append(fc(x) if zr is None else fc(x, ref(zr, vals, inputs)))
        return tuple(vals[i] for i in self.outputs)

    def forward(self, *inputs: torch.Tensor) -> tuple:
        """The region's outputs: replayed programs where they exist for these inputs, else the
        chains one by one."""
        if _ENABLED[0]:
            out = self._compiled(inputs) if compiling() else self._program(inputs)
            if out is not None:
                return out
        return self._chains(inputs)

    # -- torch.compile: the region's custom ops --------------------------------------------------
    def _compiled(self, inputs: tuple) -> tuple | None:
        """While dynamo traces: the region as :mod:`.region_ops`' custom ops (one per direction,
        replaying programs), or None: the chains' own ops, as before."""
        if op_region_train is None or not self._op_ok or self._hooked():
            return None
        train = self._bns[0].training
        if any(b.training is not train for b in self._bns):
            return None
        if not all(cuda_ok(t) for t in inputs):
            return None
        ac = autocast_dtype()
        if ac is not None:  # the chains' inputs cast once, at the region
            inputs = tuple(t.to(ac) if t.dtype != torch.float64 else t for t in inputs)
        inputs = tuple(dense(t) for t in inputs)
        if train:
            return self._compiled_train(inputs, ac)
        grad = torch.is_grad_enabled() and (
            any(t.requires_grad for t in inputs) or any(p.requires_grad for p in self._params)
        )
        x = inputs[0]
        for fc in self.parts:
            bn = fc.parts[1]
            if grad or bn.running_mean is None or fc._inputs(x) is None:
                return None  # (with a gradient the modules run unfused, as in eager)
        params: list[torch.Tensor | None] = []
        for fc in self.parts:  # (the op folds them: region_folds)
            params += fc.fold_sources()
        eps = [fc.parts[1].eps for fc in self.parts]
        return tuple(op_region_eval(self.op_key, list(inputs), params, eps))

    def _compiled_train(self, inputs: tuple, ac: torch.dtype | None) -> tuple | None:
        if self._train_static(inputs, ac)[0]:
            return None
        if not all(cuda_ok(fc.parts[0].weight) for fc in self.parts):
            return None
        x = inputs[0]
        ws, gs, bs, running, params = [], [], [], [], []
        for fc in self.parts:
            args = fc.train_args(x, None, traced=True)  # (counts the batch)
            if args is None:  # the checks above said it would run: a bug, not a user error
                raise RuntimeError(
                    "pycudnn.torch: a chain of a fused region refused its operands after the "
                    "region's checks passed; please report this"
                )
            _, w, _, gamma, beta, _, run, blk, _ = args
            ws.append(w)
            gs.append(gamma)
            bs.append(beta)
            running += list(run)
            params += [float(blk.eps), float(blk.factor)]
        grad = torch.is_grad_enabled() and any(t.requires_grad for t in (*inputs, *ws, *gs, *bs))
        flat = torch.cat(running)  # one tensor: the op returns it updated
        if grad:
            res = _CompiledRegionFn.apply(
                self.op_key, len(inputs), params, *inputs, *ws, *gs, *bs, flat
            )
        else:
            res = op_region_train(self.op_key, list(inputs), ws, gs, bs, flat, params)
        new = res[-1].split([t.numel() for t in running])
        torch._foreach_copy_(self._running(), list(new))
        return tuple(res[:-2])

    # -- programs ---------------------------------------------------------------------------------
    def programs(self) -> list[tuple[Any, str]]:
        """Per recorded signature: ``(signature, what runs)``, e.g. ``'forward program of 104
        launches, backward program of 156 launches, one arena of N MiB'`` (N: the bytes of a
        step's intermediate results, allocated per run) or why the chains run one by one; in
        training then the kernels the chains' batch norms run on (:func:`_kernels`). Then the
        signatures its ops ran under ``torch.compile`` (``'compiled, training: ...'``,
        :meth:`~.region_ops.Spec.describe`)."""
        out = []
        for sig, b in state(self).get("programs", {}).items():
            if b.reason:
                what = f"the chains one by one: {b.reason}"
            elif b.fwd is None:
                what = "binding"
            else:
                what = f"forward program of {len(b.fwd)} launches"
                if b.bwd is not None:
                    what += f", backward program of {len(b.bwd)} launches, one"
                else:
                    what += ","
                what += f" arena of {b.fwd.arena_bytes / 2**20:.1f} MiB"
                own = 0 if b.bwd is None else b.bwd.own_peak()
                if own:  # (the backward's results outside the arena, made as it goes)
                    what += f" (and up to {own / 2**20:.1f} MiB as the backward runs)"
            out.append((sig, what + _kernels(b.kernels)))
        try:  # (a region unpickled in another process has no spec registered there)
            compiled = spec_of(self.op_key).describe()
        except KeyError:
            compiled = []
        return out + compiled

    def _signature(self, inputs: tuple) -> tuple | None:
        """The signature of this call, or None when no program can run it."""
        train = self._bns[0].training
        for b in self._bns:
            if b.training is not train:
                return None
        grad = torch.is_grad_enabled() and (
            any(t.requires_grad for t in inputs) or any(p.requires_grad for p in self._params)
        )
        if grad and not train:
            return None  # eval with a gradient: the modules unfused (the backward needs them)
        ac = autocast_dtype()
        metas = []
        for t in inputs:
            if not cuda_ok(t):
                return None
            metas.append((t.shape, t.stride(), t.dtype, t.get_device(), t.data_ptr() & 15))
        if inputs and _bound.current_device() != metas[0][3]:
            return None  # the entries launch on their device: the chains switch by themselves
        rg = tuple(p.requires_grad for p in self._params) if grad else ()
        # the thread: bound entries hold the calling thread's handle (the lean path's rule)
        return (train, grad, ac, config.snapshot(), tuple(metas), rg, threading.get_ident())

    def _store(self) -> OrderedDict:
        st = state(self)
        progs = st.get("programs")
        if progs is None:
            progs = st["programs"] = OrderedDict()
        return progs

    def _bound(self, sig: tuple) -> tuple[_Bound, bool]:
        progs = self._store()
        b = progs.get(sig)
        if b is not None:
            return b, False
        if len(progs) >= MAX_SIGNATURES:
            progs.popitem(last=False)
        b = progs[sig] = _Bound()
        return b, True

    def _program(self, inputs: tuple) -> tuple | None:
        sig = self._signature(inputs)
        if sig is None:
            return None
        b, new = self._bound(sig)
        if b.reason:
            return None
        train, grad, ac = sig[0], sig[1], sig[2]
        if ac is not None:  # under autocast: the chains' inputs cast once, at the region
            inputs = tuple(t.to(ac) if t.dtype != torch.float64 else t for t in inputs)
        if not train:
            return self._eval(b, inputs)
        if new:
            b.reason, b.casts = self._train_static(inputs, ac)
            if b.reason:
                return None
        if self._hooked():
            return None  # the modules run their hooks
        if grad:
            return _RegionFn.apply(self, b, len(inputs), *inputs, *self._params)
        return self._train_nograd(b, inputs)

    # -- eval --------------------------------------------------------------------------------
    def _eval(self, b: _Bound, inputs: tuple) -> tuple | None:
        if inputs[0].is_cuda and torch.cuda.is_current_stream_capturing():
            return self._eval_captured(b, inputs)
        if b.fwd is None:
            if inputs[0].is_cuda:  # a capture after this warm-up folds with pycudnn's kernels
                warm(inputs[0].device)
            with _lean.Tape() as tape:
                outs = self._chains(inputs)
            folds = []
            for fc in self.parts:
                hit = state(fc).get("fold")
                if hit is None:
                    b.reason = "a chain ran unfused"
                    return outs
                folds += [hit[1], hit[2]]
            got = record(tape.launches, [*inputs, *folds], list(outs), reuse=True)
            if isinstance(got, str):
                b.reason = got
                return outs
            b.fwd = got[0]
            b.ext = [t.data_ptr() for t in folds]
            b.versions = self._versions()
            return outs
        versions = self._versions()
        if versions != b.versions:  # a parameter or statistic changed: fold again
            x = inputs[0]
            fmt = format_of(x)
            ext: list[int] = []
            for fc in self.parts:
                w, bias = fc.folded(x.dtype, fmt)
                ext += [w.data_ptr(), bias.data_ptr()]
            b.ext, b.versions = ext, versions
        x = inputs[0]
        ptrs = [t.data_ptr() for t in inputs] + b.ext
        _, outs, _ = b.fwd.run(ptrs, x.device, stream_of(x))
        return tuple(outs)

    def _eval_captured(self, b: _Bound, inputs: tuple) -> tuple:
        """Eval inside a CUDA graph capture: the program (recorded outside a capture, before)
        on folds made in the capture (:func:`~.region_folds.fold`: two launches of pycudnn's
        fold kernels), so every replay folds the parameters and statistics of its moment, as a
        captured torch model reads its own; the kept folds are neither used nor replaced.
        Without a program yet, or with folds the program's plans do not take (a bias off 16
        bytes), the chains run (their folds also made in the capture) and nothing is recorded:
        a program must not keep pointers into the capture's memory."""
        if b.fwd is None:
            return self._chains(inputs)
        x = inputs[0]
        params: list[Any] = []
        for fc in self.parts:
            params += fc.fold_sources()
        eps = [float(fc.parts[1].eps) for fc in self.parts]
        ws, bs = fold(self._folds, params, eps, x, format_of(x))
        ext = [p for w, bias in zip(ws, bs, strict=True) for p in (w.data_ptr(), bias.data_ptr())]
        odd = 0
        for p in ext:
            odd |= p
        if odd & 15:  # (biases packed after channel counts that are no multiple of 16 bytes:
            return self._chains(inputs)  # the program's plans were chosen for aligned ones)
        ptrs = [t.data_ptr() for t in inputs] + ext
        _, outs, _ = b.fwd.run(ptrs, x.device, stream_of(x))
        return tuple(outs)

    def _versions(self) -> list[Any]:
        out = []
        for fc in self.parts:
            for t in fc.fold_sources():
                if t is not None:
                    out.append((t._version, t.data_ptr()))
        return out

    # -- training --------------------------------------------------------------------------------
    def _train_static(self, inputs: tuple, ac: torch.dtype | None) -> tuple[str, tuple]:
        """Why the chains cannot run as one training node for these inputs ('' when they can);
        reads no data and changes nothing. With it, the casts the node makes once per step:
        the convolution weights to autocast's dtype, batch norm's half-precision parameters and
        statistics to float32 (cuDNN's batch norm takes them in float32)."""
        x = inputs[0]
        pdt = torch.float64 if x.dtype == torch.float64 else torch.float32
        cast_w = cast_bn = False
        for fc in self.parts:
            conv, bn, _, _ = fc.parts
            if fc.act is not None and fc.act.name not in TRAIN_ACTS:
                return f"the {fc.act.name} epilogue runs unfused in training", ()
            if fc._cfg() is None or conv.bias is not None:
                return "a convolution with a bias or padding cuDNN does not take", ()
            w = conv.weight
            if w.dtype != x.dtype:
                if ac is None or w.dtype == torch.float64 or x.dtype != ac:
                    return "a convolution weight of another dtype than the input", ()
                cast_w = True
            if w.device != x.device or fc.nd + 2 != x.dim() or not _dense(w):
                return "a convolution weight on another device, of another rank, or not dense", ()
            if not (bn.affine and bn.track_running_stats) or bn.momentum is None:
                return "a batch norm without affine parameters, running statistics or momentum", ()
            for t in (bn.weight, bn.bias, bn.running_mean, bn.running_var):
                if t.device != x.device or not t.is_contiguous():
                    return "a batch-norm parameter or statistic on another device or strided", ()
                if t.dtype != pdt:
                    if pdt == torch.float64 or t.dtype not in (torch.float16, torch.bfloat16):
                        return f"a batch-norm parameter or statistic of {t.dtype} for {x.dtype}", ()
                    cast_bn = True
        for t in inputs:
            if t.dtype != x.dtype or t.device != x.device:
                return "inputs of several dtypes or devices", ()
        convs = [fc.parts[0].weight for fc in self.parts]
        gb = [t for bn in self._bns for t in (bn.weight, bn.bias)]
        return "", (
            _Cast(convs, x.dtype) if cast_w else None,
            _Cast(gb, pdt) if cast_bn else None,
            _Cast(self._running(), pdt) if cast_bn else None,
        )

    def _hooked(self) -> bool:
        return any(hooked(fc.parts[0]) or hooked(fc.parts[1]) for fc in self.parts)

    def _train_nograd(self, b: _Bound, inputs: tuple) -> tuple:
        if b.fwd is None:
            outs, _, taped = self.bind_forward(b, inputs)
            got = taped if isinstance(taped, str) else record(*taped, reuse=True)
            if isinstance(got, str):
                b.reason = got
            else:
                b.fwd = got[0]
            return tuple(outs)
        outs, _ = self._run_forward(b, inputs)
        return tuple(outs)

    def _cast_bufs(self, casts: tuple) -> list[torch.Tensor | None]:
        """This step's cast buffers (one concatenation and one cast each)."""
        return [None if c is None else c.pack() for c in casts]

    def _external(self, inputs: tuple, casts: tuple, bufs: list, ptrs: bool) -> list[Any]:
        """The forward's external operands: the inputs, then per chain the weight, gamma, beta
        and the running averages the launches read (cast views where cast); as tensors (to
        record) or, *ptrs*, as their pointers (to replay)."""
        get = _ptr if ptrs else _same
        cw, cg, cr = (
            None if c is None else (c.ptrs(b) if ptrs else c.views(b))
            for c, b in zip(casts, bufs, strict=True)
        )
        ext = [get(t) for t in inputs]
        for i, (fc, bn) in enumerate(zip(self.parts, self._bns, strict=True)):
            ext.append(get(fc.parts[0].weight) if cw is None else cw[i])
            ext += [get(bn.weight), get(bn.bias)] if cg is None else cg[2 * i : 2 * i + 2]
            if cr is None:
                ext += [get(bn.running_mean), get(bn.running_var)]
            else:
                ext += cr[2 * i : 2 * i + 2]
        return ext

    def _write_back(self, casts: tuple, bufs: list) -> None:
        """Running averages updated in float32 copies: back into the modules' buffers."""
        if casts[2] is not None:
            casts[2].unpack(bufs[2])

    def _run_forward(self, b: _Bound, inputs: tuple) -> tuple[list, tuple]:
        x = inputs[0]
        bufs = self._cast_bufs(b.casts)
        ext = self._external(inputs, b.casts, bufs, ptrs=True)
        torch._foreach_add_(self._counts(), 1)  # as each module counts its batch
        assert b.fwd is not None
        arena, outs, slots = b.fwd.run(ext, x.device, stream_of(x))
        self._write_back(b.casts, bufs)
        _increment(self._running())  # cuDNN wrote them: as an in-place op would
        # (the outputs the backward reads, kept for it; none without a backward program)
        keep = [] if b.bwd is None else [o for o, k in zip(outs, b.kept, strict=True) if k]
        return outs, (arena, keep, slots, bufs)

    def rerun_forward(self, b: _Bound, inputs: tuple) -> tuple:
        """The forward program once more for a second backward of one forward
        (``retain_graph=True``): the first backward ran in the forward's arena, wrote over the
        results it had read last (:func:`~.program.held`) and gave the arena back. Returns what
        the backward reads (``_run_forward``'s second result); the running averages and batch
        counts are left as the forward left them."""
        x = inputs[0]
        running = self._running()
        kept = [t.clone() for t in running]
        bufs = self._cast_bufs(b.casts)  # (cast running averages: copies, not written back)
        ext = self._external(inputs, b.casts, bufs, ptrs=True)
        assert b.fwd is not None
        arena, outs, slots = b.fwd.run(ext, x.device, stream_of(x))
        with torch.no_grad():
            torch._foreach_copy_(running, kept)
        return arena, outs, slots, bufs

    def _counts(self) -> list[torch.Tensor]:
        return [bn.num_batches_tracked for bn in self._bns]

    def _running(self) -> list[torch.Tensor]:
        out = []
        for bn in self._bns:
            out += [bn.running_mean, bn.running_var]
        return out

    def bind_forward(self, b: _Bound, inputs: tuple) -> tuple[list, list, Any]:
        """The first training run of a signature: every chain's own forward (its checks and
        bindings) under a tape. Returns ``(outputs, records, taped)``, *taped* what
        :func:`~.program.record` takes to make the forward program, ``(launches, external
        operands, outputs)``, or why the run cannot be replayed (the run itself is the
        chains' own, hence correct). The program is made once the places its results need
        are known: at once without a gradient, by the first backward with one (what that
        backward reads must outlive the forward; the rest may share bytes)."""
        bufs = self._cast_bufs(b.casts)
        ext = self._external(inputs, b.casts, bufs, ptrs=False)
        n_in = len(inputs)
        # the region's operands (its casts made once for all chains)
        operands = chain_operands(ext, n_in, len(self.parts))

        def prepare(c: int, x: torch.Tensor, z: torch.Tensor | None) -> tuple:
            args = self.parts[c].train_args(x, z)
            if args is None:  # _train_static said it would run: a bug, not a user error
                raise RuntimeError(
                    "pycudnn.torch: a chain of a fused region refused its operands after the "
                    "region's checks passed; please report this"
                )
            return args[0], args[5], args[7]

        outs, recs, why, launches = walk_forward(
            self.wiring, self.outputs, inputs, operands, prepare
        )
        b.kernels = tuple(r[6][0] for r in recs)
        self._write_back(b.casts, bufs)
        return outs, recs, why or (launches, ext, outs)

    def bind_programs(
        self, b: _Bound, taped: tuple, launches: list, douts: tuple, results: list
    ) -> str:
        """The forward and backward programs from the first step's tapes (*taped*: what
        :meth:`bind_forward` gave; *launches*: the backward's), kept in *b*; or why not. The
        forward's results that the backward reads live on to the end of the forward, the others
        share bytes; the backward's intermediate results take the bytes of the forward's once
        their last reader has run (:func:`~.program.held`): one arena for the step, given back
        as the backward ends, where autograd frees each saved tensor after its last use. What
        the backward cannot fit into the forward's arena goes to a buffer the backward makes as
        it runs: the forward's arena is not grown (held through the forward, its bytes would
        add to the step's peak) for bytes only the backward uses."""
        read = {id(t) for _, ts in launches for t in ts}
        got = record(*taped, reuse=True, live=read, chunks=ARENA_CHUNKS)
        if isinstance(got, str):
            return got
        prog, tensors = got
        busy = held(prog, tensors, launches)
        bwd = record(launches, [*douts, *tensors], results, reuse=True, busy=busy)
        if isinstance(bwd, str):
            return bwd
        b.fwd, b.bwd = prog, bwd[0]
        b.pattern = [r is not None for r in results]
        b.kept = _kept(taped[1], taped[2], read)
        return ""

    def bind_backward(self, inputs: tuple, recs: list, douts: tuple, need: tuple) -> tuple:
        """The first backward of a signature (:func:`~.chains.walk_backward`): ``(gradients of
        the inputs and parameters, launches or None)``."""
        return walk_backward(self.outputs, inputs, recs, douts, need)


#: the most elements of a gradient :func:`_cast_small` casts with the others (a batch norm's
#: parameters' are a few thousand; a weight's gradient is cast on its own, at memory speed)
SMALL_GRAD = 1 << 16


def _cast_small(grads: list, inputs: tuple) -> list:
    """*grads* (one per input, or None), each small one whose dtype is not its input's cast to
    it together with the others of its kind: one concatenation and one cast, the gradients
    views of the result, where autograd would cast each in a launch of its own (a ResNet-50 in
    float16 returns 106 float32 batch-norm gradients a step)."""
    kinds: dict[tuple, list[int]] = {}
    for i, (g, t) in enumerate(zip(grads, inputs, strict=True)):
        if g is not None and g.dtype != t.dtype and g.numel() <= SMALL_GRAD:
            kinds.setdefault((g.dtype, t.dtype, g.device), []).append(i)
    for (_, dt, _), idx in kinds.items():
        if len(idx) > 1:
            flat = torch.cat([grads[i].reshape(-1) for i in idx]).to(dt)
            for i, part in zip(idx, flat.split([grads[i].numel() for i in idx]), strict=True):
                grads[i] = part.view(grads[i].shape)
    return grads


def _kept(ext: list, outs: list, read: set[int]) -> tuple[bool, ...]:
    """For each output a forward program makes (``record`` skips the None and those the
    caller gives), whether its backward reads it (``read``: the ``id`` of each tensor its
    launches touch)."""
    seen = {id(t) for t in ext}
    kept = []
    for o in outs:
        if o is not None and id(o) not in seen:
            seen.add(id(o))
            kept.append(id(o) in read)
    return tuple(kept)


def _ptr(t: torch.Tensor) -> int:
    return t.data_ptr()


def _same(t: torch.Tensor) -> torch.Tensor:
    return t


def _increment(tensors: list[torch.Tensor]) -> None:
    try:
        torch.autograd.graph.increment_version(tensors)
    except TypeError:  # an older torch: one tensor a call
        for t in tensors:
            torch.autograd.graph.increment_version(t)


class _RegionFn(torch.autograd.Function):
    """A fused region in training as one autograd node: its forward and backward programs, or
    (the first run of a signature) the chains' own code under tapes, which record them."""

    @staticmethod
    def forward(ctx, region: FusedRegion, b: _Bound, n_in: int, *flat: torch.Tensor):
        inputs = flat[:n_in]
        # (spent: a binding run's first backward has run)
        ctx.region, ctx.b, ctx.n_in, ctx.spent = region, b, n_in, False
        if b.fwd is not None and b.bwd is not None:
            outs, run = region._run_forward(b, inputs)
            ctx.run, ctx.bind = run, None
        else:
            outs, recs, got = region.bind_forward(b, inputs)
            ctx.run, ctx.bind = None, (recs, got)
        ctx.out_meta = [(o.stride(), o.dtype) for o in outs]
        ctx.save_for_backward(*flat)
        return tuple(outs)

    @staticmethod
    @once_differentiable
    def backward(ctx, *douts: torch.Tensor):
        region, b, n_in = ctx.region, ctx.b, ctx.n_in
        flat = ctx.saved_tensors  # the version checks: nothing saved was changed in place
        need = ctx.needs_input_grad[3:]
        douts = tuple(like_layout(d, *m) for d, m in zip(douts, ctx.out_meta, strict=True))
        if ctx.bind is None:  # programs: this forward's results, or a rerun's (retain_graph)
            run = ctx.run if ctx.run is not None else region.rerun_forward(b, flat[:n_in])
            # the arena goes back as this backward ends (before autograd casts the gradients
            # this node returns), not when the graph is dropped: the results a backward read
            # are no more, as autograd frees saved tensors; a second backward reruns the forward
            ctx.run = None
            arena, slots = run[0], run[2]
            x = douts[0]
            ptrs = [d.data_ptr() for d in douts] + slots
            _, grads, _ = b.bwd.run(ptrs, x.device, stream_of(x), arena)
            it = iter(grads)
            results = [next(it) if n else None for n in b.pattern]
            return (None, None, None, *_cast_small(results, flat))
        recs, got = ctx.bind
        results, launches = region.bind_backward(flat[:n_in], recs, douts, need)
        if ctx.spent:  # a second backward (retain_graph) where the first recorded nothing
            return (None, None, None, *results)
        ctx.spent = True
        # (gradients of cast operands, a float32 dgamma or a bfloat16 dw, go back in their
        # inputs' dtypes: autograd casts what a node returns to its input's dtype)
        if isinstance(got, str):
            b.reason = got
        elif launches is None:
            b.reason = "a torch operation between the backward's launches"
        else:
            why = region.bind_programs(b, got, launches, douts, results)
            if why:
                b.reason = why
            else:  # the chains' records go: a second backward reruns the programs
                ctx.bind = None
        return (None, None, None, *results)


class _CompiledRegionFn(torch.autograd.Function):
    """A region in training under ``torch.compile``: :data:`~.region_ops.op_region_train`
    forward (a mutating op, which ``torch.library`` gives no autograd formula, so dynamo traces
    this Function around it, as :class:`~.fused_train.TrainFn`) and
    :data:`~.region_ops.op_region_train_grad` backward. *flat* is the inputs, then the chains'
    weights, gammas and betas, then the running averages in one tensor (returned updated,
    after the outputs and the arena)."""

    @staticmethod
    def forward(ctx, key: int, n_in: int, params: list, *flat: torch.Tensor):
        n = (len(flat) - n_in - 1) // 3
        inputs, ws = flat[:n_in], flat[n_in : n_in + n]
        gs, bs = flat[n_in + n : n_in + 2 * n], flat[n_in + 2 * n : n_in + 3 * n]
        res = op_region_train(key, list(inputs), list(ws), list(gs), list(bs), flat[-1], params)
        ctx.save_for_backward(*flat[: n_in + 3 * n], *res[:-1])
        ctx.key, ctx.n_in, ctx.n, ctx.params = key, n_in, n, params
        ctx.mark_non_differentiable(res[-2], res[-1])
        return tuple(res)

    @staticmethod
    def backward(ctx, *grads: torch.Tensor):
        n_in, n = ctx.n_in, ctx.n
        saved = ctx.saved_tensors
        inputs, ws = saved[:n_in], saved[n_in : n_in + n]
        gs, bs = saved[n_in + n : n_in + 2 * n], saved[n_in + 2 * n : n_in + 3 * n]
        outs, arena = saved[n_in + 3 * n : -1], saved[-1]
        need = ctx.needs_input_grad[3 : 3 + n_in + 3 * n]
        # the op's order: the inputs, then per chain (weight, gamma, beta)
        order = list(range(n_in)) + [n_in + k * n + c for c in range(n) for k in range(3)]
        res = op_region_train_grad(
            ctx.key, list(grads[:-2]), list(outs), list(inputs), list(ws), list(gs), list(bs),
            arena, ctx.params, [int(need[i]) for i in order],
        )  # fmt: skip
        got: list[Any] = [None] * (n_in + 3 * n)
        for j, i in enumerate(order):
            got[i] = res[j] if need[i] else None
        return (None, None, None, *got, None)


def _dense(t: torch.Tensor) -> bool:
    """*t*'s elements fill its storage span with no gaps (any dim order)."""
    if t.is_contiguous():
        return True
    return t.dim() in (4, 5) and t.is_contiguous(
        memory_format=torch.channels_last if t.dim() == 4 else torch.channels_last_3d
    )


class _Cast:
    """Tensors cast to one dtype once per step: one concatenation of their elements in memory
    order and one cast, with each tensor's place in the buffer (its own strides kept)."""

    def __init__(self, srcs: list[torch.Tensor], dtype: torch.dtype) -> None:
        self.srcs = srcs
        self.dtype = dtype
        self.sizes = [t.numel() for t in srcs]
        self.starts = [sum(self.sizes[:i]) for i in range(len(srcs))]
        self.itemsize = torch.empty((), dtype=dtype).element_size()
        self._flat: tuple[list[int], list[torch.Tensor]] = ([], [])

    def _flats(self) -> list[torch.Tensor]:
        ptrs = [t.data_ptr() for t in self.srcs]
        if ptrs != self._flat[0]:  # 1-D views in memory order, remade when storage moves
            flats = [
                t.as_strided((t.numel(),), (1,), t.storage_offset())
                if not t.is_contiguous()
                else t.view(-1)
                for t in self.srcs
            ]
            self._flat = (ptrs, flats)
        return self._flat[1]

    def pack(self) -> torch.Tensor:
        return torch.cat(self._flats()).to(self.dtype)

    def views(self, buf: torch.Tensor) -> list[torch.Tensor]:
        return [
            buf.as_strided(t.shape, t.stride(), s)
            for t, s in zip(self.srcs, self.starts, strict=True)
        ]

    def ptrs(self, buf: torch.Tensor) -> list[int]:
        base, isz = buf.data_ptr(), self.itemsize
        return [base + s * isz for s in self.starts]

    def unpack(self, buf: torch.Tensor) -> None:
        """Copy *buf* back into the source tensors (in their dtype)."""
        back = buf.to(self.srcs[0].dtype).split(self.sizes)
        torch._foreach_copy_(self._flats(), list(back))
