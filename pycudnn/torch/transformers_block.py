"""transformers' GPT-2 block as one launch program (imports torch, never transformers): the
module classes whose ``forward`` is transformers' ``GPT2Block.forward``, converted by
:func:`~pycudnn.torch.convert` (issue 37, "transformer blocks as launch programs").

A converted GPT-2 block used to run as transformers wrote it: its Python (the block's, the
attention's with its cache and interface lookups, the MLP's, four ``Conv1D`` modules'), two
converted layer norms and the attention route, each a Python ``autograd.Function`` with its own
signature, and some thirty autograd nodes. On a host-bound training step that Python, not the
GPU, sets the step time (docs/BENCHMARKS.md, *Launch programs*). The twin
(:class:`TransformersGPT2Block`) runs the same operations as one straight line: the three cuDNN
launches (layer norm, attention, layer norm) bound to the block's signature once and replayed
(:mod:`._binding`), torch's products, tanh GELU and residual adds between them, and **one**
``autograd.Function`` per block whose backward is the same straight line reversed (the bound
gradient launches of the two norms and the attention, torch's products and reductions).

Recognition is by source text, not by name: the block's ``forward`` and, per call, the
``forward`` of its attention, MLP and ``Conv1D`` classes must each be one of the versions this
module knows (:data:`DIGESTS`: transformers 5.17 and 5.25, text hashed with
:func:`source_digest`). A version whose text differs runs its own ``forward`` (safe: the twin
then only adds a check per call). The program runs where it computes what the class's own code
would; everything else runs the class's own ``forward``:

* the block's norms are converted (:class:`~pycudnn.torch.norm.LayerNorm`) with both parameters,
  its activation is the converted tanh GELU, its attention routed to pycudnn
  (``attn_implementation="pycudnn"``), self-attention only, every dropout off (``p == 0`` or in
  eval mode);
* a CUDA float16/bfloat16 input, contiguous, no autocast, no ``torch.compile`` tracing or
  ``torch.func`` transform;
* no attention mask (causal attention without padding: transformers passes none), no encoder
  states; a ``DynamicCache`` or none. While this layer's cache is empty (a training step, a
  prompt) the keys and values are given to it as transformers gives them, as outputs of the
  block's node (a gradient reaching them through the cache is added to the block's). After
  that (a decode's tokens: one query, no gradient) they are appended first and the attention
  reads the whole cache, its launch bound per key length by the attention route's own store
  (:func:`~.attention.bound_attention`), not by the block's program.

The outputs are transformers' (the same launches on the same operands; the products' gradients
come from the same torch operations autograd would run). The first call of a signature records
the launches through the adapter's lean paths (which validate everything); a call whose
signature differs records anew (:data:`~._binding.MAX_BINDINGS` kept per block).
"""

from __future__ import annotations

import hashlib
import inspect
import textwrap
import weakref
from threading import get_ident
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from ..graph import _plans
from ..highlevel import _call
from . import _binding
from ._compile import PLAIN, compiling
from ._module import STATE, CodeTwin, state
from ._runtime import autocast_dtype, raw_stream, transforming
from .attention import (
    attention_sig,
    bound_attention,
    cudnn_attention,
    cudnn_operands,
    sdpa_grad_outputs,
    sdpa_grad_run,
    sdpa_outputs,
    sdpa_run,
)
from .attention_scope import count_transformers_call
from .norm import (
    LayerNorm,
    layer_norm_grad_outputs,
    layer_norm_grad_run,
    layer_norm_outputs,
    layer_norm_run,
)
from .transformers_act import TransformersGELU

__all__ = ["DIGESTS", "TransformersGPT2Block", "block_hits", "source_digest"]

#: per part, the :func:`source_digest` of each known version of its class's ``forward``
#: (transformers 5.17 and 5.25)
DIGESTS: dict[str, frozenset[str]] = {
    "block": frozenset(("3557dd43d6b9d524", "a54b217bf7ad0ef6")),
    "attention": frozenset(("d489e79b6ea113ae", "6469342857296de2")),
    "mlp": frozenset(("1eed132cfd804cbb", "0fea3365a3fd9df3")),
    "conv1d": frozenset(("2de078e4b215d5ec",)),
}

_HALVES = (torch.float16, torch.bfloat16)
# the block's keyword arguments (both spellings of the cache's) and where the program takes them
_KNOWN_KW = frozenset(
    ("past_key_values", "cache", "attention_mask", "encoder_hidden_states",
     "encoder_attention_mask", "use_cache", "position_ids")
)  # fmt: skip
_NONE_KW = ("attention_mask", "encoder_hidden_states", "encoder_attention_mask")

