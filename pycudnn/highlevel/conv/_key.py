"""The hot path of a convolution: the call key and the cached call entry.

A call first builds a *call key*: a flat tuple of what the caller passed that is cheap to read --
each operand's shape, element strides, dtype, device and pointer residue mod 16 (which fixes its
byte alignment), the convolution options exactly as given (one plain tuple from the public
function), and the calling thread's ``pycudnn.config.snapshot()``. The per-thread call cache
(``_op.calls()``) maps call keys to ready call entries (:class:`._calls.ConvCall`). A hit skips
parsing and validation (the key pins everything they depend on) and only reads the pointers,
checks that ``out`` does not overlap an input, fetches the workspace pointer when the plan needs
one, finds the variant pack cached for those pointers and calls ``cudnnBackendExecute`` -- no
stream query, and ``cudnnSetStream`` only when ``stream=`` names a different stream than the
handle's. Torch tensors are read without an intermediate record; ``docs/BENCHMARKS.md`` has the
measured host cost against PyTorch's.

Only a miss builds the frozen :class:`._request.ConvRequest` and hands it to
:func:`._prepare.slow`; plain tuples on the hit path keep it as cheap as before the request
existed.
"""

from __future__ import annotations

from typing import Any

from ...graph import _plans
from .. import _op
from . import _prepare
from ._problem import OP_FWD
from ._request import ConvRequest, Epilogue

__all__ = ["conv", "fused", "run_cached"]

MISS = object()  # no cached call entry (or one whose plan was just evicted)
UNHASHABLE = object()  # an unhashable argument (a list, an array): no call caching


def conv(op: int, nd: int, a: Any, b: Any, shape: Any, opts: tuple, out: Any, stream: Any) -> Any:
    """Run a plain convolution: *opts* is ``(border_mode, subsample, dilation, conv_mode,
    direction_hint, algo, precision, num_groups, alpha, beta)`` as the caller passed them."""
    # one flat tuple per operand (hashing nested records costs more; op and nd fix the ranks)
    fast = _op.FAST_T
    if type(a) is fast and type(b) is fast:  # torch tensors: no intermediate records
        pa = a.data_ptr()
        pb = b.data_ptr()
        ka = (
            a.shape,
            a.stride(),
            a.dtype,
            a.get_device(),
            pa & 15,
            b.shape,
            b.stride(),
            b.dtype,
            b.get_device(),
            pb & 15,
        )
    else:  # the raw (ptr, shape, strides, dtype, device) of each operand
        ga = _op.raw_operand(a)
        gb = _op.raw_operand(b)
        pa, pb = ga[0], gb[0]
        ka = (ga[1], ga[2], ga[3], ga[4], pa & 15, gb[1], gb[2], gb[3], gb[4], pb & 15)
    if out is None:
        po = okey = None
    elif type(out) is fast:
        po = out.data_ptr()
        okey = (out.shape, out.stride(), out.dtype, out.get_device(), po & 15)
    else:
        po, okey = _op.key_of(out)
    if type(shape) is list:
        shape = tuple(shape)
    key = (op, nd, ka, okey, shape, opts, _op.snapshot())
    result = run_cached(key, (pa, pb), out, po, stream)
    if result is MISS or result is UNHASHABLE:
        req = ConvRequest(op, nd, a, b, shape, *opts, out, stream)
        return _prepare.slow(req, None if result is UNHASHABLE else key)
    return result


def fused(nd: int, a: Any, b: Any, opts: tuple, epilogue: tuple, out: Any, stream: Any) -> Any:
    """Run a forward convolution with an epilogue: *epilogue* is ``(bias, activation, z,
    z_alpha)`` as the caller passed them."""
    pa, ka = _op.key_of(a)
    pb, kb = _op.key_of(b)
    ptrs: tuple = (pa, pb)
    bias, activation, z, z_alpha = epilogue
    kbias = kz = None
    if bias is not None:
        pbias, kbias = _op.key_of(bias)
        ptrs += (pbias,)
    if z is not None:
        pz, kz = _op.key_of(z)
        ptrs += (pz,)
    if out is None:
        po = okey = None
    else:
        po, okey = _op.key_of(out)
    key = ("fused", nd, ka, kb, kbias, kz, okey, opts, activation, z_alpha, _op.snapshot())
    result = run_cached(key, ptrs, out, po, stream)
    if result is MISS or result is UNHASHABLE:
        req = ConvRequest(OP_FWD, nd, a, b, None, *opts, out, stream, Epilogue(*epilogue))
        return _prepare.slow(req, None if result is UNHASHABLE else key)
    return result


def run_cached(key: Any, ptrs: tuple, out: Any, po: Any, stream: Any) -> Any:
    """Run the thread's cached call entry of *key* (plain or fused convolution): its result, or
    :data:`MISS` / :data:`UNHASHABLE` for the slow path. A plan whose workspace no longer fits
    is forgotten with its entry (the slow path searches again, smaller workspaces first). No
    LRU reordering here: the call cache evicts the oldest-inserted."""
    try:
        calls = _op.local.calls
    except AttributeError:
        calls = _op.calls()
    try:
        call = calls.data.get(key)
    except TypeError:
        return UNHASHABLE
    if call is None:
        return MISS
    try:
        result = call.run(ptrs, out, po, stream)
    except MemoryError:
        _plans.evict(call.problem)
        calls.pop(key)
        return MISS
    _plans.served_cached()
    return result
