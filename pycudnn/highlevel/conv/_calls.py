"""Convolution call entries and their introspection.

A :class:`ConvCall` is what the per-thread call cache keeps for one call key (the high level's
one :class:`._call.Call` protocol, run by :func:`._call.run_cached`): the plan, the handle, how
the call's ``(a, b, out)`` pointers feed the plan's ``(x, w, y)``, the output's allocation spec,
the operands' byte spans and the staging. An :class:`EmptyCall` is a call with nothing to
compute. :func:`recent_calls` and :func:`last_call` describe the cached convolution entries
(:class:`CallInfo`) for benchmarks and diagnostics.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from ...graph import _plans
from .. import _call
from ._request import Prepared

__all__ = ["CallInfo", "ConvCall", "EmptyCall", "last_call", "recent_calls"]


class ConvCall(_call.Call):
    """A cached convolution call: a plan and how the (a, b, out) pointers feed its x, w, y."""

    __slots__ = ("op", "perm", "plan", "problem", "workspace")
    fused = False  # one fused graph runs the call with its epilogue

    def __init__(
        self,
        pr: Prepared,
        problem: Any,
        plan: Any,
        perm: tuple[int, int, int],
        spans: tuple[int, ...] | None = None,
    ) -> None:
        """*perm*: the (a, b, out) index feeding the plan's x, w, y; *spans*: the operands'
        byte spans when the call has more than a, b, out (an epilogue's)."""
        super().__init__(pr.req.func, pr.handle, (pr.alloc,), spans or pr.spans, pr.stage)
        self.op = pr.req.op
        self.problem = problem
        self.plan = plan
        self.perm = perm
        self.workspace = plan.workspace

    def launch(self, ptrs: Sequence[int]) -> None:
        x, w, y = self.perm
        ws = self.workspace
        self.plan.run(ptrs[x], ptrs[w], ptrs[y], _call.workspace(self.handle, ws) if ws else 0)

    def evict(self) -> None:
        """Forget the plan: it failed to run (its workspace no longer fits, or a fresh plan
        that cannot run); the next call searches again."""
        _plans.evict(self.problem)

    @property
    def staged(self) -> bool:
        return self.stage is not None

    @property
    def epilogue(self) -> str | None:
        return None


class EmptyCall(_call.Call):
    """A convolution with nothing to compute: an empty output, or a sum over nothing (no input
    channels, no images, no filters) whose output is ``alpha * 0 + beta * out``. No handle and
    no C call, so :meth:`run` is its own (there is nothing to launch, and zeros are allocated as
    zeros)."""

    __slots__ = ("beta", "fill")

    def __init__(self, func: str, spec: _call.OutputSpec, beta: float, fill: bool) -> None:
        super().__init__(func, None, (spec,), (0, 0, 0))
        self.beta = beta
        self.fill = fill  # a sum over nothing: zeros (or out scaled by beta)

    def run(
        self, ptrs: tuple, outs: tuple, out_ptrs: tuple, stream: Any, here: bool = False
    ) -> tuple:
        """The output, allocated or given (no device to switch to: nothing runs on one)."""
        return (_call.empty_result(self.func, outs[0], self.allocs[0], self.beta, self.fill),)


class CallInfo(NamedTuple):
    """What :func:`last_call` reports: for benchmarks and diagnostics, not a stable API.

    ``plan`` has ``describe()``, ``workspace`` (bytes) and ``run(x, w, y, workspace_ptr)``;
    graph plans also ``pack(...)``, ``handle_c`` and ``plan_c`` (see :mod:`pycudnn.graph._plans`).
    ``perm`` maps the call's ``(a, b, out)`` pointers onto the plan's ``(x, w, y)``.
    With an epilogue (``bias=``/``activation=``/``z=``), ``epilogue`` names it (e.g.
    ``"bias+add+relu"``) and ``fused`` says whether one fused graph ran it (``plan`` is then
    that graph's plan, ``problem`` its :class:`._epilogue.FusedProblem`, and ``plan.run`` takes
    ``x, w, [bias], [z], y, workspace_ptr``) or the convolution's plan and separate steps did.
    """

    func: str
    problem: Any
    plan: Any
    handle: Any
    perm: tuple[int, int, int]
    staged: bool
    allocates_output: bool
    fused: bool = False
    epilogue: str | None = None

    def workspace_ptr(self) -> int:
        """The handle's workspace pointer for this plan (0 when it needs none)."""
        ws = self.plan.workspace
        return _call.workspace(self.handle, ws) if ws else 0


def recent_calls() -> list[CallInfo]:
    """The calling thread's cached convolution calls, the most recently cached first."""
    return [
        CallInfo(
            c.func,
            c.problem,
            c.plan,
            c.handle,
            c.perm,
            c.staged,
            c.allocs[0] is not None,
            c.fused,
            c.epilogue,
        )
        for c in reversed(_call.calls().data.values())
        if isinstance(c, ConvCall)
    ]


def last_call() -> CallInfo | None:
    """The calling thread's most recently cached convolution call (None before the first)."""
    calls = recent_calls()
    return calls[0] if calls else None
