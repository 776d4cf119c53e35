"""Matmul nodes: batched ``C = A @ B`` with broadcast (or grouped) batch dims and optional
per-batch valid sizes -- checks, the output's shape and encoding."""

from __future__ import annotations

from typing import Any

from ... import _layout
from ...descriptors import BackendDescriptor
from ...enums import BackendAttributeName as A
from ...enums import BackendAttributeType as T
from ...enums import BackendDescriptorType as D
from ...enums import DataType
from .._tensor import GraphBase, Tensor, check_type, described_dim, finite
from ._base import NodeKind

__all__ = ["KINDS", "MatmulOperations", "matmul"]


def matmul(
    g: GraphBase,
    a: Any,
    b: Any,
    compute: Any = None,
    padding_value: float | None = None,
    overrides: tuple = (None, None, None),
    name: str | None = None,
    groups: bool = False,
) -> Tensor:
    """``C = A @ B``: A (*batch, M, K), B (*batch, K, N) -> C (*batch, M, N); a batch dim of 1
    broadcasts; with *groups* (attention's heads) one operand's count may divide the other's.
    *overrides*: the M, N, K override tensors (int32 per-batch valid sizes) or None."""
    a = g._check("matmul", "A", a)
    b = g._check("matmul", "B", b)
    ad, bd = described_dim(a), described_dim(b)
    if len(ad) != len(bd) or len(ad) < 2:
        raise ValueError(
            f"{g.name}.matmul: A {ad} and B {bd} must have the same "
            "rank, at least 2 (add size-1 batch dims)"
        )
    if ad[-1] != bd[-2]:
        raise ValueError(
            f"{g.name}.matmul: A's last dim ({ad[-1]}) must equal B's "
            f"second to last ({bd[-2]}); A {ad}, B {bd}"
        )
    batch = []
    for i, (m, n) in enumerate(zip(ad[:-2], bd[:-2], strict=True)):
        grouped = groups and max(m, n) % min(m, n) == 0
        if m != n and 1 not in (m, n) and not grouped:
            raise ValueError(
                f"{g.name}.matmul: batch dim {i} of A ({m}) and B ({n}) differ and neither is 1"
            )
        batch.append(max(m, n))
    dim = (*batch, ad[-2], bd[-1])
    pad = None
    if padding_value is not None:
        pad = finite(padding_value, f"{g.name}.matmul: padding_value", allow_inf=True)
    c = g._new(
        name and f"{name}::C", (dim, _layout.packed_strides(dim), None), True, producer="matmul"
    )
    s: dict[str, Any] = {"compute_data_type": int(g._compute(compute, "matmul"))}
    if padding_value is not None:
        s["padding_value"] = pad
    roles = [
        ("OPERATION_MATMUL_ADESC", a),
        ("OPERATION_MATMUL_BDESC", b),
        ("OPERATION_MATMUL_CDESC", c),
    ]
    for which, t in zip("MNK", overrides, strict=True):
        t = _override(g, f"{which.lower()}_override", t, dim)
        if t is not None:
            roles.append((f"OPERATION_MATMUL_GEMM_{which}_OVERRIDE_DESC", t))
    g._node("matmul", name, s, roles)
    return c


def _override(g: GraphBase, argument: str, t: Any, dim: tuple[int, ...]) -> Tensor | None:
    """A valid-size override (one int32 per batch): dims of C's rank, ending in ``(1, 1)``, each
    batch dim C's or 1."""
    t = g._check("matmul", argument, t, optional=True)
    if t is None:
        return None
    where = f"{g.name}.matmul"
    d = described_dim(t)
    batch_ok = len(d) == len(dim) and all(
        s in (1, c) for s, c in zip(d[:-2], dim[:-2], strict=True)
    )
    if not batch_ok or d[-2:] != (1, 1):
        want = (*("1|" + str(c) if c != 1 else "1" for c in dim[:-2]), 1, 1)
        raise ValueError(
            f"{where}: {argument} ({t.name!r}) holds one valid size per batch: dims "
            f"({', '.join(map(str, want))}) for an output of dims {dim}, got {t.dim}"
        )
    check_type(where, argument, t, (DataType.INT32,))
    return t


def _matmul_desc(s: dict[str, Any]) -> BackendDescriptor:
    d = BackendDescriptor(D.MATMUL_DESCRIPTOR)
    d.set(A.MATMUL_COMP_TYPE, T.DATA_TYPE, DataType(s["compute_data_type"]))
    if s.get("padding_value") is not None:
        d.set(A.MATMUL_PADDING_VALUE, T.DOUBLE, float(s["padding_value"]))
    return d.finalize()


KINDS = {"matmul": NodeKind(D.OPERATION_MATMUL_DESCRIPTOR, (A.OPERATION_MATMUL_DESC, _matmul_desc))}


class MatmulOperations(GraphBase):
    """The graph's matrix product method (a base of :class:`~pycudnn.graph.Graph`)."""

    def matmul(
        self,
        A: Tensor,
        B: Tensor,
        *,
        compute_data_type: Any = None,
        padding_value: float | None = None,
        m_override: Tensor | None = None,
        n_override: Tensor | None = None,
        k_override: Tensor | None = None,
        name: str | None = None,
    ) -> Tensor:
        """Batched matrix product ``C = A @ B``: A (*batch, M, K), B (*batch, K, N) ->
        C (*batch, M, N); a batch dim of 1 in one operand broadcasts against the other's.
        Transposed operands are strides (a K-major B is B with swapped strides).
        *m_override*/*n_override*/*k_override*: int32 (batch..., 1, 1) tensors of per-batch
        valid sizes (variable lengths)."""
        overrides = (m_override, n_override, k_override)
        return matmul(self, A, B, compute_data_type, padding_value, overrides, name)
