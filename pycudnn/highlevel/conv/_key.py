"""The hot path of a convolution: the call key and the cached call entry.

A call first builds a *call key*: a flat tuple of what the caller passed that is cheap to read --
each operand's shape, element strides, dtype, device and pointer residue mod 16 (which fixes its
byte alignment), the convolution options exactly as given (one plain tuple from the public
function), and the calling thread's ``pycudnn.config.snapshot()``. The high level's one
cache-and-run helper (:func:`._call.run_cached`, the thread's call cache) maps call keys to ready
call entries (:class:`._calls.ConvCall`). A hit skips
parsing and validation (the key pins everything they depend on) and only reads the pointers,
checks that ``out`` does not overlap an input, fetches the workspace pointer when the plan needs
one, finds the variant pack cached for those pointers and calls ``cudnnBackendExecute`` -- no
stream query, and ``cudnnSetStream`` only when ``stream=`` names a different stream than the
handle's. Torch tensors are read without an intermediate record; ``docs/BENCHMARKS.md`` has the
measured host cost against PyTorch's.

Only a miss builds the frozen :class:`._request.ConvRequest` (:func:`._prepare.build`); plain
tuples on the hit path keep it as cheap as before the request existed. A cached entry whose plan
no longer fits its workspace is dropped with its plan and rebuilt; a call-cache hit counts as a
plan-cache hit (``cache_info().hits``).
"""

from __future__ import annotations

from typing import Any

from ...graph import _plans
from .. import _call, _operand
from . import _prepare

__all__ = ["conv", "fused"]

#: errors that mean a cached entry went stale: its plan's workspace no longer fits (the entry
#: is dropped with its plan and rebuilt: the search then takes smaller workspaces first)
_STALE = (MemoryError,)
_NO_OUTPUT = (None,)  # outs and out_ptrs of a call that allocates its output
#: the public functions' default subsample and dilation (tested by identity on the hot path)
ONES2 = (1, 1)
ONES3 = (1, 1, 1)


def _bools(opts: tuple) -> Any:
    """What tells a bool in border_mode, subsample or dilation apart (``True == 1``,
    ``(True, True) == (1, 1)``): border_mode's class, and a scan of the two tuples unless both
    are the defaults (an identity test) and border_mode is no tuple: True when one holds a bool,
    else border_mode's class (so an equal tuple of ints shares the defaults' entry)."""
    b, s = opts[0], opts[1]
    if s is opts[2] and (s is ONES2 or s is ONES3) and b.__class__ is not tuple:
        return b.__class__
    return _call.has_bool(b, s, opts[2]) or b.__class__


def conv(op: int, nd: int, a: Any, b: Any, shape: Any, opts: tuple, out: Any, stream: Any) -> Any:
    """Run a plain convolution: *opts* is ``(border_mode, subsample, dilation, conv_mode,
    direction_hint, algo, precision, num_groups, alpha, beta)`` as the caller passed them."""
    # one flat tuple per operand (hashing nested records costs more; op and nd fix the ranks)
    fast = _operand.FAST_T
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
        ga = _operand.raw_operand(a)
        gb = _operand.raw_operand(b)
        pa, pb = ga[0], gb[0]
        ka = (ga[1], ga[2], ga[3], ga[4], pa & 15, gb[1], gb[2], gb[3], gb[4], pb & 15)
    if out is None:
        okey = None
        outs = out_ptrs = _NO_OUTPUT
    else:
        if type(out) is fast:
            po = out.data_ptr()
            okey = (out.shape, out.stride(), out.dtype, out.get_device(), po & 15)
        else:
            po, okey = _operand.key_of(out)
        outs, out_ptrs = (out,), (po,)
    if type(shape) is list:
        shape = tuple(shape)
    # with the types of num_groups, alpha and beta: True == 1 == 1.0, but only one is valid;
    # likewise a bool in border_mode, subsample or dilation
    bm, s = opts[0], opts[1]
    key = (
        op,
        nd,
        ka,
        okey,
        shape,
        opts,
        _call.snapshot(),
        opts[-3].__class__,
        opts[-2].__class__,
        opts[-1].__class__,
        bm.__class__
        if s is opts[2] and (s is ONES2 or s is ONES3) and bm.__class__ is not tuple
        else _call.has_bool(bm, s, opts[2]) or bm.__class__,
    )
    args = (op, nd, a, b, shape, opts, out, stream)
    return _call.run_cached(
        key, _prepare.build, args, (pa, pb), outs, out_ptrs, stream, _STALE, _plans.served_cached
    )[0]


def fused(nd: int, a: Any, b: Any, opts: tuple, epilogue: tuple, out: Any, stream: Any) -> Any:
    """Run a forward convolution with an epilogue: *epilogue* is ``(bias, activation, z,
    z_alpha)`` as the caller passed them."""
    pa, ka = _operand.key_of(a)
    pb, kb = _operand.key_of(b)
    ptrs: tuple = (pa, pb)
    bias, activation, z, z_alpha = epilogue
    kbias = kz = None
    if bias is not None:
        pbias, kbias = _operand.key_of(bias)
        ptrs += (pbias,)
    if z is not None:
        pz, kz = _operand.key_of(z)
        ptrs += (pz,)
    if out is None:
        okey = None
        outs = out_ptrs = _NO_OUTPUT
    else:
        po, okey = _operand.key_of(out)
        outs, out_ptrs = (out,), (po,)
    key = ("fused", nd, ka, kb, kbias, kz, okey, opts, activation, z_alpha, _call.snapshot())
    key += (opts[-3].__class__, opts[-2].__class__, opts[-1].__class__, z_alpha.__class__)
    key += (_bools(opts),)
    args = (nd, a, b, opts, epilogue, out, stream)
    return _call.run_cached(
        key, _prepare.build_fused, args, ptrs, outs, out_ptrs, stream, _STALE, _plans.served_cached
    )[0]
