"""Copies the arrays' ``copy_`` cannot make with one ``cudaMemcpyAsync``: between devices (a
peer copy ordered on both devices) and host data laid out in a device array's dense strides."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import _cuda
from .._cuda import DeviceContext, stream_wait
from .._layout import is_c_contiguous, is_dense

__all__ = ["copy_peer", "host_in_layout"]


def copy_peer(dst: Any, src: Any, sid: int) -> None:
    """Copy *src* (another device) into *dst* on *sid*, a stream of ``dst``'s device.

    A peer copy (``cudaMemcpyPeerAsync``): memory from the stream-ordered pool is accessible
    from its own device only (``cudaMemPoolSetAccess`` is not asked for), and a plain
    ``cudaMemcpyAsync`` between two such blocks fails with ``cudaErrorInvalidValue``; the peer
    copy needs no access rights. Ordering: *sid* waits for both arrays' streams (the source's on
    its own device: a raw 0 is each device's own legacy stream), and the source's stream then
    waits for the copy, so that memory is not reused or overwritten while it is read. Where the
    driver refuses a peer copy, the bytes go through the host (synchronous).
    """
    rt = _cuda.runtime()
    with DeviceContext(dst._device):
        stream_wait(sid, dst._stream, dst._device)
        stream_wait(sid, src._stream, src._device, dst._device)
        err = rt.cudaMemcpyPeerAsync(dst._ptr, dst._device, src._ptr, src._device, dst.nbytes, sid)
        if int(err[0] if isinstance(err, tuple) else err) != 0:
            rt.cudaGetLastError()  # not sticky: clear it, then stage through the host
            dst.copy_(src.get(), stream=sid)
            return
        stream_wait(src._stream, sid, dst._device, src._device)


def host_in_layout(host: np.ndarray, strides: tuple[int, ...]) -> np.ndarray:
    """*host*'s elements laid out with the dense byte *strides* (copied only if needed)."""
    itemsize = host.itemsize
    if host.strides == strides and is_dense(host.shape, strides, itemsize):
        return host
    if host.flags.c_contiguous and is_c_contiguous(host.shape, strides, itemsize):
        return host
    buf = np.empty(host.size, host.dtype)
    np.ndarray(host.shape, host.dtype, buffer=buf, strides=strides)[...] = host
    return buf
