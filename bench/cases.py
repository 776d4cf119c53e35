"""The benchmark cases of issue 6 (GPU-bound ones; the host-bound cases 1, 11, 12 live in
``runner.py``)."""

from __future__ import annotations

from dataclasses import dataclass

from .harness import ConvGeom

ALL_OPS = ("fwd", "dgrad", "wgrad")


@dataclass(frozen=True)
class Case:
    """One problem, run for each op in *ops* by both libraries."""

    id: str
    label: str
    geom: ConvGeom
    dtype: str  # torch/numpy dtype name: bfloat16, float16, float32
    channels_last: bool
    ops: tuple[str, ...] = ("fwd",)
    tf32: bool = False

    @property
    def layout(self) -> str:
        if self.geom.nd == 3:
            return "NDHWC" if self.channels_last else "NCDHW"
        return "NHWC" if self.channels_last else "NCHW"

    @property
    def itemsize(self) -> int:
        return {"bfloat16": 2, "float16": 2, "float32": 4, "float64": 8}[self.dtype]

    def title(self) -> str:
        dt = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float64": "fp64"}
        math = " TF32" if self.tf32 else (" FMA" if self.dtype == "float32" else "")
        return f"{self.label}: {self.geom.describe()} {dt[self.dtype]}{math} {self.layout}"


def _g2(n: int, c: int, k: int, hw: int, r: int, s: int = 1, p: int = 0, groups: int = 1):
    return ConvGeom(n, c, k, (hw, hw), (r, r), (s, s), (p, p), (1, 1), groups)


GPU_CASES: tuple[Case, ...] = (
    Case("2", "RN50 3x3 56^2", _g2(256, 64, 64, 56, 3, p=1), "bfloat16", True, ALL_OPS),
    Case("3", "RN50 3x3 14^2", _g2(256, 256, 256, 14, 3, p=1), "bfloat16", True, ALL_OPS),
    Case("4", "RN50 3x3 7^2", _g2(256, 512, 512, 7, 3, p=1), "bfloat16", True, ALL_OPS),
    Case("5", "1x1 expand 56^2", _g2(256, 64, 256, 56, 1), "bfloat16", True),
    Case("6a", "stem 7x7/2", _g2(256, 3, 64, 224, 7, s=2, p=3), "float16", True),
    Case("6b", "stem 7x7/2", _g2(256, 3, 64, 224, 7, s=2, p=3), "bfloat16", True),
    Case("7a", "fp32 NCHW 14^2", _g2(256, 256, 256, 14, 3, p=1), "float32", False),
    Case("7b", "fp32 NCHW 14^2", _g2(256, 256, 256, 14, 3, p=1), "float32", False, tf32=True),
    Case("8", "small batch 14^2", _g2(8, 256, 256, 14, 3, p=1), "bfloat16", True, ALL_OPS),
    Case("9", "depthwise", _g2(64, 512, 512, 14, 3, p=1, groups=512), "float16", True, ALL_OPS),
    Case(
        "10",
        "3-D 32^3",
        ConvGeom(2, 64, 64, (32, 32, 32), (3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1)),
        "bfloat16",
        True,
        ALL_OPS,
    ),
)


# -- fusion cases (issue 13): ResNet-50 bottleneck convs with their epilogues ------------------

FUSION_BATCH = 64


@dataclass(frozen=True)
class FusionCase:
    """y = relu(conv(x, w) + bias [+ z]), NHWC: torch eager (conv with bias, relu, + z) against
    pycudnn's one fused call and the frontend's fused graph."""

    id: str
    label: str
    geom: ConvGeom
    dtype: str
    residual: bool = False  # + z (the block's shortcut) before the relu

    @property
    def layout(self) -> str:
        return "NHWC"

    @property
    def epilogue(self) -> str:
        return "bias+z+relu" if self.residual else "bias+relu"

    def title(self) -> str:
        dt = {"bfloat16": "bf16", "float16": "fp16"}[self.dtype]
        return f"{self.label}: {self.geom.describe()} {dt} NHWC {self.epilogue}"


def _fusion_cases() -> tuple[FusionCase, ...]:
    n = FUSION_BATCH
    shapes = [
        ("f1", "RN50 3x3 56^2", _g2(n, 64, 64, 56, 3, p=1), False),
        ("f2", "RN50 3x3 14^2", _g2(n, 256, 256, 14, 3, p=1), False),
        ("f3", "1x1 reduce 56^2", _g2(n, 256, 64, 56, 1), False),
        ("f4", "1x1 expand 56^2 +residual", _g2(n, 64, 256, 56, 1), True),
    ]
    out = []
    for suffix, dtype in (("b", "bfloat16"), ("h", "float16")):
        for cid, label, geom, residual in shapes:
            out.append(FusionCase(cid + suffix, label, geom, dtype, residual))
    return tuple(out)


FUSION_CASES: tuple[FusionCase, ...] = _fusion_cases()

# -- selection: --cases ids and --only groups ---------------------------------------------------

GROUPS = {
    "tiny": ("1",),
    "cold": ("11",),
    "thrash": ("12",),
    "conv": tuple(c.id for c in GPU_CASES),
    "fusion": tuple(c.id for c in FUSION_CASES),
}


def _id_aliases(case_id: str) -> set[str]:
    """The names a case answers to: ``6a`` also as ``6``; ``f1b`` also as ``f1`` and ``f``."""
    names = {case_id}
    if case_id[:1].isdigit():
        names.add(case_id.rstrip("ab"))
    elif case_id.startswith("f"):
        names |= {case_id.rstrip("bh"), "f"}
    return names


@dataclass(frozen=True)
class Selection:
    """Which cases run: ``--cases`` (ids, ``6`` for 6a+6b, ``f1`` for f1b+f1h, ``f`` for all
    fusion cases) and ``--only`` (groups: tiny, cold, thrash, conv, fusion); both given: a case
    must pass both. Neither: everything."""

    cases: frozenset[str] | None = None
    groups: frozenset[str] | None = None

    @classmethod
    def parse(cls, cases: str | None, only: str | None) -> Selection:
        def split(s: str | None) -> frozenset[str] | None:
            items = frozenset(p.strip() for p in (s or "").split(",") if p.strip())
            return items or None

        sel = cls(split(cases), split(only))
        if sel.groups:
            unknown = sel.groups - set(GROUPS)
            if unknown:
                known = list(GROUPS)
                raise ValueError(f"unknown --only group(s) {sorted(unknown)}; known: {known}")
        if sel.cases:
            known = set().union(*(_id_aliases(i) for ids in GROUPS.values() for i in ids))
            unknown = sel.cases - known
            if unknown:
                raise ValueError(f"unknown case id(s) {sorted(unknown)}; known: {sorted(known)}")
        return sel

    def wants(self, case_id: str) -> bool:
        if self.groups is not None and not any(case_id in GROUPS[g] for g in self.groups):
            return False
        if self.cases is not None:
            return bool(_id_aliases(case_id) & self.cases)
        return True

    def wants_any(self, group: str) -> bool:
        return any(self.wants(i) for i in GROUPS[group])
