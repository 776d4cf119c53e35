"""Attention for models that call torch's function (imports torch): :func:`use_cudnn_attention`,
a scope routing ``torch.nn.functional.scaled_dot_product_attention`` to
:func:`~pycudnn.torch.scaled_dot_product_attention`, and :func:`register_transformers`, the
``"pycudnn"`` entry of HuggingFace transformers' ``AttentionInterface``.

Why a patch of the module attribute reaches unmodified models: HuggingFace's
``sdpa_attention_forward``, timm's attention blocks (``F.scaled_dot_product_attention``) and
torch's own ``F.multi_head_attention_forward`` (a module global of ``torch.nn.functional``) all
look the name up when they call it. Code that bound the function earlier
(``from torch.nn.functional import scaled_dot_product_attention`` at import) keeps torch's.

Why not torch's provider registry: ``torch.nn.attention.register_flash_attention_impl`` /
``activate_flash_attention_impl`` (torch 2.10 on, marked a prototype) swap the CUDA kernels of
aten's *flash* operators (``_scaled_dot_product_flash_attention`` and its backward) for a
provider's, process-wide, for every call torch's selector sends to flash. The provider must
then run all of them (it cannot hand one back to torch's kernel), with flash's outputs (its
log-sum-exp and Philox RNG state, which its backward is given). pycudnn declines a share of
those calls and draws its dropout masks from its own generator, so it does not register there.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn import functional as F

from . import attention

__all__ = [
    "AttentionCalls",
    "AttentionRoute",
    "attention_calls",
    "count_transformers_call",
    "register_transformers",
    "transformers_attention",
    "use_cudnn_attention",
]

NAME = "pycudnn"  # the transformers attn_implementation

# torch's function takes enable_gqa from 2.5 on (before, grouped heads are repeated for it)
_TORCH_GQA = tuple(int(p) for p in torch.__version__.split(".")[:2] if p.isdigit()) >= (2, 5)
_compiling: Callable[[], bool] = getattr(torch.compiler, "is_compiling", lambda: False)


class AttentionRoute:
    """Counts of attention calls by where they ran: ``cudnn`` (pycudnn's fused attention) and
    ``torch`` (torch's own function).

    What :func:`use_cudnn_attention` yields: the calls of
    ``torch.nn.functional.scaled_dot_product_attention`` made while that scope was active (from
    any thread). :func:`attention_calls` gives one per route, process-wide. Calls inside
    ``torch.compile``'d code are not counted (a traced increment would count compilations).

    Parameters
    ----------
    cudnn, torch : int
        The starting counts.

    Attributes
    ----------
    cudnn : int
        Calls pycudnn ran on cuDNN.
    torch : int
        Calls handed to torch's own function (what pycudnn does not run: see
        :func:`~pycudnn.torch.scaled_dot_product_attention`).
    """

    __slots__ = ("cudnn", "torch")

    def __init__(self, cudnn: int = 0, torch: int = 0) -> None:
        self.cudnn = cudnn
        self.torch = torch

    def __repr__(self) -> str:
        return f"AttentionRoute(cudnn={self.cudnn}, torch={self.torch})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, AttentionRoute):
            return NotImplemented
        return (self.cudnn, self.torch) == (other.cudnn, other.torch)


#: the process-wide counts per route (module globals: one attribute increment per call, no lock;
#: threads counting at the same moment may lose an increment)
_SCOPE = AttentionRoute()
_TRANSFORMERS = AttentionRoute()


def count_transformers_call() -> None:
    """Count one ``attn_implementation="pycudnn"`` call on cuDNN that did not pass through
    :func:`transformers_attention`: a transformer block's launch program runs its attention
    itself (:mod:`.transformers_block`)."""
    _TRANSFORMERS.cudnn += 1


@dataclass(frozen=True, repr=False)
class AttentionCalls:
    """Attention calls per route since the process began (or the last
    ``attention_calls(reset=True)``): a snapshot, from :func:`attention_calls`.
    ``str(calls)`` is a table.

    Attributes
    ----------
    scope : AttentionRoute
        Calls of ``torch.nn.functional.scaled_dot_product_attention`` inside
        :func:`use_cudnn_attention` scopes (each call once, however many scopes are active).
    transformers : AttentionRoute
        Calls of transformers' ``attn_implementation="pycudnn"``
        (:func:`register_transformers`). Such a call that runs torch's function inside a
        scope is counted by the scope too (its fallback is the routed attribute).
    """

    scope: AttentionRoute
    transformers: AttentionRoute

    def __repr__(self) -> str:
        return f"AttentionCalls(scope={self.scope!r}, transformers={self.transformers!r})"

    def __str__(self) -> str:
        rows = [
            ("route", "cudnn", "torch"),
            ("use_cudnn_attention()", str(self.scope.cudnn), str(self.scope.torch)),
            (
                f'attn_implementation="{NAME}"',
                str(self.transformers.cudnn),
                str(self.transformers.torch),
            ),
        ]
        w = [max(len(r[i]) for r in rows) for i in range(3)]
        return "\n".join(f"{a:<{w[0]}}  {b:>{w[1]}}  {c:>{w[2]}}" for a, b, c in rows)


def attention_calls(*, reset: bool = False) -> AttentionCalls:
    """How many attention calls each of the adapter's routes sent to cuDNN and to torch's
    function, process-wide.

    The routes are :func:`use_cudnn_attention` (the calls of
    ``torch.nn.functional.scaled_dot_product_attention`` while a scope is active; each scope
    also counts its own, in the :class:`AttentionRoute` it yields) and transformers'
    ``attn_implementation="pycudnn"`` (:func:`register_transformers`). The counters are plain
    increments on the call path (no lock: threads counting at the same moment may lose one);
    calls inside ``torch.compile``'d code are not counted.

    Parameters
    ----------
    reset : bool
        Zero the counters after reading them.

    Returns
    -------
    AttentionCalls
        A snapshot: ``calls.scope`` and ``calls.transformers``, each an
        :class:`AttentionRoute` (``cudnn``, ``torch``); ``print(calls)`` shows a table.

    Examples
    --------
    >>> out = model.generate(**inputs, max_new_tokens=8)  # doctest: +SKIP
    >>> print(pycudnn.torch.attention_calls(reset=True))  # doctest: +SKIP
    route                          cudnn  torch
    use_cudnn_attention()              0      0
    attn_implementation="pycudnn"    192      0
    """
    calls = AttentionCalls(
        AttentionRoute(_SCOPE.cudnn, _SCOPE.torch),
        AttentionRoute(_TRANSFORMERS.cudnn, _TRANSFORMERS.torch),
    )
    if reset:
        for r in (_SCOPE, _TRANSFORMERS):
            r.cudnn = r.torch = 0
    return calls


# The patch's state, changed only under _LOCK when a scope begins or ends (never per call):
# the active scopes' counters, and the function found in torch.nn.functional when the
# outermost scope began (what the fallback calls and what its end puts back).
_LOCK = threading.Lock()
_ROUTES: tuple[AttentionRoute, ...] = ()
_TORCH_SDPA: Callable[..., torch.Tensor] = F.scaled_dot_product_attention


def _count(cudnn: bool) -> None:
    if _compiling():  # a traced increment would count compilations, not calls
        return
    if cudnn:
        _SCOPE.cudnn += 1
        for r in _ROUTES:
            r.cudnn += 1
    else:
        _SCOPE.torch += 1
        for r in _ROUTES:
            r.torch += 1


def _routed(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """``torch.nn.functional.scaled_dot_product_attention`` while a scope is active (torch's
    signature): pycudnn's fused attention for the calls it runs, torch's function otherwise.

    The decision is taken here, not left to pycudnn's function: its fallback looks up
    ``torch.nn.functional.scaled_dot_product_attention``, which is this function now."""
    sig = None
    if attn_mask is None:
        sig = attention.attention_sig(query, key, value, dropout_p, is_causal, scale, enable_gqa)
        if sig is not None:
            out = attention.bound_attention(sig, query, key, value)
            if out is not None:
                _count(True)
                return out
    ops = attention.cudnn_operands(query, key, value, attn_mask, dropout_p, enable_gqa)
    if ops is not None and not (attn_mask is not None and is_causal):
        # (a mask with is_causal is torch's to answer: pycudnn's function would hand it back to
        # torch.nn.functional's attribute, which is this function: a RecursionError)
        _count(True)
        given = (query, key, value)
        return attention.cudnn_attention(*ops, attn_mask, dropout_p, is_causal, scale, sig, given)
    _count(False)
    kw: dict[str, Any] = {"scale": scale}
    if enable_gqa:  # torch >= 2.5 knows the argument
        kw["enable_gqa"] = True
    return _TORCH_SDPA(query, key, value, attn_mask, dropout_p, is_causal, **kw)


def _enter(route: AttentionRoute) -> None:
    global _ROUTES, _TORCH_SDPA
    with _LOCK:
        if not _ROUTES:
            _TORCH_SDPA = F.scaled_dot_product_attention
            F.scaled_dot_product_attention = _routed
        _ROUTES = (*_ROUTES, route)


def _exit(route: AttentionRoute) -> None:
    global _ROUTES
    with _LOCK:
        _ROUTES = tuple(r for r in _ROUTES if r is not route)
        if not _ROUTES:
            F.scaled_dot_product_attention = _TORCH_SDPA


@contextlib.contextmanager
def use_cudnn_attention() -> Iterator[AttentionRoute]:
    """Route ``torch.nn.functional.scaled_dot_product_attention`` to pycudnn's
    :func:`~pycudnn.torch.scaled_dot_product_attention` while the scope is active.

    Models that call torch's function by its module attribute -- HuggingFace transformers'
    ``attn_implementation="sdpa"``, timm, ``torch.nn.MultiheadAttention`` (through
    ``F.multi_head_attention_forward``) -- then run cuDNN's fused attention for the calls
    pycudnn runs (float16/bfloat16 CUDA tensors, head dims multiples of 8 up to 256, sm80 or
    newer, masks cuDNN's bias takes; see :func:`~pycudnn.torch.scaled_dot_product_attention`);
    every other call goes to torch's function with its arguments unchanged.

    Yields
    ------
    AttentionRoute
        Counters of this scope's calls: ``route.cudnn`` (pycudnn ran them) and ``route.torch``
        (torch's function did). Calls traced by ``torch.compile`` are not counted. The
        process-wide count of every scope's calls is :func:`attention_calls`.

    Notes
    -----
    The patch is process-wide: while any scope is active, every thread's calls are routed
    (and counted by every active scope). Scopes nest and may be entered again, from any
    thread; the function found in ``torch.nn.functional`` when the outermost scope began is
    put back when the last one ends, also when it ends with an exception. A reference to the
    function taken before the scope (``from torch.nn.functional import
    scaled_dot_product_attention``) keeps calling torch's.

    Examples
    --------
    >>> with pycudnn.torch.use_cudnn_attention() as route:  # doctest: +SKIP
    ...     logits = model(input_ids).logits
    >>> route.cudnn  # doctest: +SKIP
    4
    """
    route = AttentionRoute()
    _enter(route)
    try:
        yield route
    finally:
        _exit(route)


def _repeat_kv(x: torch.Tensor, n: int) -> torch.Tensor:
    """``(B, H, S, D)`` -> ``(B, H * n, S, D)``, each head repeated *n* times in place."""
    b, h, s, d = x.shape
    return x[:, :, None].expand(b, h, n, s, d).reshape(b, h * n, s, d)


def transformers_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """HuggingFace transformers' attention function on pycudnn (the ``"pycudnn"`` entry that
    :func:`register_transformers` adds), computing what transformers' ``"sdpa"`` computes.

    Parameters
    ----------
    module : torch.nn.Module
        The attention layer: its ``num_key_value_groups`` (grouped-query attention: query heads
        per key head) and ``is_causal`` are read.
    query, key, value : torch.Tensor
        ``(B, H_q, S_q, D)``, ``(B, H_kv, S_kv, D)``, ``(B, H_kv, S_kv, Dv)``.
    attention_mask : torch.Tensor, optional
        The mask transformers built (with ``sdpa``'s mask function): cuDNN's bias where
        :func:`~pycudnn.torch.scaled_dot_product_attention` takes it, torch's function
        otherwise.
    dropout : float
        Attention dropout probability (transformers passes 0 in eval mode).
    scaling : float, optional
        Default ``1 / sqrt(D)``.
    is_causal : bool, optional
        Default ``module.is_causal`` (True without it); causal only where there is no mask and
        ``S_q > 1``, as transformers' ``"sdpa"`` decides.
    **kwargs
        The model's other keyword arguments (ignored).

    Returns
    -------
    tuple of (torch.Tensor, None)
        The attention output ``(B, S_q, H_q, Dv)``, contiguous, and no attention weights.

    Notes
    -----
    Each call is counted, as run on cuDNN or by torch's function, in
    ``attention_calls().transformers`` (:func:`attention_calls`).
    """
    groups = int(getattr(module, "num_key_value_groups", 1))
    gqa = groups > 1 and attention_mask is None and _TORCH_GQA
    if groups > 1 and not gqa:  # as transformers' "sdpa": torch's masked kernels want copies
        key, value = _repeat_kv(key, groups), _repeat_kv(value, groups)
    causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
    causal = bool(query.shape[2] > 1 and attention_mask is None and causal)
    sig = None
    if attention_mask is None:  # a repeated call: its bound launch (attention.bound_attention)
        sig = attention.attention_sig(query, key, value, dropout, causal, scaling, gqa)
        if sig is not None:
            out = attention.bound_attention(sig, query, key, value)
            if out is not None:
                _TRANSFORMERS.cudnn += 1
                return out.transpose(1, 2).contiguous(), None
    ops = attention.cudnn_operands(query, key, value, attention_mask, dropout, gqa)
    if ops is None:
        if not _compiling():
            _TRANSFORMERS.torch += 1
        out = attention.scaled_dot_product_attention(
            query, key, value, attention_mask, dropout, causal, scaling, gqa
        )
    else:  # decided once: cuDNN on the operands as decided (autocast's casts made)
        if not _compiling():
            _TRANSFORMERS.cudnn += 1
        given = (query, key, value)
        out = attention.cudnn_attention(*ops, attention_mask, dropout, causal, scaling, sig, given)
    return out.transpose(1, 2).contiguous(), None


def register_transformers() -> str:
    """Register pycudnn's attention with HuggingFace transformers as ``"pycudnn"``, so
    ``from_pretrained(..., attn_implementation="pycudnn")`` (or
    ``model.set_attn_implementation("pycudnn")``) runs it.

    The function is :func:`transformers_attention`; the mask function registered beside it
    (``AttentionMaskInterface``, where transformers has one) is ``"sdpa"``'s, so models build
    the same masks as with ``"sdpa"`` (none for causal attention without padding). Calling it
    again registers the same function again (no effect).

    Returns
    -------
    str
        ``"pycudnn"``.

    Raises
    ------
    ImportError
        transformers is not installed, or is too old to have ``AttentionInterface``.
    """
    try:
        import transformers
    except ImportError as exc:
        raise ImportError(
            "pycudnn.torch.register_transformers needs HuggingFace transformers, which is not "
            "installed: pip install transformers"
        ) from exc
    interface = getattr(transformers, "AttentionInterface", None)
    if interface is None:
        raise ImportError(
            "pycudnn.torch.register_transformers needs transformers.AttentionInterface "
            f"(transformers >= 4.48); transformers {getattr(transformers, '__version__', '?')} "
            "is installed"
        )
    interface.register(NAME, transformers_attention)
    masks = getattr(transformers, "AttentionMaskInterface", None)
    sdpa_mask = None if masks is None else masks().get("sdpa")
    if sdpa_mask is not None:
        masks.register(NAME, sdpa_mask)
    return NAME
