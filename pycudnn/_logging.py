"""Route cuDNN's own messages (``cudnnSetCallback``) into Python ``logging``.

Opt-in: nothing is installed until :func:`enable_logging` is called. The ctypes callback object is
kept in a module global for as long as cuDNN may call it (dropping it would leave cuDNN calling
freed memory). Messages go to the ``pycudnn.cudnn`` logger with cuDNN's severity mapped to a
logging level and the status, when cuDNN reports one, in the record's ``cudnn_status``.
"""

from __future__ import annotations

import logging
import threading

from . import api
from ._generated import lib as _lib

LOGGER = logging.getLogger("pycudnn.cudnn")

# cudnnSeverity_t -> logging level
_LEVELS = {
    _lib.CUDNN_SEV_FATAL: logging.CRITICAL,
    _lib.CUDNN_SEV_ERROR: logging.ERROR,
    _lib.CUDNN_SEV_WARNING: logging.WARNING,
    _lib.CUDNN_SEV_INFO: logging.INFO,
}

_lock = threading.Lock()
_callback = None  # the live CFUNCTYPE object while installed


def _on_message(sev, udata, dbg, msg):
    # Runs inside a cuDNN call, possibly on any thread: never raise out of here.
    try:
        status = dbg.contents.cudnnStatus if dbg else 0
        text = msg.decode(errors="replace").rstrip() if msg else ""
        LOGGER.log(_LEVELS.get(sev, logging.INFO), "%s", text, extra={"cudnn_status": status})
    except Exception:  # pragma: no cover - logging itself failed; nothing sensible to do
        pass


def _mask_for(level: int) -> int:
    mask = _lib.CUDNN_SEV_ERROR_EN
    if level <= logging.WARNING:
        mask |= _lib.CUDNN_SEV_WARNING_EN
    if level <= logging.INFO:
        mask |= _lib.CUDNN_SEV_INFO_EN
    return mask


def enable_logging(level: int = logging.WARNING) -> None:
    """Send cuDNN's messages at *level* and above to the ``pycudnn.cudnn`` logger.

    Parameters
    ----------
    level : int
        A ``logging`` level: ``ERROR`` (cuDNN errors only), ``WARNING`` (and warnings) or
        ``INFO``/``DEBUG`` (and cuDNN's API trace: every call is logged, which is slow).
        The logger's own level is set to *level* too, so the messages are not filtered out.
    """
    global _callback
    with _lock:
        cb = _lib.cudnnCallback_t(_on_message)
        api.cudnnSetCallback(_mask_for(level), None, cb)
        _callback = cb  # keep alive: cuDNN holds only the raw function pointer
        LOGGER.setLevel(level)


def disable_logging() -> None:
    """Uninstall the callback (cuDNN returns to its default behaviour)."""
    global _callback
    with _lock:
        api.cudnnSetCallback(0, None, _lib.cudnnCallback_t())
        _callback = None