_DIGEST_OF: weakref.WeakKeyDictionary[Any, str | None] = weakref.WeakKeyDictionary()
_CLASS_OK: weakref.WeakKeyDictionary[type, bool] = weakref.WeakKeyDictionary()


def source_digest(fn: Any) -> str | None:
    """The first 16 hex digits of the SHA-256 of *fn*'s source text (``inspect.getsource``,
    decorators unwrapped as it does, dedented, trailing spaces dropped), or None where there is
    no source (built in, made at run time)."""
    try:
        cached = _DIGEST_OF.get(fn)
    except TypeError:  # not weakly referable
        cached = None
    if cached is not None:
        return cached
    try:
        src = inspect.getsource(fn)
    except (OSError, TypeError):
        return None
    text = "\n".join(line.rstrip() for line in textwrap.dedent(src).strip().splitlines())
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    try:
        _DIGEST_OF[fn] = digest
    except TypeError:
        pass
    return digest


def _known(cls: type, part: str) -> bool:
    """Whether class *cls*'s ``forward`` is a known version of *part*'s (cached per class)."""
    ok = _CLASS_OK.get(cls)
    if ok is None:
        ok = _CLASS_OK[cls] = source_digest(getattr(cls, "forward", None)) in DIGESTS[part]
    return ok


def _quiet(d: Any) -> bool:
    return isinstance(d, nn.Dropout) and not (d.training and d.p > 0)


def _parts(m: nn.Module) -> tuple | None:
    """The block's parts ``(ln_1, attn, ln_2, mlp)`` where the program computes what its code
    does, else None (see the module docstring)."""
    mods = m._modules
    ln1, attn, ln2, mlp = mods.get("ln_1"), mods.get("attn"), mods.get("ln_2"), mods.get("mlp")
    if not (isinstance(ln1, LayerNorm) and isinstance(ln2, LayerNorm)):
        return None
    if not (_known(type(attn), "attention") and _known(type(mlp), "mlp")):
        return None
    am, mm = attn._modules, mlp._modules
    for conv in (am.get("c_attn"), am.get("c_proj"), mm.get("c_fc"), mm.get("c_proj")):
        if not _known(type(conv), "conv1d"):
            return None
    if not (isinstance(mm.get("act"), TransformersGELU) and _quiet(mm.get("dropout"))):
        return None
    if not (_quiet(am.get("attn_dropout")) and _quiet(am.get("resid_dropout"))):
        return None
    cfg = getattr(attn, "config", None)
    if getattr(cfg, "_attn_implementation", None) != "pycudnn" or attn.is_cross_attention:
        return None
    if attn.split_size != attn.embed_dim or attn.head_dim * attn.num_heads != attn.embed_dim:
        return None
    return ln1, attn, ln2, mlp


def _cache_of(args: tuple, kwargs: dict) -> tuple[bool, Any]:
    """``(ok, cache)``: whether the call's arguments are ones the program takes (the cache
    positional or by either name, no mask or encoder states), and the cache."""
    if len(args) > 5 or not _KNOWN_KW.issuperset(kwargs):
        return False, None
    if any(a is not None for a in args[1:4]) or any(kwargs.get(k) is not None for k in _NONE_KW):
        return False, None
    cache = args[0] if args else kwargs.get("past_key_values", kwargs.get("cache"))
    return True, cache


def _fresh_cache(cache: Any, layer: Any) -> bool:
    """A ``DynamicCache`` whose layer *layer* holds nothing yet (its update returns the keys and
    values given, concatenated to nothing)."""
    if not _cache_kind(cache, layer):
        return False
    try:
        return cache.get_seq_length(layer) == 0
    except Exception:  # (a cache of another make: its own forward decides)
        return False


def _cache_kind(cache: Any, layer: Any) -> bool:
    """A ``DynamicCache`` (its update concatenates: keys and values packed, all of them read)."""
    return type(cache).__name__ == "DynamicCache" and isinstance(layer, int)


def _sig(x: torch.Tensor, lns: tuple, wqkv: torch.Tensor, grad: bool, cfg: tuple) -> tuple:
    """The block call's signature (:mod:`._binding`): what the bound launches' operands depend
    on -- the input, the norms' parameters, the products' widths -- the mode, the thread."""
    ps = tuple((p.shape, p.stride(), p.dtype, p.get_device(), p.data_ptr() & 15) for p in lns)
    return (
        x.shape, x.stride(), x.dtype, x.get_device(), x.data_ptr() & 15, ps, wqkv.shape,
        wqkv.dtype, grad, cfg, _call.snapshot(), _plans.stats.clears, get_ident(),
    )  # fmt: skip


