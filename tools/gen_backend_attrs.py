#!/usr/bin/env python3
"""Generate ``pycudnn/_generated/backend_attrs.py``: which descriptor owns each backend
attribute, and which descriptor types a ``CUDNN_TYPE_BACKEND_DESCRIPTOR`` attribute takes.

The source is cuDNN's own documentation of ``cudnnBackendDescriptorType_t`` in ``cudnn_graph.h``
(the same text as the "Backend Descriptor Types" pages of the cuDNN API reference): each
descriptor type lists its attributes, their ``CUDNN_TYPE_*`` and, for descriptor-valued ones,
usually the ``CUDNN_BACKEND_*_DESCRIPTOR`` they take. Where the documentation says less (an
attribute listed without a type, an attribute absent from the listing, a descriptor-valued one
without its descriptor type) the tables ``OWNER_PREFIXES`` and ``DESCRIPTOR_TYPES`` below fill
in, each line with the reason; an attribute this script cannot classify is an error, so a new
cuDNN release cannot slip an unchecked descriptor-valued attribute past it.

Usage::

    python tools/gen_backend_attrs.py [--header path/to/cudnn_graph.h] [--check]

The default header is the one of the installed ``nvidia-cudnn-cu12``/``-cu13`` wheel.
``--check`` exits 1 when the generated module is out of date (the test suite runs it).
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "pycudnn" / "_generated" / "backend_attrs.py"  # the generated folder only

# -- what the documentation leaves out -----------------------------------------------------------
# Attribute-name prefix -> owning descriptor type (without CUDNN_BACKEND_ / _DESCRIPTOR), for the
# attributes a descriptor's documentation block does not list. Longest prefix wins.
OWNER_PREFIXES = {
    "POINTWISE_": "POINTWISE",
    "CONVOLUTION_": "CONVOLUTION",
    "ENGINEHEUR_": "ENGINEHEUR",
    "ENGINECFG_": "ENGINECFG",
    "EXECUTION_PLAN_": "EXECUTION_PLAN",
    "INTERMEDIATE_INFO_": "INTERMEDIATE_INFO",
    "KNOB_CHOICE_": "KNOB_CHOICE",
    "KNOB_INFO_": "KNOB_INFO",
    "LAYOUT_INFO_": "LAYOUT_INFO",
    "ENGINE_": "ENGINE",
    "OPERATION_CONVOLUTION_FORWARD_": "OPERATION_CONVOLUTION_FORWARD",
    "OPERATION_CONVOLUTION_BWD_DATA_": "OPERATION_CONVOLUTION_BACKWARD_DATA",
    "OPERATION_CONVOLUTION_BWD_FILTER_": "OPERATION_CONVOLUTION_BACKWARD_FILTER",
    "OPERATION_POINTWISE_": "OPERATION_POINTWISE",
    "OPERATION_GENSTATS_": "OPERATION_GEN_STATS",
    "OPERATION_BN_FINALIZE_": "OPERATION_BN_FINALIZE_STATISTICS",
    "OPERATIONGRAPH_": "OPERATIONGRAPH",
    "VARIANT_PACK_": "VARIANT_PACK",
    "TENSOR_": "TENSOR",
    "MATMUL_": "MATMUL",
    "OPERATION_MATMUL_": "OPERATION_MATMUL",
    "REDUCTION_": "REDUCTION",
    "OPERATION_REDUCTION_": "OPERATION_REDUCTION",
    "OPERATION_BN_BWD_WEIGHTS_": "OPERATION_BN_BWD_WEIGHTS",
    "RESAMPLE_": "RESAMPLE",
    "OPERATION_RESAMPLE_FWD_": "OPERATION_RESAMPLE_FWD",
    "OPERATION_RESAMPLE_BWD_": "OPERATION_RESAMPLE_BWD",
    "OPERATION_CONCAT_": "OPERATION_CONCAT",
    "OPERATION_SIGNAL_": "OPERATION_SIGNAL",
    "OPERATION_NORM_FWD_": "OPERATION_NORM_FORWARD",
    "OPERATION_NORM_BWD_": "OPERATION_NORM_BACKWARD",
    "OPERATION_RESHAPE_": "OPERATION_RESHAPE",
    "OPERATION_TRANSPOSE_": "OPERATION_TRANSPOSE",
    "OPERATION_SLICE_": "OPERATION_SLICE",
    "OPERATION_ROPE_FWD_": "OPERATION_ROPE_FWD",
    "OPERATION_ROPE_BWD_": "OPERATION_ROPE_BWD",
    "RNG_": "RNG",
    "OPERATION_RNG_": "OPERATION_RNG",
    "KERNEL_CACHE_": "KERNEL_CACHE",
    "OPERATION_PAGED_CACHE_LOAD_": "OPERATION_PAGED_CACHE_LOAD",
    "OPERATION_BLOCK_SCALE_QUANTIZE_": "OPERATION_BLOCK_SCALE_QUANTIZE",
    "OPERATION_BLOCK_SCALE_DEQUANTIZE_": "OPERATION_BLOCK_SCALE_DEQUANTIZE",
    "DEVICEPROP_": "DEVICEPROP",
    "OPERATION_EXPAND_BAND_MATRIX_": "OPERATION_EXPAND_BAND_MATRIX",
    "OPERATION_CONTRACT_BAND_MATRIX_": "OPERATION_CONTRACT_BAND_MATRIX",
    "OPERATION_CONTRACT_BAND_": "OPERATION_CONTRACT_BAND_MATRIX",  # ..._MAX_TOKEN_VALUE
    "OPERATION_SDPA_FWD_": "OPERATION_SDPA_FWD",
    "OPERATION_SDPA_BWD_": "OPERATION_SDPA_BWD",
    "OPERATION_MOE_GROUPED_MATMUL_": "OPERATION_MOE_GROUPED_MATMUL",
    "OPERATION_MOE_GROUPED_MATMUL_BWD_": "OPERATION_MOE_GROUPED_MATMUL_BWD",
    "OPERATION_DIAGONAL_BAND_MASK_": "OPERATION_DIAGONAL_BAND_MASK",
    "OPERATION_SOFTMAX_": "OPERATION_SOFTMAX",
}

# Descriptor-valued attributes whose documentation does not name the descriptor type they take
# (or names it only in prose this script cannot read). "OPERATION_*" means every operation
# descriptor type.
DESCRIPTOR_TYPES = {
    # "The operation graph for which heuristics result in a query."
    "ENGINEHEUR_OPERATION_GRAPH": ("OPERATIONGRAPH",),
    # the graph's nodes: "1+ elements of type CUDNN_BACKEND_OPERATION_*_DESCRIPTOR"
    "OPERATIONGRAPH_OPS": ("OPERATION_*",),
    # "the engine config in question is passed into this attribute" (cudnnBackendGetAttribute)
    "KERNEL_CACHE_IS_ENGINECFG_KERNEL_CACHED": ("ENGINECFG",),
    # the "Pointwise descriptor reference" (header comment of the enum member)
    "OPERATION_POINTWISE_PW_DESCRIPTOR": ("POINTWISE",),
    # operation descriptors' own configuration descriptors, named after their non-operation type
    "OPERATION_REDUCTION_DESC": ("REDUCTION",),
    "OPERATION_RESAMPLE_FWD_DESC": ("RESAMPLE",),
    "OPERATION_RESAMPLE_BWD_DESC": ("RESAMPLE",),
    "OPERATION_RNG_DESC": ("RNG",),
    "OPERATION_MATMUL_DESC": ("MATMUL",),
    "OPERATION_CONVOLUTION_FORWARD_CONV_DESC": ("CONVOLUTION",),
    "OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC": ("CONVOLUTION",),
    "OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC": ("CONVOLUTION",),
    # listed without a type under the BN backward-weights descriptor; an output tensor like the
    # other EQ_* attributes (cudnn-frontend sets a tensor descriptor on it)
    "OPERATION_BN_BWD_WEIGHTS_EQ_BIAS": ("TENSOR",),
    # sub-graphs of fused operations are operation graphs ("Operation graph describing the reducer
    # body ... Must be finalized before it is set")
    "OPERATION_REDUCTION_SUBGRAPH": ("OPERATIONGRAPH",),
    "OPERATION_SDPA_FWD_SUBGRAPH": ("OPERATIONGRAPH",),
    "OPERATION_SDPA_BWD_SUBGRAPH": ("OPERATIONGRAPH",),
    # "Softmax descriptor ... with CUDNN_ATTR_OPERATION_SOFTMAX_STATS_LOG2 set": a softmax
    # operation node configuring the SDPA's softmax
    "OPERATION_SDPA_FWD_SOFTMAX_DESC": ("OPERATION_SOFTMAX",),
}

# Attributes with a descriptor-like name that are not descriptor-valued (documented types).
NOT_DESCRIPTORS = {
    "OPERATION_CONCAT_INPLACE_INDEX",  # INT64
}

_DESC_NAME = re.compile(r"(DESC|DESCS|_DESCRIPTOR)$")
_CONV_TENSORS = re.compile(
    r"^OPERATION_CONVOLUTION_(FORWARD|BWD_DATA|BWD_FILTER)_(X|W|Y|DX|DY|DW)$"
)


def default_header() -> Path:
    try:
        import nvidia.cudnn  # type: ignore[import-not-found]
    except ImportError:
        sys.exit("no header given and the nvidia-cudnn wheel is not installed")
    base = Path(next(iter(nvidia.cudnn.__path__)))
    return base / "include" / "cudnn_graph.h"


def header_version(text: str) -> str:
    major = re.search(r"#define CUDNN_GRAPH_MAJOR (\d+)", text)
    minor = re.search(r"#define CUDNN_GRAPH_MINOR (\d+)", text)
    patch = re.search(r"#define CUDNN_GRAPH_PATCH (\d+)", text)
    if not (major and minor and patch):
        return "?"
    return f"{major[1]}.{minor[1]}.{patch[1]}"


def _enum_block(lines: list[str], name: str) -> tuple[int, int]:
    end = next(i for i, ln in enumerate(lines) if f"}} {name};" in ln)
    start = max(i for i in range(end) if lines[i].startswith("typedef enum"))
    return start, end


def parse(text: str) -> tuple[list[str], dict[str, tuple[str, str]], list[str]]:
    """(attribute names in enum order, name -> (owner descriptor, documentation text),
    descriptor type names)."""
    lines = text.splitlines()
    a0, a1 = _enum_block(lines, "cudnnBackendAttributeName_t")
    # members may carry CUDNN_DEPRECATED_ENUM, and a long one has its value on the next line
    body = "\n".join(lines[a0:a1])
    attrs = re.findall(r"^\s*CUDNN_ATTR_(\w+)(?:\s+CUDNN_DEPRECATED_ENUM)?\s*=\s*\d+", body, re.M)
    d0, d1 = _enum_block(lines, "cudnnBackendDescriptorType_t")
    descs: list[str] = []
    docs: dict[str, tuple[str, str]] = {}
    block: list[str] = []
    for ln in lines[d0:d1]:
        m = re.match(r"\s*CUDNN_BACKEND_(\w+)_DESCRIPTOR\s*=\s*\d+", ln)
        if m:
            descs.append(m[1])
            _entries(block, m[1], set(attrs), docs)
            block = []
            continue
        s = ln.strip()
        if s.startswith(("*", "/**")):
            block.append(s.lstrip("/*").rstrip("*/ ").rstrip())
    return attrs, docs, descs


def _entries(block: list[str], owner: str, known: set[str], docs: dict) -> None:
    """Split one descriptor type's documentation into per-attribute entries."""
    current, text = None, []
    for ln in block:
        s = ln.strip()
        m = re.match(r"^-?\s*CUDNN_ATTR_(\w+)\b(.*)$", s)
        head = m is not None and m[1] in known and (not m[2].strip() or m[2].strip()[0] == "(")
        if head or s.startswith(("Finalization", "@brief")):
            if current is not None:
                docs.setdefault(current, (owner, " ".join(text)))
            current, text = (m[1], [m[2]]) if head else (None, [])
            continue
        if current is not None:
            text.append(s)
    if current is not None:
        docs.setdefault(current, (owner, " ".join(text)))


