"""``dnn_sdpa_paged`` under its first module path: the function lives in
:mod:`pycudnn.highlevel.attention` (one package for every attention layout); this module keeps
``from pycudnn.highlevel.sdpa_paged import dnn_sdpa_paged`` working."""

from __future__ import annotations

from .attention import dnn_sdpa_paged

__all__ = ["dnn_sdpa_paged"]
