"""A fused region's chains walked once, forward and backward, under a launch tape (imports
torch): the first run of a signature, whose launches :func:`~.program.record` turns into the
programs that replay it. Shared by the eager region (:mod:`.region`) and its custom ops under
``torch.compile`` (:mod:`.region_ops`), which give the chains' operands differently (the
modules' own, or the op's arguments).

*wiring* gives per chain where its input and residual come from (``i >= 0`` the output of chain
*i*, ``-1 - j`` the region's input *j*); *outputs* the chains whose results leave the region.
A walk's *records* are per chain ``(x, w, gamma, beta, z, block, saved)``, *saved*
:func:`~.fused_train.block_forward`'s ``(path, conv_out, mean, invstd, out, reserve)``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from . import _lean
from .conv import conv_dgrad, conv_wgrad
from .fused_train import OWN, block_forward, bn_act_backward, reads_as_is

__all__ = ["chain_operands", "like_layout", "ref", "walk_backward", "walk_forward"]


def ref(r: int, vals: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor]) -> torch.Tensor:
    """A wiring reference: chain *r*'s output (``r >= 0``) or the region's input ``-1 - r``."""
    return vals[r] if r >= 0 else inputs[-1 - r]


def chain_operands(ext: Sequence[torch.Tensor], n_in: int, n: int) -> list[tuple]:
    """Per chain ``(w, gamma, beta, (running_mean, running_var))`` from a training forward's
    external operands *ext*: the *n_in* inputs, then five per chain in that order."""
    return [
        (*ext[n_in + 5 * c : n_in + 5 * c + 3], tuple(ext[n_in + 5 * c + 3 : n_in + 5 * c + 5]))
        for c in range(n)
    ]


def like_layout(d: torch.Tensor, stride: tuple, dtype: torch.dtype) -> torch.Tensor:
    """An incoming gradient *d* in the strides and dtype of the output it belongs to (a
    backward was bound so): *d* itself when it already is."""
    if d.dtype != dtype:
        d = d.to(dtype)
    if d.stride() != stride:
        d = torch.empty_strided(d.shape, stride, dtype=dtype, device=d.device).copy_(d)
    return d


def walk_forward(
    wiring: Sequence[tuple],
    outputs: Sequence[int],
    inputs: Sequence[torch.Tensor],
    operands: Sequence[tuple],
    prepare: Callable[[int, torch.Tensor, torch.Tensor | None], tuple],
) -> tuple[list, list, str, list]:
    """Every chain's training forward in graph order under a tape. *operands* are per chain
    ``(w, gamma, beta, running)``; ``prepare(c, x, z)`` gives chain *c*'s ``(x, z, block)``
    (its input and residual as the launch takes them, its :class:`~.fused_train.TrainBlock`).
    Returns ``(outputs, records, why, launches)``: *why* says what a program could not replay
    ('' when nothing)."""
    vals: list[torch.Tensor] = []
    recs = []
    why = ""
    with _lean.Tape() as tape:
        for c, (xr, zr) in enumerate(wiring):
            x = ref(xr, vals, inputs)
            z = None if zr is None else ref(zr, vals, inputs)
            x, z, blk = prepare(c, x, z)
            w, gamma, beta, running = operands[c]
            out, saved = block_forward(x, w, None, gamma, beta, z, running, blk)
            if not saved[0] and z is not None:
                why = why or "a residual added by torch (no fused batch-norm kernel here)"
            elif saved[0] == OWN and z is not None and not reads_as_is(z, saved[1]):
                why = why or "a residual copied to the layout pycudnn's batch-norm kernels read"
            recs.append((x, w, gamma, beta, z, blk, saved))
            vals.append(out)
    outs = [vals[i] for i in outputs]
    inner = {id(r[0]) for r in recs} | {id(r[4]) for r in recs if r[4] is not None}
    if any(id(o) in inner for o in outs):
        why = why or "an output of the region is also read inside it"
    return outs, recs, why, tape.launches


def walk_backward(
    outputs: Sequence[int],
    inputs: Sequence[torch.Tensor],
    recs: Sequence[tuple],
    douts: Sequence[torch.Tensor],
    need: Sequence[bool],
) -> tuple[list, list | None]:
    """The chains' gradients in reverse order (data gradients accumulated in place with
    ``beta=1`` where a tensor feeds several chains) under a tape. *need* is per region input,
    then per chain (weight, gamma, beta). Returns ``(gradients of the inputs, then per chain
    of the weight, gamma and beta, None where not needed; launches)``; the launches are None
    where a torch operation had to run between them (the gradients are right either way)."""
    grads: dict[int, torch.Tensor] = {}
    for i, d in zip(outputs, douts, strict=True):
        grads[id(recs[i][6][4])] = d
    n_in = len(inputs)
    pgrads: list[Any] = [None] * (3 * len(recs))
    replayable = True
    with _lean.Tape() as tape:
        for c in reversed(range(len(recs))):
            x, w, gamma, beta, z, blk, saved = recs[c]
            path, yc, mean, invstd, y, reserve = saved
            dy = grads.get(id(y))
            if dy is None:
                dy, replayable = torch.zeros_like(y), False
            elif dy.stride() != y.stride() or dy.dtype != y.dtype or dy.data_ptr() % 16:
                dy, replayable = torch.empty_like(y).copy_(dy), False
            dyc, dgamma, dbeta, dz = bn_act_backward(
                path, (yc, y, gamma, beta, mean, invstd, reserve), dy, blk, z is not None
            )
            replayable = replayable and (bool(path) or z is None)
            if z is not None:
                g = grads.get(id(z))
                if g is None:
                    grads[id(z)] = dz
                else:
                    grads[id(z)], replayable = g + dz, False
            k = next((i for i, t in enumerate(inputs) if t is x), -1)
            if k < 0 or need[k]:
                g = grads.get(id(x))
                if g is None:
                    grads[id(x)] = conv_dgrad(w, dyc, torch.empty_like(x), blk.cfg)
                else:
                    conv_dgrad(w, dyc, g, blk.cfg, beta=1.0)
            if need[n_in + 3 * c]:
                pgrads[3 * c] = conv_wgrad(x, dyc, w, blk.cfg)
            pgrads[3 * c + 1] = dgamma if need[n_in + 3 * c + 1] else None
            pgrads[3 * c + 2] = dbeta if need[n_in + 3 * c + 2] else None
    igrads = [grads.get(id(t)) if need[i] else None for i, t in enumerate(inputs)]
    return igrads + pgrads, (tape.launches if replayable else None)
