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
