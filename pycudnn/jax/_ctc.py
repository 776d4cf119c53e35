"""CTC loss as a JAX function on ``dnn_ctc_loss`` (``cudnnCTCLoss_v8``: labels and lengths in
device memory), with ``optax.ctc_loss``'s arguments.

Logits ``(B, T, K)`` (the blank class 0, or *blank_id*: XLA swaps it with class 0 first), and
``0``/``1`` paddings (1: a padded step or label) that pad at the end; the loss per sequence,
``-log p(labels | logits)``. cuDNN normalizes the logits itself (a softmax), reads them as
``(T, B, K)`` (XLA transposes them) and writes the loss and its gradient w.r.t. the logits in
one call: the gradient is a residual, and the backward only scales it by the loss' cotangent.

cuDNN takes the label sequences concatenated: XLA packs the padded labels into a ``(B * L,)``
buffer (the sequences first, one after another), and the call reads the label lengths back to
the host to take the packed prefix and to check every length and label (a synchronising copy
per call: cuDNN's CTC reads out of bounds on bad values). Hence its limits, which raise (as a
``JaxRuntimeError`` from the call) rather than give optax's values: each label length 1 to 255
(an empty label sequence is refused), each input length at least 1 and at least its label
length, labels that are classes other than the blank. A sequence whose labels need more steps
than it has (repeats need a blank between them) gets loss 0 and a zero gradient (cuDNN's
``ZERO_OOB_GRADIENTS``; optax gives about ``1e5``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import memory
from ..highlevel import dnn_ctc_loss
from . import _ops, _request
from ._operands import views

__all__ = ["CtcLoss", "ctc_loss"]

_FUNC = "pycudnn.jax.ctc_loss"
_TYPES = ("float32", "float64")  # cuDNN's CTC (float16 is NOT_SUPPORTED)
_ALGOS = ("deterministic", "non_deterministic")


@dataclasses.dataclass(frozen=True)
class CtcLoss(_request.Request):
    """Operands ``logits`` ``(T, B, K)``, ``labels`` (packed, ``(B * L,)``), ``label_lengths``,
    ``input_lengths`` (int32 ``(B,)``); results ``loss`` ``(B,)`` and ``grad`` ``(T, B, K)``."""

    family = "ctc"
    algo: str

    def __post_init__(self) -> None:
        if self.algo not in _ALGOS:
            raise ValueError(f"{_FUNC}: algo={self.algo!r}; expected one of {_ALGOS}")

    def batch_operands(self) -> tuple[bool, ...]:
        return (False, False, False, False)  # time-major logits, packed labels: no batch folds

    def results(self, *operands: Any) -> _ops.Results:
        logits, labels, label_lengths, input_lengths = operands
        dt = _request.check_dtype(_FUNC, "logits", logits, _TYPES)
        if len(logits.shape) != 3:
            raise ValueError(f"{_FUNC}: logits have shape {tuple(logits.shape)}; expected 3 dims")
        t, b, _k = logits.shape
        for name, a, shape in (
            ("labels", labels, tuple(labels.shape)),
            ("label lengths", label_lengths, (b,)),
            ("input lengths", input_lengths, (b,)),
        ):
            if np.dtype(a.dtype) != np.dtype("int32") or len(a.shape) != 1:
                raise ValueError(f"{_FUNC}: {name} is {a.dtype}{list(a.shape)}; expected int32 1-D")
            if tuple(a.shape) != shape:
                raise ValueError(f"{_FUNC}: {name} has shape {tuple(a.shape)}; expected {shape}")
        return (((b,), dt), ((t, b, logits.shape[2]), dt))

    def run(self, args: Sequence[Any], rets: Sequence[Any], stream: int) -> None:
        logits, loss, grad = views(args[:1], rets)
        # labels and lengths stay XLA's buffers (``__cuda_array_interface__``): dnn_ctc_loss
        # copies them to the host to check them. cuDNN reads the concatenated labels: the
        # packed prefix, as long as the lengths add up to (their sum checked there again)
        lengths = memory.asarray(args[2], stream=stream).get(stream)
        total = min(int(np.maximum(lengths, 0).sum()), args[1].shape[0])
        dnn_ctc_loss(
            logits,
            args[1]._replace(shape=(total,)),
            args[2],
            args[3],
            self.algo,
            check_values=True,
            out=(loss, grad),
            stream=stream,
        )


def _forward(request: CtcLoss, *operands: Any) -> tuple[Any, Any]:
    loss, grad = _ops.call(request, *operands)
    return loss, grad


def _backward(request: CtcLoss, grad: Any, dloss: Any) -> tuple:
    return (grad * dloss[None, :, None].astype(grad.dtype), None, None, None)


_ctc = _ops.differentiable(_forward, _backward)


def _lengths(name: str, paddings: Any, shape: tuple[int, int]) -> Any:
    """The unpadded length of each row of 0/1 *paddings* ``(B, n)``, int32."""
    p = jnp.asarray(paddings)
    if tuple(p.shape) != shape:
        raise ValueError(f"{_FUNC}: {name} has shape {tuple(p.shape)}; expected {shape}")
    return jnp.sum(p == 0, axis=1, dtype=jnp.int32)


def ctc_loss(
    logits: Any,
    logit_paddings: Any,
    labels: Any,
    label_paddings: Any,
    blank_id: int = 0,
    *,
    algo: str = "deterministic",
) -> jax.Array:
    """Connectionist temporal classification loss per sequence through cuDNN
    (``dnn_ctc_loss``), differentiable in *logits*; ``optax.ctc_loss``'s arguments.

    Parameters
    ----------
    logits : jax.Array
        ``(B, T, K)`` unnormalized scores (cuDNN applies the softmax), float32 or float64.
    logit_paddings : jax.Array
        ``(B, T)``, 1 at padded steps, 0 elsewhere; the padding at the end of each row.
    labels : jax.Array
        int32 ``(B, L)``, classes 0 to ``K - 1`` other than *blank_id*.
    label_paddings : jax.Array
        ``(B, L)``, 1 at padded labels, 0 elsewhere; the padding at the end of each row.
    blank_id : int
        The blank class (cuDNN's is 0: another is swapped with class 0 by XLA first).
    algo : {'deterministic', 'non_deterministic'}
        cuDNN's algorithm.

    Returns
    -------
    jax.Array
        ``(B,)`` the negative log-likelihood of each sequence, logits' dtype.

    Raises
    ------
    TypeError, ValueError
        At trace time: dtypes, shapes, *blank_id* outside the classes, a bad *algo*. At run
        time (a ``JaxRuntimeError`` carrying the message): a label length outside 1 to 255, an
        input length of 0 or shorter than its labels, a label outside the classes or the blank
        (see the module's docstring: the values are checked on the host, a synchronising
        copy).
    """
    logits = jnp.asarray(logits)
    labels = jnp.asarray(labels)
    if isinstance(blank_id, bool) or not isinstance(blank_id, (int, np.integer)):
        raise TypeError(f"{_FUNC}: blank_id={blank_id!r}; expected an int")
    if algo.__class__ is not str:
        raise TypeError(f"{_FUNC}: algo={algo!r}; expected one of {_ALGOS}")
    _request.check_dtype(_FUNC, "logits", logits, _TYPES)
    if logits.ndim != 3:
        raise ValueError(f"{_FUNC}: logits have shape {logits.shape}; expected (B, T, K)")
    if labels.dtype != jnp.int32:
        raise TypeError(f"{_FUNC}: labels have dtype {labels.dtype}; expected int32")
    b, t, k = logits.shape
    if k < 2:
        raise ValueError(f"{_FUNC}: logits have shape {logits.shape}; expected K >= 2 classes")
    if labels.ndim != 2 or labels.shape[0] != b:
        raise ValueError(f"{_FUNC}: labels have shape {labels.shape}; expected ({b}, L)")
    if not 0 <= blank_id < k:
        raise ValueError(f"{_FUNC}: blank_id={blank_id!r}; expected 0 to K - 1 = {k - 1}")
    n = labels.shape[1]
    if blank_id:  # cuDNN's blank is class 0: classes 0 and blank_id swap places
        perm = np.arange(k)
        perm[[0, blank_id]] = perm[[blank_id, 0]]
        logits = logits[..., perm]
        b_id = jnp.int32(blank_id)  # (a label that is the blank becomes 0: refused at run time)
        labels = jnp.where(labels == 0, b_id, jnp.where(labels == b_id, jnp.int32(0), labels))
    input_lengths = _lengths("logit_paddings", logit_paddings, (b, t))
    label_lengths = _lengths("label_paddings", label_paddings, (b, n))
    # pack the sequences one after another (cuDNN's concatenated labels); the rest stays 0
    offsets = jnp.cumsum(label_lengths) - label_lengths
    pos = offsets[:, None] + jnp.arange(n, dtype=jnp.int32)[None, :]
    pos = jnp.where(jnp.arange(n)[None, :] < label_lengths[:, None], pos, b * n)
    packed = jnp.zeros((b * n,), jnp.int32).at[pos.reshape(-1)].set(labels.reshape(-1), mode="drop")
    request = CtcLoss(algo)
    return _ctc(request, jnp.transpose(logits, (1, 0, 2)), packed, label_lengths, input_lengths)
