"""cuDNN's own messages reach Python logging through cudnnSetCallback (tier B: no GPU)."""

from __future__ import annotations

import ctypes
import logging

import pycudnn
from pycudnn import _logging, api, errors, lib


def test_callback_fires_into_logging(caplog):
    d = lib.cudnnTensorDescriptor_t()
    api.cudnnCreateTensorDescriptor(ctypes.byref(d))
    pycudnn.enable_logging(logging.ERROR)
    try:
        with caplog.at_level(logging.ERROR, logger="pycudnn.cudnn"):
            assert lib.cudnnSetTensor4dDescriptor(d, 0, 0, -1, 3, 4, 5) == 2000
        errors.last_error_string()
        records = [r for r in caplog.records if r.name == "pycudnn.cudnn"]
        assert records, "cuDNN's error callback did not reach logging"
        assert any("cudnnSetTensor4dDescriptor" in r.getMessage() for r in records)
        assert records[0].levelno == logging.ERROR
        assert records[0].cudnn_status == 2000
        assert _logging._callback is not None  # kept alive while installed
        mask, udata, fptr = ctypes.c_uint(), ctypes.c_void_p(), lib.cudnnCallback_t()
        api.cudnnGetCallback(ctypes.byref(mask), ctypes.byref(udata), ctypes.byref(fptr))
        assert mask.value == lib.CUDNN_SEV_ERROR_EN
    finally:
        pycudnn.disable_logging()
        api.cudnnDestroyTensorDescriptor(d)
    assert _logging._callback is None


def test_mask_for_levels():
    assert _logging._mask_for(logging.ERROR) == lib.CUDNN_SEV_ERROR_EN
    assert _logging._mask_for(logging.WARNING) == lib.CUDNN_SEV_ERROR_EN | lib.CUDNN_SEV_WARNING_EN
    assert _logging._mask_for(logging.DEBUG) == 2 | 4 | 8
