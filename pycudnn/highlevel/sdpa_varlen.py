"""``dnn_sdpa_varlen`` and ``dnn_sdpa_varlen_grad`` under their first module path: the functions
live in :mod:`pycudnn.highlevel.attention` (one package for every attention layout); this module
keeps ``from pycudnn.highlevel.sdpa_varlen import dnn_sdpa_varlen`` working."""

from __future__ import annotations

from .attention import dnn_sdpa_varlen, dnn_sdpa_varlen_grad

__all__ = ["dnn_sdpa_varlen", "dnn_sdpa_varlen_grad"]