def owner_of(name: str, docs: dict[str, tuple[str, str]]) -> str:
    if name in docs:
        return docs[name][0]
    best = max((p for p in OWNER_PREFIXES if name.startswith(p)), key=len, default=None)
    if best is None:
        raise SystemExit(f"CUDNN_ATTR_{name}: no owning descriptor type (add to OWNER_PREFIXES)")
    return OWNER_PREFIXES[best]


def classify(name: str, docs: dict[str, tuple[str, str]], descs: list[str]) -> tuple | None:
    """The descriptor types a descriptor-valued attribute takes, or None for other attributes."""
    doc = docs.get(name, ("", ""))[1]
    types = re.findall(r"CUDNN_TYPE_(\w+)", doc)
    documented_desc = "BACKEND_DESCRIPTOR" in types
    named = _DESC_NAME.search(name) is not None or _CONV_TENSORS.match(name) is not None
    if name in NOT_DESCRIPTORS:
        if documented_desc:
            raise SystemExit(f"CUDNN_ATTR_{name} is documented as BACKEND_DESCRIPTOR now")
        return None
    if not documented_desc and not (named and not types) and name not in DESCRIPTOR_TYPES:
        return None
    if name in DESCRIPTOR_TYPES:
        return DESCRIPTOR_TYPES[name]
    # "Descriptor type CUDNN_BACKEND_X_DESCRIPTOR", "1 element of CUDNN_BACKEND_X_DESCRIPTOR",
    # "one element of descriptor type ...": not other descriptors the prose mentions
    pattern = r"(?:[Dd]escriptor type|elements? of(?: type)?)\s+CUDNN_BACKEND_(\w+?)_DESCRIPTOR\b"
    found = [d for d in re.findall(pattern, doc) if d in descs]
    found = list(dict.fromkeys(found))
    if found:
        return tuple(found)
    if named:
        # "..._DESC"/"..._DESCS" of an operation, and the conv X/W/Y/DX/DY/DW: tensor operands
        # (the enum comments call each one a tensor descriptor)
        return ("TENSOR",)
    raise SystemExit(
        f"CUDNN_ATTR_{name}: descriptor-valued, type unknown (add to DESCRIPTOR_TYPES)"
    )


