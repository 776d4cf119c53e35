"""Argument checks of :meth:`Graph.execute` (its workspace and stream), and :func:`load_plan`
(a plan from its JSON form) with its own: all made before the first CUDA or cuDNN call (issue
42: a CPU user saw none of these errors)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import _cuda, errors, memory
from .. import handle as _handle
from ..descriptors import BackendDescriptor
from ..enums import BackendAttributeName as A
from ..enums import BackendAttributeType as T
from ..enums import BackendDescriptorType
from . import _plans

__all__ = ["load_plan", "load_plan_args", "refuse_capture", "stream_arg", "workspace_array"]


def workspace_array(graph: str, workspace: Any, total: int, device: int) -> Any:
    """*workspace* as a device array of at least *total* bytes on *device* (Graph.execute)."""
    try:
        wa = memory.asarray(workspace, check=False)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{graph}: workspace: {exc}") from None
    if wa.nbytes < total:
        raise ValueError(
            f"{graph}: workspace has {wa.nbytes} B, the plan needs {total} B (get_workspace_size())"
        )
    if wa.nbytes and wa.device != device:
        raise ValueError(
            f"{graph}: workspace is on device {wa.device}, the graph was built for device {device}"
        )
    return wa


def refuse_capture(graph: str, h: Any) -> None:
    """:meth:`Graph.build` on a handle whose stream is capturing a CUDA graph: planning makes
    CUDA calls a capture cannot record (and failing inside CUDA would invalidate it)."""
    stream = getattr(h, "stream", None)
    if stream is not None and _cuda.is_capturing(stream):
        raise errors.StreamCaptureError(
            f"{graph}.build: the handle's stream 0x{stream:x} is capturing a CUDA graph; build "
            "the graph before capturing (execute() is what a capture records)"
        )


def stream_arg(graph: str, stream: Any) -> None:
    """*stream* is one the handle can take (named before the first CUDA call)."""
    try:
        _cuda.coerce_stream(stream)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{graph}.execute: stream: {exc}") from None


def load_plan_args(text: Any, h: Any, uids: Any, engine: Any) -> None:
    """:func:`load_plan`'s arguments: a plan's JSON text, a Handle, int uids, an int engine."""
    if not isinstance(text, str) or not text:
        raise TypeError(
            f"load_plan: text must be a non-empty str (a plan's JSON), got {text!r:.80}"
        )
    if not isinstance(h, _handle.Handle):
        raise TypeError(
            f"load_plan: h must be a pycudnn.Handle (pycudnn.get_handle()), got {type(h).__name__}"
        )
    if isinstance(uids, (str, bytes)) or not isinstance(uids, Sequence):
        raise TypeError(f"load_plan: uids must be a sequence of ints, got {uids!r:.80}")
    for u in uids:
        if isinstance(u, bool) or not isinstance(u, int) or not 0 < u < 2**63:
            raise ValueError(f"load_plan: uids must be ints in [1, 2**63), got {list(uids)!r:.120}")
    if isinstance(engine, bool) or not isinstance(engine, int):
        raise TypeError(f"load_plan: engine must be an int, got {engine!r}")


def load_plan(text: str, h: Any, uids: Sequence[int], *, engine: int = -1) -> Any:
    """A :class:`~pycudnn.graph._plans.GraphPlan` from cuDNN's JSON plan representation:
    *text* (:meth:`GraphPlan.to_json`'s str), *h* the :class:`~pycudnn.Handle` to run it with,
    *uids* the tensor uids in pointer order."""
    load_plan_args(text, h, uids, engine)
    plan = BackendDescriptor(BackendDescriptorType.EXECUTION_PLAN_DESCRIPTOR)
    plan.set(A.EXECUTION_PLAN_HANDLE, T.HANDLE, h)
    plan.set(A.EXECUTION_PLAN_JSON_REPRESENTATION, T.CHAR, text)
    plan.finalize()
    ws = int(plan.get(A.EXECUTION_PLAN_WORKSPACE_SIZE, T.INT64, 1)[0])
    info = _plans.EngineInfo(engine, frozenset(), frozenset(), ws)
    return _plans.GraphPlan(plan, None, h, info, ws, uids, "loaded from JSON")
