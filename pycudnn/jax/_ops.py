"""The one mechanism that turns a request into a JAX operation (imports JAX).

Three pieces, one each:

* **Registration** (:func:`target`): two FFI targets per operation family, registered for the
  CUDA platform through the one handler (:func:`~._handler.register_handler`) the first time a
  request of the family is traced: ``pycudnn_jax_<family>`` with an :class:`~._bound.Executor`,
  and ``pycudnn_jax_<family>_cb``, marked compatible with XLA's command buffers, with a
  :class:`~._bound.CaptureExecutor`. A call goes to the second when its workspace could be
  measured at trace time (:mod:`._capture`), which it then gets from XLA as one more result.
* **The call** (:func:`call`): ``jax.ffi.ffi_call`` of the family's target with the request's
  text as the ``op`` attribute and the result shapes the request computes (or the caller
  gives), wrapped in ``jax.custom_batching.custom_vmap``: under ``vmap`` a batch that lands on
  the operands' leading dims (:meth:`~._request.Request.batch_operands`) is folded into them
  -- ``(B, N, ...)`` is ``(B * N, ...)`` in row-major memory, a free reshape -- and the call
  runs once; any other batch (a batched parameter, a parameter gradient among the results)
  runs example by example (``ffi_call``'s ``vmap_method="sequential"``).
* **Differentiation** (:func:`differentiable`): ``jax.custom_vjp`` over a family's forward
  (results and residuals) and backward (cotangents from residuals), the request as its static
  first argument.

A family module (:mod:`._activation`, :mod:`._softmax`, ...) is then its request classes, its
forward and backward as calls, and its public functions' argument checks.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import custom_batching, lax

from . import _bound, _capture, _handler, _request

__all__ = ["Results", "call", "differentiable", "register_twin", "target", "target_name"]

_LOCK = threading.Lock()
_TARGETS: dict[tuple[str, bool], str] = {}  # (family, capturable) -> name, for CUDA
_WORKSPACE = np.dtype(np.uint8)


def target_name(family: str, capturable: bool = False) -> str:
    """The FFI target of an operation family (its capturable one: see the module docstring)."""
    return f"pycudnn_jax_{family}_cb" if capturable else f"pycudnn_jax_{family}"


def target(family: str, capturable: bool = False) -> str:
    """The FFI target of *family* (its capturable one), registered for CUDA on first use, with
    the family's other one (an exported program may name either)."""
    key = (family, capturable)
    name = _TARGETS.get(key)
    if name is not None:
        return name
    with _LOCK:
        if key not in _TARGETS:
            for cb in (False, True):
                executor = _bound.CaptureExecutor() if cb else _bound.Executor()
                _handler.register_handler(
                    target_name(family, cb), executor, platform="CUDA", command_buffer_compatible=cb
                )
                _TARGETS[family, cb] = target_name(family, cb)
    return _TARGETS[key]


def register_twin(
    family: str,
    run: Callable[[_request.Request, Any, int], None],
    platform: str = "cpu",
) -> _handler.FfiTarget:
    """Register *family*'s targets (plain and capturable) for another platform (JAX's CPU: the
    tests' host twins) with ``run(request, call, stream)`` as the slow path's computation and
    no stream, so the same calls, attributes, batching and gradients run there; returns the
    plain one."""
    _handler.register_handler(
        target_name(family, True), _bound.CaptureExecutor(run, 0), platform=platform
    )
    return _handler.register_handler(
        target_name(family), _bound.Executor(run, 0), platform=platform
    )


Results = tuple[tuple[tuple[Any, ...], Any], ...]


def call(request: _request.Request, *operands: Any, results: Results | None = None) -> tuple:
    """Run *request* on *operands* through its family's FFI target; returns its results.

    *results* (``(shape, dtype)`` of each, for one example when vmapped) is given by callers
    whose result shapes the operands do not fix (a convolution's input gradient); by default
    the request computes them (:meth:`~._request.Request.results`, which checks the operands).
    """
    # the switch is part of the primitive's identity: JAX caches what it traced per function
    return _varying(_primitive(request, results, _capture.enabled())(*operands), operands)


def _vma(x: Any) -> frozenset:
    """The mesh axes *x* varies over inside ``shard_map`` (empty elsewhere, or on a JAX whose
    types carry none)."""
    if x is None:
        return frozenset()
    t = jax.typeof(x)
    mat = getattr(t, "manual_axis_type", None)  # jax 0.10+: ManualAxisType.varying
    return frozenset(mat.varying if mat is not None else getattr(t, "vma", ()))


def _varying(outs: tuple, operands: Sequence[Any]) -> tuple:
    """Inside ``shard_map``, a call's results vary over every axis an operand varies over (the
    FFI call's results carry no such type: without this a result computed from a device's own
    shard would be typed as the same on every device)."""
    axes = frozenset().union(*(_vma(o) for o in operands)) if operands else frozenset()
    if not axes:
        return outs
    return tuple(_cast(y, axes - _vma(y)) for y in outs)


def _cast(y: Any, missing: frozenset) -> Any:
    return lax.pcast(y, tuple(sorted(missing)), to="varying") if missing else y


