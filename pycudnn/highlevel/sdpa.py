"""``dnn_sdpa`` and ``dnn_sdpa_grad`` under their first module path: the functions live in
:mod:`pycudnn.highlevel.attention` (one package for every attention layout); this module keeps
``from pycudnn.highlevel.sdpa import dnn_sdpa`` working."""

from __future__ import annotations

from .attention import dnn_sdpa, dnn_sdpa_grad

__all__ = ["dnn_sdpa", "dnn_sdpa_grad"]
