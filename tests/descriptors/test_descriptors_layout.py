"""The layout of the ``pycudnn.descriptors`` package: the public names stay where they were
documented, every file stays readable, and files import only public names from each other."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import pycudnn
import pycudnn.descriptors

PKG = Path(pycudnn.descriptors.__file__).resolve().parent
FILES = sorted(PKG.glob("*.py"))
MAX_LINES = 1000

PUBLIC = [
    "ActivationDescriptor",
    "BackendDescriptor",
    "CTCLossDescriptor",
    "ConvolutionDescriptor",
    "DropoutDescriptor",
    "FilterDescriptor",
    "LRNDescriptor",
    "OpTensorDescriptor",
    "PoolingDescriptor",
    "RNNDataDescriptor",
    "RNNDescriptor",
    "ReduceTensorDescriptor",
    "SpatialTransformerDescriptor",
    "TensorDescriptor",
]


def test_all_is_unchanged():
    # the descriptor classes, live_counts, and the batch-norm epsilon floor (added for the
    # high-level batch normalization)
    assert sorted(pycudnn.descriptors.__all__) == sorted([*PUBLIC, "live_counts", "BN_MIN_EPSILON"])


@pytest.mark.parametrize("name", [*PUBLIC, "live_counts"])
def test_documented_path(name):
    obj = getattr(pycudnn.descriptors, name)
    namespace: dict = {}
    exec(f"from pycudnn.descriptors import {name}", namespace)
    assert namespace[name] is obj


@pytest.mark.parametrize("name", PUBLIC)
def test_reexported_from_pycudnn(name):
    assert name in pycudnn.__all__
    assert getattr(pycudnn, name) is getattr(pycudnn.descriptors, name)


def test_star_import_gives_all():
    namespace: dict = {}
    exec("from pycudnn.descriptors import *", namespace)
    assert set(pycudnn.descriptors.__all__) <= namespace.keys()


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_file_is_readable_in_a_sitting(path):
    n = len(path.read_text().splitlines())
    assert n <= MAX_LINES, f"{path.name} has {n} lines (limit {MAX_LINES}): split it"


def test_package_docstring_names_every_file():
    doc = pycudnn.descriptors.__doc__
    for path in FILES:
        if path.name != "__init__.py":
            assert f"``{path.name}``" in doc, f"{path.name} is not described in the docstring"


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_files_import_only_public_names_from_each_other(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            private = [a.name for a in node.names if a.name.startswith("_")]
            assert not private, f"{path.name} imports {private} from .{node.module}"


def test_validation_kit_makes_no_c_calls():
    tree = ast.parse((PKG / "_validate.py").read_text())
    imported = {
        a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for a in node.names
    }
    assert "errors" not in imported and "api" not in imported
    calls = [
        node.func.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "_lib"
    ]
    assert not calls, f"_validate.py calls {calls}"


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_every_file_says_what_it_holds(path):
    name = "pycudnn.descriptors" + ("" if path.stem == "__init__" else f".{path.stem}")
    assert importlib.import_module(name).__doc__, f"{path.name} has no module docstring"