class _Run:
    """One run of a block's program: its binding's entries replayed (*bd* given), or each
    launch recorded through the lean path (*bd* None; :attr:`entries` then collects them)."""

    __slots__ = ("bd", "entries", "stream")

    def __init__(self, bd: Any) -> None:
        self.bd = bd
        self.entries: list = []
        self.stream = raw_stream(bd.index) if bd is not None else 0

    def site(self, i: int, ins: tuple, outs: Any, run: Any, *args: Any) -> Any:
        bd = self.bd
        if bd is not None:
            entry = bd.meta[0][i]
            if entry is not None:
                o = outs()
                if _binding.launch(entry, ins, o, self.stream):
                    return o
            return run(*args)
        out, entry = _binding.record(run, ins, *args)
        self.entries.append(entry)
        return out


def _ln(r: _Run, i: int, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float,
        grad: bool) -> tuple:  # fmt: skip
    shape = (x.shape[-1],)
    o = r.site(i, (x, w, b), lambda: layer_norm_outputs(x, shape, grad), layer_norm_run, x, w,
               b, shape, eps, grad)  # fmt: skip
    return (o[0], None, None) if len(o) == 1 else o


def _attend(r: _Run, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
            scale: float, grad: bool) -> tuple:  # fmt: skip
    o = r.site(1, (q, k, v), lambda: sdpa_outputs(q, v.shape[3], grad), sdpa_run, q, k, v,
               None, causal, scale, 0.0, None, grad)  # fmt: skip
    return (o[0], None) if len(o) == 1 else o


def _attend_cached(r: _Run, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                   cache: Any, layer: int) -> torch.Tensor:  # fmt: skip
    """A decode token's attention: the keys and values appended to *cache* first, as
    transformers' attention does, then attention over all of them through the attention
    route's own store (:func:`~.attention.bound_attention`: the keys' length grows each token,
    so the launch is bound per length there, not in the block's program)."""
    k, v = cache.update(k, v, layer)
    r.entries.append(None)  # (the program's attention site stays empty)
    sig = attention_sig(q, k, v, 0.0, False, scale, False)
    if sig is not None:
        out = bound_attention(sig, q, k, v)
        if out is not None:
            return out
    ops = cudnn_operands(q, k, v, None, 0.0, False)
    if ops is None:  # (asked before the cache changed, on the block's shapes: not expected)
        raise RuntimeError("pycudnn: cuDNN's attention refused a GPT-2 block's decode operands")
    return cudnn_attention(*ops, None, 0.0, False, scale, sig, (q, k, v))


def _forward(
    r: _Run, x: torch.Tensor, p: tuple, cfg: tuple, grad: bool, cache: Any = None, layer: int = 0
) -> tuple:
    """The block's forward as transformers computes it: ``(out, q, k, v, saved)``, *saved* what
    the backward reads (None without *grad*). With a *cache* (a decode token, no gradient) the
    keys and values go to the cache before the attention, which reads all of it."""
    g1, b1, wqkv, bqkv, wo, bo, g2, b2, wf, bf, wp, bp = p
    heads, causal, scale, eps1, eps2 = cfg
    bsz, t, c = x.shape
    n, d = bsz * t, c // heads
    y1, m1, r1 = _ln(r, 0, x, g1, b1, eps1, grad)
    qkv = torch.addmm(bqkv, y1.view(n, c), wqkv).view(bsz, t, 3 * c)
    q, k, v = (z.view(bsz, t, heads, d).transpose(1, 2) for z in qkv.split(c, dim=2))
    if cache is not None:
        o, st = _attend_cached(r, q, k, v, scale, cache, layer), None
    else:
        o, st = _attend(r, q, k, v, causal, scale, grad)
    o2 = o.transpose(1, 2).reshape(n, c)
    hm = torch.addmm(bo, o2, wo).view(bsz, t, c).add_(x)
    y2, m2, r2 = _ln(r, 2, hm, g2, b2, eps2, grad)
    f = torch.addmm(bf, y2.view(n, c), wf)
    g = F.gelu(f, approximate="tanh")
    out = torch.addmm(bp, g, wp).view(bsz, t, c).add_(hm)
    if not grad:
        return out, q, k, v, None
    return out, q, k, v, (x, y1, m1, r1, q, k, v, o, st, o2, hm, y2, m2, r2, f, g)


