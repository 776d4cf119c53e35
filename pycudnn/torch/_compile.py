"""What the family modules share for ``torch.compile`` (imports torch): the routing test, the
registration of the ``pycudnn::`` custom operators and the eager-only wrapper.

Eager calls never touch these operators: a converted module's forward asks :func:`compiling`
(``torch.compiler.is_compiling``, ~0.1 us) and keeps its lean path when it is False. Under
``torch.compile`` the same forward calls ``torch.ops.pycudnn.<name>``, whose real implementation
is the lean-path function the eager path runs and whose fake gives the real output's shape,
dtype and strides, so dynamo traces through the module without a graph break. A torch without
``torch.library.custom_op`` (before 2.4) registers nothing, and :func:`compiling` is then always
False: modules run their eager path, which dynamo breaks its graph around.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch
from torch.autograd.function import once_differentiable

__all__ = [
    "NAMESPACE",
    "OPS",
    "PLAIN",
    "compiling",
    "constant",
    "define",
    "differentiable",
    "dynamo_loaded",
    "eager_gradient",
    "eager_only",
    "gradient",
]

NAMESPACE = "pycudnn"
_CUSTOM_OP: Any = getattr(torch.library, "custom_op", None)
_COMPILER: Any = getattr(torch, "compiler", None)

#: the ops this process registered, by name (tests and diagnostics)
OPS: dict[str, Any] = {}


def _never() -> bool:
    return False


#: True while dynamo traces (the forward then calls the custom ops); False in eager
compiling: Callable[[], bool] = (
    _COMPILER.is_compiling
    if _CUSTOM_OP is not None and hasattr(_COMPILER, "is_compiling")
    else _never
)


def constant(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Mark *fn* as ``torch.compiler.assume_constant_result`` does: dynamo calls it once while
    tracing and keeps the result (no graph break, no guard), for properties fixed for the process
    such as a device's compute capability. Set here, as that decorator sets it, because
    importing the decorator imports dynamo (~1 s) at the family modules' import."""
    fn._dynamo_marked_constant = True  # type: ignore[attr-defined]
    return fn


def define(
    name: str,
    impl: Callable[..., Any],
    fake: Callable[..., Any],
    mutates: tuple[str, ...] = (),
    autograd: tuple[Callable[..., Any], Callable[..., Any]] | None = None,
) -> Any:
    """Register ``pycudnn::<name>`` over *impl* (its schema read from *impl*'s annotations)
    with *fake* as its fake (meta) implementation and, when given, *autograd*'s
    ``(backward, setup_context)``; returns the op's overload (``torch.ops.pycudnn.<name>``),
    or None on a torch without custom ops. *mutates* names the arguments *impl* writes."""
    if _CUSTOM_OP is None:
        return None
    op = _CUSTOM_OP(f"{NAMESPACE}::{name}", mutates_args=mutates)(impl)
    op.register_fake(fake)
    if autograd is not None:
        op.register_autograd(autograd[0], setup_context=autograd[1])
    OPS[name] = op._opoverload
    return op._opoverload