def _match(ct: Any, like: Any) -> Any:
    """A backward's cotangent typed as its primal operand: summed over the axes only the
    cotangent varies over (an operand the same on every device, e.g. replicated weights, gets
    the sum of every device's gradient, as JAX's own transposes give), cast to the axes only
    the operand varies over."""
    if ct is None:
        return None
    want, have = _vma(like), _vma(ct)
    extra = have - want
    if extra:
        ct = lax.psum(ct, tuple(sorted(extra)))
    return _cast(ct, want - _vma(ct))


@functools.lru_cache(maxsize=4096)
def _primitive(
    request: _request.Request, results: Results | None, capture: bool
) -> Callable[..., tuple]:
    """The batching-aware call of *request* (one per request, given results and command-buffer
    setting: JAX caches traces by function, so a call traced with the setting off is not
    reused with it on)."""
    text = request.encode()

    def shapes(operands: Sequence[Any]) -> Results:
        return results if results is not None else request.results(*operands)

    def raw(*operands: Any) -> tuple:
        res = shapes(operands)
        out = [jax.ShapeDtypeStruct(s, d) for s, d in res]
        nbytes = _workspace(request, operands, res) if capture else None
        if nbytes is not None:  # the capturable target, its workspace one more result
            out.append(jax.ShapeDtypeStruct((nbytes,), _WORKSPACE))
        name = target(request.family, nbytes is not None)
        aliases = dict(request.aliases) or None
        ffi = jax.ffi.ffi_call(name, out, vmap_method="sequential", input_output_aliases=aliases)
        outs = tuple(ffi(*operands, **{_bound.ATTR: text}))
        return outs if nbytes is None else outs[:-1]

    prim = custom_batching.custom_vmap(raw)

    def rule(axis_size: int, in_batched: Sequence[bool], *operands: Any) -> tuple[tuple, tuple]:
        lead = request.batch_operands()
        fold = request.batch_results and all(b <= f for b, f in zip(in_batched, lead, strict=True))
        if not fold:  # one call per example: ffi_call's own sequential rule
            axes = [0 if b else None for b in in_batched]
            out = jax.vmap(raw, in_axes=axes)(*operands)
            return out, (True,) * len(out)
        one = [
            jax.ShapeDtypeStruct(x.shape[1:] if b else x.shape, x.dtype)
            for x, b in zip(operands, in_batched, strict=True)
        ]
        folded = []
        for x, b, f in zip(operands, in_batched, lead, strict=True):
            if f:
                if not b:  # an unbatched batch operand (say dy of a batched x): one per example
                    x = jnp.broadcast_to(x, (axis_size, *x.shape))
                x = x.reshape((axis_size * x.shape[1], *x.shape[2:]))
            folded.append(x)
        per = shapes(one)
        if results is None:
            out = prim(*folded)  # under an outer vmap, this rule folds again
        else:  # the given shapes, for the folded batch
            grown = tuple(((axis_size * s[0], *s[1:]), d) for s, d in per)
            out = _primitive(request, grown, capture)(*folded)
        out = tuple(y.reshape((axis_size, *s)) for y, (s, _d) in zip(out, per, strict=True))
        return out, (True,) * len(out)

    prim.def_vmap(rule)
    return prim


def _workspace(request: _request.Request, operands: Sequence[Any], res: Results) -> int | None:
    """The workspace bytes of a capturable call of *request* (:mod:`._capture`), or None: not
    capturable, shapes not concrete, or not traced for a GPU."""
    if not _on_gpu():
        return None
    ops = [(tuple(x.shape), x.dtype) for x in operands]
    if not all(_request.known(*s) for s, _d in (*ops, *res)):
        return None
    return _capture.workspace_bytes(request, ops, res)


def _on_gpu() -> bool:
    """Whether JAX computes on a GPU by default (the default device's platform)."""
    device = jax.config.jax_default_device
    if device is None:
        return jax.default_backend() == "gpu"
    return (device if isinstance(device, str) else device.platform) in ("gpu", "cuda")


def differentiable(
    forward: Callable[..., tuple[Any, Any]],
    backward: Callable[[Any, Any, Any], tuple],
) -> Callable[..., Any]:
    """``jax.custom_vjp`` of ``f(request, *operands)``: ``forward(request, *operands)`` returns
    ``(result, residuals)``, ``backward(request, residuals, cotangent)`` one cotangent per
    operand. The request is static (hashable, never differentiated), and so is the
    command-buffer setting the call is traced under (JAX caches a custom_vjp's traces by its
    static arguments: a call traced with the setting off is not reused with it on)."""

    def primal(request: _request.Request, _capture_on: bool, *operands: Any) -> Any:
        return forward(request, *operands)[0]

    def fwd(request: _request.Request, _capture_on: bool, *operands: Any) -> tuple[Any, Any]:
        out, res = forward(request, *operands)
        if not any(_vma(o) for o in operands):
            return out, (res, None)
        # inside shard_map: the operands' types, as zero-size slices, for the cotangents
        return out, (res, tuple(o.reshape(-1)[:0] for o in operands))

    def bwd(request: _request.Request, _capture_on: bool, saved: Any, ct: Any) -> tuple:
        res, likes = saved
        cts = backward(request, res, ct)
        if likes is None:
            return cts
        return tuple(_match(c, o) for c, o in zip(cts, likes, strict=True))

    f = jax.custom_vjp(primal, nondiff_argnums=(0, 1))
    f.defvjp(fwd, bwd)

    def call(request: _request.Request, *operands: Any) -> Any:
        return f(request, _capture.enabled(), *operands)

    return call