def _ln_grad(bd: Any, tag: Any, dy, x, w, b, mean, inv) -> tuple:
    args = (dy, x, mean, inv, (x.shape[-1],), w, b)
    if bd is None:
        return layer_norm_grad_run(*args)
    ops = (dy, x, w, mean, inv)
    stream = raw_stream(bd.index)
    return _binding.backward(bd, tag, dy, stream, ops, layer_norm_grad_outputs,
                             layer_norm_grad_run, *args)  # fmt: skip


def _attend_grad(bd: Any, q, k, v, o, do, st, causal: bool, scale: float) -> tuple:
    det = True if torch.are_deterministic_algorithms_enabled() else None
    args = (q, k, v, o, do, st, None, causal, scale, 0.0, None, False)
    if bd is None:
        return sdpa_grad_run(*args)[:3]
    ops = (q, k, v, o, do, st)
    stream = raw_stream(bd.index)
    return _binding.backward(bd, ("attention", det), do, stream, ops, sdpa_grad_outputs,
                             sdpa_grad_run, *args)[:3]  # fmt: skip


class _BlockFn(torch.autograd.Function):
    """One GPT-2 block: ``apply(bd, cfg, kv, sink, x, *params)`` -> ``out`` (``(out, k, v)``
    with *kv*: the keys and values for the cache, as transformers' attention gives them to it);
    a run that records (*bd* None) puts its entries in the list *sink*."""

    @staticmethod
    def forward(
        ctx: Any, bd: Any, cfg: tuple, kv: bool, sink: list, x: torch.Tensor, *p: torch.Tensor
    ) -> Any:
        r = _Run(bd)
        out, _q, k, v, saved = _forward(r, x, p, cfg, True)
        ctx.set_materialize_grads(False)
        g1, b1, wqkv, _, wo, _, g2, b2, wf, _, wp, _ = p
        ctx.save_for_backward(*saved, g1, b1, wqkv, wo, g2, b2, wf, wp)
        ctx.bd, ctx.cfg = bd, cfg
        sink.extend(r.entries)
        return (out, k, v) if kv else out

    @staticmethod
    def backward(ctx: Any, dout: Any, *dkv: Any) -> Any:
        (x, y1, m1, r1, q, k, v, o, st, o2, hm, y2, m2, r2, f, g,
         g1, b1, wqkv, wo, g2, b2, wf, wp) = ctx.saved_tensors  # fmt: skip
        bd, (heads, causal, scale, _e1, _e2) = ctx.bd, ctx.cfg
        need = ctx.needs_input_grad[4:]
        bsz, t, c = x.shape
        n = bsz * t
        if dout is None:
            dout = torch.zeros_like(x)
        d = dout.reshape(n, c)
        dwp = g.t().mm(d) if need[10] else None
        dbp = d.sum(0) if need[11] else None
        df = torch.ops.aten.gelu_backward(d.mm(wp.t()), f, approximate="tanh")
        dwf = y2.view(n, c).t().mm(df) if need[8] else None
        dbf = df.sum(0) if need[9] else None
        dy2 = df.mm(wf.t()).view(bsz, t, c)
        dhm, dg2, db2 = _ln_grad(bd, 2, dy2, hm, g2, b2, m2, r2)
        dhm = dhm.add_(dout).view(n, c)
        dwo = o2.t().mm(dhm) if need[4] else None
        dbo = dhm.sum(0) if need[5] else None
        do = dhm.mm(wo.t()).view(bsz, t, heads, c // heads).transpose(1, 2)
        dq, dk, dv = _attend_grad(bd, q, k, v, o, do, st, causal, scale)
        if dkv and dkv[0] is not None:  # the cache's keys and values were differentiated too
            dk = dk + dkv[0]
        if len(dkv) > 1 and dkv[1] is not None:
            dv = dv + dkv[1]
        dqkv = torch.cat([z.transpose(1, 2) for z in (dq, dk, dv)], dim=2).view(n, 3 * c)
        dwqkv = y1.view(n, c).t().mm(dqkv) if need[2] else None
        dbqkv = dqkv.sum(0) if need[3] else None
        dy1 = dqkv.mm(wqkv.t()).view(bsz, t, c)
        dx, dg1, db1 = _ln_grad(bd, 0, dy1, x, g1, b1, m1, r1)
        dx = dx.add_(dhm.view(bsz, t, c))
        grads = (dg1, db1, dwqkv, dbqkv, dwo, dbo, dg2, db2, dwf, dbf, dwp, dbp)
        grads = tuple(gr if nd else None for gr, nd in zip(grads, need[1:], strict=True))
        return (None, None, None, None, dx if need[0] else None, *grads)


def _params(ln1: nn.Module, attn: nn.Module, ln2: nn.Module, mlp: nn.Module) -> tuple | None:
    am, mm = attn._modules, mlp._modules
    p = (
        ln1.weight, ln1.bias, am["c_attn"].weight, am["c_attn"].bias, am["c_proj"].weight,
        am["c_proj"].bias, ln2.weight, ln2.bias, mm["c_fc"].weight, mm["c_fc"].bias,
        mm["c_proj"].weight, mm["c_proj"].bias,
    )  # fmt: skip
    return None if any(type(t) not in PLAIN for t in p) else p


def _program(m: nn.Module, x: Any, args: tuple, kwargs: dict) -> Any:
    """The block's output by its program, or None where the class's own ``forward`` must run
    (see the module docstring)."""
    if type(x) not in PLAIN or compiling() or transforming() or autocast_dtype() is not None:
        return None
    if not x.is_cuda or x.dim() != 3 or x.dtype not in _HALVES or not x.is_contiguous():
        return None
    ok, cache = _cache_of(args, kwargs)
    if not ok:
        return None
    parts = _parts(m)
    if parts is None:
        return None
    ln1, attn, ln2, mlp = parts
    grad = torch.is_grad_enabled()
    decode = False
    if cache is not None and not _fresh_cache(cache, attn.layer_idx):
        # a token after the prompt: no gradient, one query (a longer one would need a mask)
        if grad or x.shape[1] != 1 or not _cache_kind(cache, attn.layer_idx):
            return None
        decode = True
    p = _params(ln1, attn, ln2, mlp)
    if p is None or x.shape[2] != attn.embed_dim:
        return None
    grad = grad and (x.requires_grad or any(t.requires_grad for t in p))
    causal = bool(x.shape[1] > 1 and attn.is_causal)
    cfg = (attn.num_heads, causal, float(attn.scaling), float(ln1.eps), float(ln2.eps))
    st = STATE.get(m)
    if st is not None and st.get("nobind"):
        return None
    sig = _sig(x, (p[0], p[1], p[6], p[7]), p[2], grad, (cfg, decode))
    bound = None if st is None else st.get("bound")
    bd = None if not bound else _binding.find(bound, sig)
    if bd is None and not _first_call_runs(x, attn, grad):
        return None
    kv = cache is not None and not decode
    count_transformers_call()
    if grad:
        sink: list = []
        res = _BlockFn.apply(bd, cfg, kv, sink, x, *p)
        out, k, v = res if kv else (res, None, None)
    else:
        r = _Run(bd)
        out, _q, k, v, _ = _forward(r, x, p, cfg, False, cache if decode else None,
                                    attn.layer_idx)  # fmt: skip
        sink = r.entries
    if bd is None:
        entries = (*sink, None, None, None)[:3]
        _binding.keep(state(m), sig, None, x.get_device(), (entries,))
    else:
        bd.hits += 1
    if kv:
        cache.update(k, v, attn.layer_idx)
    return out


def _first_call_runs(x: torch.Tensor, attn: nn.Module, grad: bool) -> bool:
    """Whether cuDNN's fused attention takes this block's operands (the route's own question,
    asked once per signature, on the shapes the program's views will have)."""
    bsz, t, c = x.shape
    h = attn.num_heads
    qkv = x.new_empty((bsz, t, 3 * c)).requires_grad_(grad)
    q, k, v = (z.view(bsz, t, h, c // h).transpose(1, 2) for z in qkv.split(c, dim=2))
    ops = cudnn_operands(q, k, v, None, 0.0, False)
    return ops is not None and ops[0] is q and ops[1] is k and ops[2] is v


def block_hits(m: nn.Module) -> int:
    """Calls of block *m* that replayed a bound program (tests and diagnostics)."""
    st = STATE.get(m)
    bound = None if st is None else st.get("bound")
    return sum(b.hits for b in bound.values()) if bound else 0


class TransformersGPT2Block(CodeTwin):
    """The mixin of a transformers GPT-2 block's twin: ``forward`` runs the block as one launch
    program where it computes what the class's own ``forward`` would (see the module
    docstring), else that ``forward``."""

    references = ()

    @classmethod
    def recognizes(cls, forward: Any) -> bool:
        """Whether *forward* is a known version of ``GPT2Block.forward``."""
        return source_digest(forward) in DIGESTS["block"]

    def forward(self, hidden_states: Any, *args: Any, **kwargs: Any) -> Any:
        """As the transformers class's ``forward``."""
        out = _program(self, hidden_states, args, kwargs)  # type: ignore[arg-type]
        if out is None:
            return super().forward(hidden_states, *args, **kwargs)  # type: ignore[misc]
        return out