def differentiable(
    name: str,
    run: Callable[..., Any],
    fake: Callable[..., Any],
    setup: Callable[..., None],
    backward: Callable[..., Any],
    mutates: tuple[str, ...] = (),
    eager_run: Callable[..., Any] | None = None,
    stats_outputs: int = 0,
) -> tuple[type[torch.autograd.Function], Any]:
    """One differentiable operation of a family, defined once: *run* (the forward, the op's
    real implementation), *setup* (``setup(ctx, inputs, output)``: what the backward keeps) and
    *backward* (``backward(ctx, *grads)``). From them come both the eager
    ``autograd.Function`` (its forward runs *run* then *setup*; its backward is *backward*) and
    ``pycudnn::<name>`` (:func:`define`, the same *setup* and *backward* registered as its
    autograd), so the two routes cannot drift apart. Returns ``(Function, op)`` (op None on a
    torch without custom ops).

    *backward* reaches its gradient operations through ``ctx.gradient`` (:func:`gradient`,
    or :func:`eager_gradient` after an eager forward: the same choice without asking whether
    dynamo traces), which runs their eager function on plain tensors and their custom op where
    the backward is being traced.
    *eager_run*, when given, is the eager forward instead of *run*, with the eager Function's
    own arguments, which *setup* (and the backward's count of gradients) then reads too: what
    only eager calls can do (an in-place activation: a custom op returns no alias of its
    input), or the module's options passed whole (each argument of ``Function.apply`` costs
    Python steps; the op takes them one by one, as lists).
    *stats_outputs* counts the trailing outputs that never carry a gradient (statistics,
    masks; *setup* marks them non-differentiable): the eager Function does not materialize
    their gradients (autograd would otherwise allocate and fill a zero tensor for each, every
    backward), and when the first output's gradient is absent too its backward returns none."""
    forward_run = run if eager_run is None else eager_run

    def forward(ctx: Any, *args: Any) -> Any:
        out = forward_run(*args)
        setup(ctx, args, out)
        ctx.gradient = eager_gradient
        if stats_outputs:
            ctx.set_materialize_grads(False)
        return out

    def op_setup(ctx: Any, inputs: Any, output: Any) -> None:
        setup(ctx, inputs, output)
        ctx.gradient = gradient

    @once_differentiable
    def eager_backward(ctx: Any, *grads: Any) -> Any:
        if stats_outputs and grads[0] is None:  # (not materialized: the output went unused)
            return (None,) * len(ctx.needs_input_grad)
        return backward(ctx, *grads)

    # made by type() so that autograd's node class is named after it (``SoftmaxFnBackward``)
    cls = "".join(p.title() for p in name.split("_")) + "Fn"
    body = {"forward": staticmethod(forward), "backward": staticmethod(eager_backward)}
    fn: type[torch.autograd.Function] = type(cls, (torch.autograd.Function,), body)
    fn.__module__ = getattr(run, "__module__", __name__)
    return fn, define(name, run, fake, mutates, autograd=(backward, op_setup))


#: tensors pycudnn reads as they are: a tensor of another type (a subclass such as FakeTensor,
#: AOTAutograd's functional tensors) may have no storage, so no ``data_ptr()``: torch's own
#: implementation or the custom op runs for it
PLAIN = (torch.Tensor, torch.nn.Parameter)


def gradient(op: Any, eager: Callable[..., Any], t: torch.Tensor, *args: Any) -> Any:
    """A backward's call of a gradient operation on *t* (and *args*): ``eager(t, *args)`` for a
    plain tensor (an eager backward, or the op's own backward run outside ``torch.compile``),
    the custom op *op* where the backward is being traced: by dynamo (:func:`compiling`) or by
    AOTAutograd (its fake and functional tensors are subclasses), so the traced graph holds the
    op."""
    if op is None or (type(t) in PLAIN and not compiling()):
        return eager(t, *args)
    return op(t, *args)  # (dynamo sees plain tensor types while it traces a Function)


def eager_gradient(op: Any, eager: Callable[..., Any], t: torch.Tensor, *args: Any) -> Any:
    """:func:`gradient` for a backward whose forward ran eagerly (``ctx.gradient`` there): no
    tracing can be under way but compiled autograd's, whose tensors are not plain."""
    if type(t) in PLAIN:
        return eager(t, *args)
    return gradient(op, eager, t, *args)


def dynamo_loaded() -> bool:
    """Whether ``torch.compile``'s dynamo is loaded in this process. Dynamo refuses to trace
    modules that are ``nn.RNNBase`` subclasses and runs their forward eagerly, while it still
    compiles the Python frames that forward calls (pycudnn's own, which it cannot trace): the
    RNNs route to :func:`eager_only` whenever dynamo is loaded, not only while it traces."""
    return "torch._dynamo" in sys.modules


def eager_only(fn: Callable[..., Any]) -> Callable[..., Any]:
    """*fn* run by Python under ``torch.compile`` (dynamo breaks its graph around the call): for
    modules whose calls have no custom op (RNNs, LRN, CrossEntropyLoss). Call it only while
    compiling.

    ``torch.compiler.disable`` imports dynamo (~1 s), so it is applied on the first call (which
    happens while dynamo traces, so dynamo is loaded; it breaks the graph at that call once and
    may warn that ``disable`` was called inside a compiled region), not at import.
    """
    disabled: list[Callable[..., Any]] = []

    def call(*args: Any) -> Any:
        if not disabled:
            disabled.append(_COMPILER.disable(fn))
        return disabled[0](*args)

    return call
