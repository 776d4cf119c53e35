"""Seeing what ``pycudnn.torch.convert`` did (issue 39, item 5) on the CPU: per module, converted,
fused into which chain or left alone and why (``conversion_report``); the chains the fusion pass
found (``fusions``: fused ones and near misses, with the modules they call); ``programs``; and
the public names of the adapter's introspection.

All of it is read off the model (class swaps and an fx trace), so no GPU is needed.
"""

from __future__ import annotations

import inspect
import warnings

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import pycudnn.torch as pt  # noqa: E402
from pycudnn.torch import attention_scope, fuse  # noqa: E402

PUBLIC = (
    "AttentionCalls",
    "AttentionRoute",
    "ConversionReport",
    "ModuleConversion",
    "attention_calls",
    "conversion_report",
    "fusions",
    "programs",
    "use_programs",
)


@pytest.mark.parametrize("name", PUBLIC)
def test_names_are_public_and_importable(name):
    assert name in pt.__all__ and name in dir(pt)
    assert getattr(pt, name) is not None
    exec(f"from pycudnn.torch import {name}", {})


def test_exports_are_the_modules_functions():
    assert pt.fusions is fuse.fusions and pt.programs is fuse.programs
    assert pt.AttentionRoute is attention_scope.AttentionRoute
    assert pt.attention_calls is attention_scope.attention_calls


# -- conversion_report -----------------------------------------------------------------------------
class Conv1D(nn.Module):
    """transformers' GPT-2 ``Conv1D`` as far as the report goes (its class name and module)."""

    def __init__(self, nf, nx):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(nx, nf))
        self.bias = nn.Parameter(torch.zeros(nf))

    def forward(self, x):
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight)


Conv1D.__module__ = "transformers.pytorch_utils"
Conv1D.__qualname__ = "Conv1D"


class MyLinear(nn.Linear):
    """A subclass of a converted class (convert leaves it alone)."""


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn, self.act = nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU()
        self.conv3, self.bn3 = nn.Conv2d(8, 8, 1), nn.BatchNorm2d(8)  # conv3 used twice
        self.reflect = nn.Conv2d(8, 8, 3, padding_mode="reflect")
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
        self.norm = nn.BatchNorm1d(4)
        self.proj = Conv1D(4, 4)
        self.mine = MyLinear(4, 4)

    def forward(self, x):
        y = self.act(self.bn(self.conv(x)))
        c = self.conv3(y)
        y = self.pool(self.reflect(self.bn3(c) + c)).flatten(1)
        return self.mine(self.proj(self.norm(self.head(y))))


def _converted(**kw):
    model = Model()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # reflect padding stays torch's, with a warning
        out = pt.convert(model, exclude=lambda m: m is model.norm, fuse=True, **kw)
    assert out is model
    return model


def _table(report):
    return {r.path: (r.kind, r.status) for r in report}


def test_report_of_a_converted_and_fused_model():
    model = _converted()
    report = pt.conversion_report(model)
    assert isinstance(report, pt.ConversionReport)
    assert all(isinstance(r, pt.ModuleConversion) for r in report)
    assert _table(report) == {
        "conv": ("Conv2d", "fused"),
        "bn": ("BatchNorm2d", "fused"),
        "act": ("ReLU", "fused"),
        "conv3": ("Conv2d", "converted"),
        "bn3": ("BatchNorm2d", "converted"),
        "reflect": ("Conv2d", "left alone"),
        "pool": ("AdaptiveAvgPool2d", "left alone"),
        "head.0": ("Linear", "fused"),
        "head.1": ("GELU", "fused"),
        "head.2": ("Linear", "converted"),
        "norm": ("BatchNorm1d", "left alone"),
        "proj": ("transformers.pytorch_utils.Conv1D", "left alone"),
        "mine": ("test_torch_convert_introspection.MyLinear", "left alone"),  # not torch.nn's
    }  # the model and the Sequential are containers: not listed
    d = {r.path: r.detail for r in report}
    chain = "conv_bn_act chain conv -> bn -> act (traced at the model)"
    assert d["conv"] == f"pycudnn.torch.Conv2d; {chain}"
    assert d["act"] == f"pycudnn.torch.ReLU; {chain}"
    assert d["head.1"] == "torch.nn.GELU; linear_act chain head.0 -> head.1 (traced at the model)"
    assert d["head.2"] == "pycudnn.torch.Linear"
    assert d["conv3"].startswith("pycudnn.torch.Conv2d; not fused as conv_bn with bn3: ")
    assert "2 users" in d["conv3"]
    assert d["reflect"] == "padding_mode='reflect' (cuDNN pads with zeros only)"
    assert d["pool"].startswith("AdaptiveAvgPool2d is not a module pycudnn.torch converts: ")
    assert "adaptive pooling" in d["pool"]
    assert d["norm"] == "excluded by convert's exclude"
    assert "Conv1D (GPT-2)" in d["proj"] and "torch.nn.Linear" in d["proj"]
    assert d["mine"].startswith("MyLinear is a subclass of torch.nn.Linear")
    assert report["head.1"].status == "fused"
    assert [r.path for r in report.left_alone] == ["reflect", "pool", "norm", "proj", "mine"]
    assert [r.path for r in report.converted] == ["conv3", "bn3", "head.2"]
    assert len(report.fused) == 5 and len(report) == 13