def render(header: Path) -> str:
    text = header.read_text()
    attrs, docs, descs = parse(text)
    digest = hashlib.sha256(text.encode()).hexdigest()
    rows = []
    for name in attrs:
        owner = owner_of(name, docs)
        if owner not in descs:
            raise SystemExit(f"CUDNN_ATTR_{name}: owner {owner} is not a descriptor type")
        takes = classify(name, docs, descs)
        src = "doc" if name in docs else "prefix"
        rows.append((name, owner, takes, src))
    by_owner: dict[str, list[str]] = {}
    for n, o, _t, _s in rows:
        by_owner.setdefault(o, []).append(n)
    out = [
        "# Generated by tools/gen_backend_attrs.py from the documentation of",
        f"# cudnnBackendDescriptorType_t in cudnn_graph.h (cuDNN {header_version(text)}).",
        "# DO NOT EDIT: rerun the tool (its tables say where the documentation is filled in).",
        f"# header-sha256: {digest}",
        '"""Backend attribute table, from cuDNN\'s documentation of each backend attribute.',
        "",
        "``ATTRIBUTES[owner]`` lists the attributes of each ``BackendDescriptorType`` (its name",
        "without ``_DESCRIPTOR``); ``TAKES[name]`` lists the descriptor types a",
        '``CUDNN_TYPE_BACKEND_DESCRIPTOR`` attribute accepts (``"OPERATION_*"``: every operation',
        "descriptor type); attributes of other types are absent from it. ``UNLISTED`` names the",
        "attributes the documentation of their descriptor does not list (owner from the name).",
        "Names are without ``CUDNN_ATTR_`` / ``CUDNN_BACKEND_``.",
        '"""',
        "",
        f'HEADER_VERSION = "{header_version(text)}"',
        "",
        "ATTRIBUTES: dict[str, tuple[str, ...]] = {",
    ]
    for owner, names in by_owner.items():
        out.append(f'    "{owner}": (')
        out += [f'        "{n}",' for n in names]
        out.append("    ),")
    out += ["}", "", "TAKES: dict[str, tuple[str, ...]] = {"]
    for n, _o, t, _s in rows:
        if t is not None:
            out.append(f'    "{n}": ({", ".join(f"{chr(34)}{x}{chr(34)}" for x in t)},),')
    out += ["}", "", "UNLISTED: frozenset[str] = frozenset(", "    ("]
    out += [f'        "{n}",' for n, _o, _t, src in rows if src == "prefix"]
    out += ["    )", ")", ""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--header", type=Path, default=None)
    ap.add_argument("--check", action="store_true", help="exit 1 if the module is out of date")
    args = ap.parse_args(argv)
    header = args.header or default_header()
    new = render(header)
    if args.check:
        old = OUT.read_text() if OUT.exists() else ""
        if old != new:
            print(f"{OUT} is out of date with {header}: rerun tools/gen_backend_attrs.py")
            return 1
        return 0
    OUT.write_text(new)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