def test_report_prints_a_table():
    report = pt.conversion_report(_converted())
    text = str(report)
    lines = text.splitlines()
    assert lines[0] == report.summary() == "13 modules: 3 converted, 5 fused, 5 left alone"
    assert lines[1].split() == ["module", "class", "status", "detail"]
    assert set(lines[2].replace(" ", "")) == {"-"}
    assert len(lines) == 3 + len(report)
    status_at = lines[1].index("status")
    for line, row in zip(lines[3:], report, strict=True):
        assert line.startswith(row.path) and row.kind in line and line.endswith(row.detail)
        assert line[status_at:].startswith(row.status)
    assert repr(report) == f"<ConversionReport: {report.summary()}>"
    with pytest.raises(KeyError, match="no module at 'nowhere'"):
        report["nowhere"]


def test_report_before_convert_and_after_back():
    model = Model()
    before = pt.conversion_report(model)
    assert {r.status for r in before} == {"left alone"}
    assert before["conv"].detail == "not converted yet: convert(model) converts it"
    assert before["reflect"].detail.startswith("padding_mode='reflect'")
    model = _converted()
    pt.convert(model, back=True)
    after = pt.conversion_report(model)
    assert {r.status for r in after} == {"left alone"}
    assert after["norm"].detail == "not converted yet: convert(model) converts it"  # forgotten
    assert pt.fusions(model) == []


def test_report_of_the_model_itself_and_a_non_module():
    conv = pt.convert(nn.Conv2d(3, 4, 3))
    (row,) = pt.conversion_report(conv)
    assert (row.path, row.status, row.detail) == ("", "converted", "pycudnn.torch.Conv2d")
    assert str(pt.conversion_report(conv)).splitlines()[3].startswith("(model)")
    with pytest.raises(TypeError, match=r"torch\.nn\.Module"):
        pt.conversion_report("model")


def test_a_later_convert_without_exclude_converts_an_excluded_module():
    model = _converted()
    assert pt.conversion_report(model)["norm"].status == "left alone"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pt.convert(model)
    assert pt.conversion_report(model)["norm"].status == "converted"


def test_report_signature_is_typed():
    sig = inspect.signature(pt.conversion_report)
    assert list(sig.parameters) == ["model"]
    assert sig.return_annotation in ("ConversionReport", pt.ConversionReport)


@pytest.mark.parametrize(
    ("module", "words"),
    [
        (nn.AdaptiveMaxPool1d(2), "adaptive pooling"),
        (nn.MaxPool1d(2), "2-D and 3-D pooling"),
        (nn.LeakyReLU(), "activation modes"),
        (nn.Embedding(4, 4), "table lookup"),
        (nn.MultiheadAttention(8, 2), "use_cudnn_attention()"),
        (nn.MultiheadAttention(8, 2).out_proj, "subclass of torch.nn.Linear"),
        (nn.Identity(), "is not a module pycudnn.torch converts"),
    ],
)
def test_unsupported_reason_says_why_for_classes_convert_leaves(module, words):
    assert words in pt.unsupported_reason(module)


# -- fusions and programs ------------------------------------------------------------------------
class ConvTwice(nn.Module):
    """A chain that does not fuse (the convolution's output has two users), and nothing else."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 3, 1), nn.BatchNorm2d(3)

    def forward(self, x):
        y = self.conv(x)
        return self.bn(y) + y


def test_fusions_name_the_modules_of_each_chain():
    model = _converted()
    recs = {rec.pattern: (path, rec) for path, rec in pt.fusions(model)}
    assert recs["conv_bn_act"][1].modules == ("conv", "bn", "act")
    assert recs["linear_act"][1].modules == ("head.0", "head.1")
    assert recs["conv_bn"][1].modules == ("conv3", "bn3") and not recs["conv_bn"][1].fused


def test_fusions_list_near_misses_where_nothing_fused():
    """A traced module whose only chain did not fuse keeps its records (before: none listed)."""
    outer = nn.Sequential(ConvTwice())
    pt.convert(outer, fuse=True)
    ((path, rec),) = pt.fusions(outer)
    assert (path, rec.pattern, rec.fused) == ("", "conv_bn", False)
    assert rec.modules == ("0.conv", "0.bn")  # traced at the Sequential, through ConvTwice
    assert "forward" not in outer.__dict__  # nothing was rewritten
    assert pt.conversion_report(outer)["0.conv"].detail.endswith(rec.reason)
    pt.convert(outer, back=True)
    assert pt.fusions(outer) == []


def test_a_function_in_a_chain_has_no_module():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return F.relu(self.fc(x))

    model = pt.convert(M(), fuse=True)
    ((_, rec),) = pt.fusions(model)
    assert rec.modules == ("fc", "") and rec.fused
    assert pt.conversion_report(model)["fc"].detail.endswith("linear_act chain fc -> relu "
                                                              "(traced at the model)")  # fmt: skip


def test_programs_are_empty_before_a_run_and_for_unfused_models():
    model = _converted()
    assert pt.programs(model) == []
    assert pt.programs(nn.Linear(2, 2)) == []


def test_the_guides_example_prints_as_shown():
    """docs/embedding.md's report of a small CNN is what the report prints (CPU: conversion and
    fusion need no GPU)."""
    from pathlib import Path

    page = Path(__file__).resolve().parents[2] / "docs" / "embedding.md"
    text = page.read_text()
    start = text.index("  6 modules: 1 converted, 3 fused, 2 left alone")
    shown = [line.removeprefix("  ") for line in text[start:].split("\n  ```", 1)[0].splitlines()]
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4),
    )  # fmt: skip
    assert str(pt.conversion_report(pt.convert(model, fuse=True))).splitlines() == shown
