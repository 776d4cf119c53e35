"""The graph's pointwise methods: :meth:`~PointwiseOperations.pointwise` (any mode by
``PointwiseMode`` or name) and one method per mode, named as cudnn-frontend's ``pygraph`` names
them (:data:`.pointwise.POINTWISE_NAMES`; ``bias`` is ``add`` and ``scale`` is ``mul``).

Each mode's method is written out, so that type checkers and the API reference see its
signature; ``tests/graph/test_node_protocol.py`` holds them to the modes table (one per name,
its arity's signature and docstring). The modes, checks and encoding are :mod:`.pointwise`'s.
"""

from __future__ import annotations

from typing import Any

from ...enums import PointwiseMode as P
from .._tensor import GraphBase, Tensor
from .pointwise import apply, pointwise

__all__ = ["PointwiseOperations"]


class PointwiseOperations(GraphBase):
    """The graph's pointwise methods (a base of :class:`~pycudnn.graph.Graph`)."""

    def pointwise(
        self,
        mode: Any,
        input0: Tensor,
        input1: Tensor | None = None,
        input2: Tensor | None = None,
        *,
        compute_data_type: Any = None,
        alpha1: float = 1.0,
        alpha2: float = 1.0,
        name: str | None = None,
        **params: float,
    ) -> Tensor:
        """Any cuDNN pointwise mode (a ``PointwiseMode`` or its name, ``"add"``,
        ``"relu_fwd"``...): ``y = op(alpha1 * input0[, alpha2 * input1[, input2]])``. The
        backward modes (``*_bwd``) take ``input0=dy`` (the loss) and ``input1=x`` and give dx.
        *params*: ``relu_lower_clip``, ``relu_upper_clip``, ``relu_lower_clip_slope``,
        ``elu_alpha``, ``softplus_beta``, ``swish_beta``, ``axis`` (``gen_index``)."""
        inputs = (input0, input1, input2)
        alphas = (alpha1, alpha2)
        return pointwise(self, mode, inputs, compute_data_type, alphas, name, params)

    def add(
        self,
        a: Tensor,
        b: Tensor,
        *,
        compute_data_type: Any = None,
        alpha1: float = 1.0,
        alpha2: float = 1.0,
        name: str | None = None,
        **params: float,
    ) -> Tensor:
        """Pointwise ``ADD`` (2-input); see :meth:`pointwise`."""
        return apply(self, P.ADD, (a, b), compute_data_type, (alpha1, alpha2), name, params)

    def add_square(
        self,
        a: Tensor,
        b: Tensor,
        *,
        compute_data_type: Any = None,
        alpha1: float = 1.0,
        alpha2: float = 1.0,
        name: str | None = None,
        **params: float,
    ) -> Tensor:
        """Pointwise ``ADD_SQUARE`` (2-input); see :meth:`pointwise`."""
        return apply(self, P.ADD_SQUARE, (a, b), compute_data_type, (alpha1, alpha2), name, params)

    def div(
        self,
        a: Tensor,
        b: Tensor,
        *,
        compute_data_type: Any = None,
        alpha1: float = 1.0,
        alpha2: float = 1.0,
        name: str | None = None,
        **params: float,
    ) -> Tensor:
        """Pointwise ``DIV`` (2-input); see :meth:`pointwise`."""
        return apply(self, P.DIV, (a, b), compute_data_type, (alpha1, alpha2), name, params)

    def max(
        self,
        a: Tensor,
        b: Tensor,
        *,
        compute_data_type: Any = None,
        alpha1: float = 1.0,
        alpha2: float = 1.0,
        name: str | None = None,
        **params: float,
    ) -> Tensor:
        """Pointwise ``MAX`` (2-input); see :meth:`pointwise`."""
        return apply(self, P.MAX, (a, b), compute_data_type, (alpha1, alpha2), name, params)

    def min(
        self,
        a: Tensor,
        b: Tensor,
        *,
        compute_data_type: Any = None,
        alpha1: float = 1.0,
        alpha2: float = 1.0,
        name: str | None = None,
        **params: float,
    ) -> Tensor:
        """Pointwise ``MIN`` (2-input); see :meth:`pointwise`."""
        return apply(self, P.MIN, (a, b), compute_data_type, (alpha1, alpha2), name, params)

    def mod(
        self,
        a: Tensor,
        b: Tensor,
        *,
        compute_data_type: Any = None,
        alpha1: float = 1.0,
        alpha2: float = 1.0,
        name: str | None = None,
        **params: float,
    ) -> Tensor:
        """Pointwise ``MOD`` (2-input); see :meth:`pointwise`."""
        return apply(self, P.MOD, (a, b), compute_data_type, (alpha1, alpha2), name, params)

    def mul(
        self,
        a: Tensor,
        b: Tensor,
        *,
        compute_data_type: Any = None,
        alpha1: float = 1.0,
        alpha2: float = 1.0,
        name: str | None = None,
        **params: float,
    ) -> Tensor:
        """Pointwise ``MUL`` (2-input); see :meth:`pointwise`."""
        return apply(self, P.MUL, (a, b), compute_data_type, (alpha1, alpha2), name, params)

    def pow(
        self,
        a: Tensor,
        b: Tensor,
        *,
        compute_data_type: Any = None,
        alpha1: float = 1.0,
        alpha2: float = 1.0,
        name: str | None = None,
        **params: float,
    ) -> Tensor:
        """Pointwise ``POW`` (2-input); see :meth:`pointwise`."""
        return apply(self, P.POW, (a, b), compute_data_type, (alpha1, alpha2), name, params)

    def sub(
        self,
        a: Tensor,
        b: Tensor,
        *,
        compute_data_type: Any = None,
        alpha1: float = 1.0,
        alpha2: float = 1.0,
        name: str | None = None,
        **params: float,
    ) -> Tensor:
        """Pointwise ``SUB`` (2-input); see :meth:`pointwise`."""
        return apply(self, P.SUB, (a, b), compute_data_type, (alpha1, alpha2), name, params)

    def abs(
        self,
        input: Tensor,
        *,
        compute_data_type: Any = None,
        name: str | None = None,
        **params: float,
    ) -> Tensor:
        """Pointwise ``ABS`` (1-input); see :meth:`pointwise`."""
        return apply(self, P.ABS, (input,), compute_data_type, (1.0, 1.0), name, params)

    def ceil(
        self,
        input: Tensor,
        *,
        compute_data_type: Any = None,
        name: str | None = None,
        **params: float,
    ) -> Tensor:
        """Pointwise ``CEIL`` (1-input); see :meth:`pointwise`."""
        return apply(self, P.CEIL, (input,), compute_data_type, (1.0, 1.0), name, params)

    def cos(
        self,
        input: Tensor,
        *,
        compute_data_type: Any = None,
        name: str | None = None,
        **params: float,
    ) -> Tensor:
        """Pointwise ``COS`` (1-input); see :meth:`pointwise`."""
        return apply(self, P.COS, (input,), compute_data_type, (1.0, 1.0), name, params)

    def exp(
        self,
        input: Tensor,
        *,
        compute_data_type: Any = None,
        name: str | None = None,
        **params: float,
    ) -> Tensor:
        """Pointwise ``EXP`` (1-input); see :meth:`pointwise`."""
        return apply(self, P.EXP, (input,), compute_data_type, (1.0, 1.0), name, params)

    def floor(
        self,
        input: Tensor,
        *,
        compute_data_type: Any = None,
        name: str | None = None,
        **params: float,
    ) -> Tensor:
        """Pointwise ``FLOOR`` (1-input); see :meth:`pointwise`."""
        return apply(self, P.FLOOR, (input,), compute_data_type, (1.0, 1.0), name, params)

    def log(
        self,
        input: Tensor,
        *,
        compute_data_type: Any = None,
        name: str | None = None,
        **params: float,
    ) -> Tensor:
        """Pointwise ``LOG`` (1-input); see :meth:`pointwise`."""
        return apply(self, P.LOG, (input,), compute_data_type, (1.0, 1.0), name, params)

    def neg(
        self,
        input: Tensor,
        *,
        compute_data_type: Any = None,
        name: str | None = None,
        **params: float,
    ) -> Tensor:
        """Pointwise ``NEG`` (1-input); see :meth:`pointwise`."""
        return apply(self, P.NEG, (input,), compute_data_type, (1.0, 1.0), name, params)

    def rsqrt(
        self,
        input: Tensor,
        *,
        compute_data_type: Any = None,
        name: str | None = None,
        **params: float,
    ) -> Tensor:
        """Pointwise ``RSQRT`` (1-input); see :meth:`pointwise`."""
        return apply(self, P.RSQRT, (input,), compute_data_type, (1.0, 1.0), name, params)

    def sin(
        self,
        input: Tensor,
        *,
        compute_data_type: Any = None,
        name: str | None = None,
        **params: float,
    ) -> Tensor:
        """Pointwise ``SIN`` (1-input); see :meth:`pointwise`."""
        return apply(self, P.SIN, (input,), compute_data_type, (1.0, 1.0), name, params)

    def sqrt(
        self,
        input: Tensor,
        *,
        compute_data_type: Any = None,
        name: str | None = None,
        **params: float,
    ) -> Tensor:
        """Pointwise ``SQRT`` (1-input); see :meth:`pointwise`."""
        return apply(self, P.SQRT, (input,), compute_data_type, (1.0, 1.0), name, params)

    def tan(
        self,
        input: Tensor,
        *,
        compute_data_type: Any = None,
        name: str | None = None,
        **params: float,
    ) -> Tensor:
        """Pointwise ``TAN`` (1-input); see :meth:`pointwise`."""
        return apply(self, P.TAN, (input,), compute_data_type, (1.0, 1.0), name, params)

    def erf(
        self,
        input: Tensor,
        *,
        compute_data_type: Any = None,
        name: str | None = None,
        **params: float,
    ) -> Tensor:
        """Pointwise ``ERF`` (1-input); see :meth:`pointwise`."""
        return apply(self, P.ERF, (input,), compute_data_type, (1.0, 1.0), name, params)

    def identity(
        self,
        input: Tensor,
        *,
        compute_data_type: Any = None,
        name: str | None = None,
        **params: float,
    ) -> Tensor:
        """Pointwise ``IDENTITY`` (1-input); see :meth:`pointwise`."""
        return apply(self, P.IDENTITY, (input,), compute_data_type, (1.0, 1.0), name, params)

    def reciprocal(
        self,
        input: Tensor,
        *,
        compute_data_type: Any = None,
        name: str | None = None,
        **params: float,
    ) -> Tensor:
        """Pointwise ``RECIPROCAL`` (1-input); see :meth:`pointwise`."""
        return apply(self, P.RECIPROCAL, (input,), compute_data_type, (1.0, 1.0), name, params)

    def relu(
        self,
        input: Tensor,
        *,
        compute_data_type: Any = None,
        name: str | None = None,
        **params: float,
    ) -> Tensor:
        """Pointwise ``RELU_FWD`` (1-input); see :meth:`pointwise`."""
        return apply(self, P.RELU_FWD, (input,), compute_data_type, (1.0, 1.0), name, params)

    def tanh(
        self,
        input: Tensor,
        *,
        compute_data_type: Any = None,
        name: str | None = None,
        **params: float,
    ) -> Tensor:
        """Pointwise ``TANH_FWD`` (1-input); see :meth:`pointwise`."""
        return apply(self, P.TANH_FWD, (input,), compute_data_type, (1.0, 1.0), name, params)

    def sigmoid(
        self,
        input: Tensor,
        *,
        compute_data_type: Any = None,
        name: str | None = None,
        **params: float,
    ) -> Tensor:
        """Pointwise ``SIGMOID_FWD`` (1-input); see :meth:`pointwise`."""
        return apply(self, P.SIGMOID_FWD, (input,), compute_data_type, (1.0, 1.0), name, params)

    def elu(
        self,
        input: Tensor,
        *,
        compute_data_type: Any = None,
        name: str | None = None,
        **params: float,
    ) -> Tensor:
        """Pointwise ``ELU_FWD`` (1-input); see :meth:`pointwise`."""
        return apply(self, P.ELU_FWD, (input,), compute_data_type, (1.0, 1.0), name, params)

    def gelu(
        self,
        input: Tensor,
        *,
        compute_data_type: Any = None,
        name: str | None = None,
        **params: float,
    ) -> Tensor:
        """Pointwise ``GELU_FWD`` (1-input); see :meth:`pointwise`."""
        return apply(self, P.GELU_FWD, (input,), compute_data_type, (1.0, 1.0), name, params)

    def softplus(
        self,
        input: Tensor,
        *,
        compute_data_type: Any = None,
        name: str | None = None,
        **params: float,
    ) -> Tensor:
        """Pointwise ``SOFTPLUS_FWD`` (1-input); see :meth:`pointwise`."""
        return apply(self, P.SOFTPLUS_FWD, (input,), compute_data_type, (1.0, 1.0), name, params)

    def swish(
        self,
        input: Tensor,
        *,
        compute_data_type: Any = None,
        name: str | None = None,
        **params: float,
    ) -> Tensor:
        """Pointwise ``SWISH_FWD`` (1-input); see :meth:`pointwise`."""
        return apply(self, P.SWISH_FWD, (input,), compute_data_type, (1.0, 1.0), name, params)

    def gelu_approx_tanh(
        self,
        input: Tensor,
        *,
        compute_data_type: Any = None,
        name: str | None = None,
        **params: float,
    ) -> Tensor:
        """Pointwise ``GELU_APPROX_TANH_FWD`` (1-input); see :meth:`pointwise`."""
        return apply(
            self, P.GELU_APPROX_TANH_FWD, (input,), compute_data_type, (1.0, 1.0), name, params
        )

    def relu_backward(
        self,
        a: Tensor,
        b: Tensor,
        *,
        compute_data_type: Any = None,
        alpha1: float = 1.0,
        alpha2: float = 1.0,
        name: str | None = None,
        **params: float,
    ) -> Tensor:
        """Pointwise ``RELU_BWD`` (backward (loss, input) -> dx); see :meth:`pointwise`."""
        return apply(self, P.RELU_BWD, (a, b), compute_data_type, (alpha1, alpha2), name, params)

    def tanh_backward(
        self,
        a: Tensor,
        b: Tensor,
        *,
        compute_data_type: Any = None,
        alpha1: float = 1.0,
        alpha2: float = 1.0,
        name: str | None = None,
        **params: float,
    ) -> Tensor:
        """Pointwise ``TANH_BWD`` (backward (loss, input) -> dx); see :meth:`pointwise`."""
        return apply(self, P.TANH_BWD, (a, b), compute_data_type, (alpha1, alpha2), name, params)

    def sigmoid_backward(
        self,
        a: Tensor,
        b: Tensor,
        *,
        compute_data_type: Any = None,
        alpha1: float = 1.0,
        alpha2: float = 1.0,
        name: str | None = None,
        **params: float,
    ) -> Tensor:
        """Pointwise ``SIGMOID_BWD`` (backward (loss, input) -> dx); see :meth:`pointwise`."""
        return apply(self, P.SIGMOID_BWD, (a, b), compute_data_type, (alpha1, alpha2), name, params)

    def elu_backward(
        self,
        a: Tensor,
        b: Tensor,
        *,
        compute_data_type: Any = None,
        alpha1: float = 1.0,
        alpha2: float = 1.0,
        name: str | None = None,
        **params: float,
    ) -> Tensor:
        """Pointwise ``ELU_BWD`` (backward (loss, input) -> dx); see :meth:`pointwise`."""
        return apply(self, P.ELU_BWD, (a, b), compute_data_type, (alpha1, alpha2), name, params)

    def gelu_backward(
        self,
        a: Tensor,
        b: Tensor,
        *,
        compute_data_type: Any = None,
        alpha1: float = 1.0,
        alpha2: float = 1.0,
        name: str | None = None,
        **params: float,
    ) -> Tensor:
        """Pointwise ``GELU_BWD`` (backward (loss, input) -> dx); see :meth:`pointwise`."""
        return apply(self, P.GELU_BWD, (a, b), compute_data_type, (alpha1, alpha2), name, params)

    def softplus_backward(
        self,
        a: Tensor,
        b: Tensor,
        *,
        compute_data_type: Any = None,
        alpha1: float = 1.0,
        alpha2: float = 1.0,
        name: str | None = None,
        **params: float,
    ) -> Tensor:
        """Pointwise ``SOFTPLUS_BWD`` (backward (loss, input) -> dx); see :meth:`pointwise`."""
        return apply(
            self, P.SOFTPLUS_BWD, (a, b), compute_data_type, (alpha1, alpha2), name, params
        )

    def swish_backward(
        self,
        a: Tensor,
        b: Tensor,
        *,
        compute_data_type: Any = None,
        alpha1: float = 1.0,
        alpha2: float = 1.0,
        name: str | None = None,
        **params: float,
    ) -> Tensor:
        """Pointwise ``SWISH_BWD`` (backward (loss, input) -> dx); see :meth:`pointwise`."""
        return apply(self, P.SWISH_BWD, (a, b), compute_data_type, (alpha1, alpha2), name, params)

    def gelu_approx_tanh_backward(
        self,
        a: Tensor,
        b: Tensor,
        *,
        compute_data_type: Any = None,
        alpha1: float = 1.0,
        alpha2: float = 1.0,
        name: str | None = None,
        **params: float,
    ) -> Tensor:
        """Pointwise ``GELU_APPROX_TANH_BWD`` (backward (loss, input) -> dx); see :meth:`pointwise`."""  # noqa: E501
        return apply(
            self, P.GELU_APPROX_TANH_BWD, (a, b), compute_data_type, (alpha1, alpha2), name, params
        )

    def cmp_eq(
        self,
        a: Tensor,
        b: Tensor,
        *,
        compute_data_type: Any = None,
        alpha1: float = 1.0,
        alpha2: float = 1.0,
        name: str | None = None,
        **params: float,
    ) -> Tensor:
        """Pointwise ``CMP_EQ`` (2-input); see :meth:`pointwise`."""
        return apply(self, P.CMP_EQ, (a, b), compute_data_type, (alpha1, alpha2), name, params)

    def cmp_neq(
        self,
        a: Tensor,
        b: Tensor,
        *,
        compute_data_type: Any = None,
        alpha1: float = 1.0,
        alpha2: float = 1.0,
        name: str | None = None,
        **params: float,
    ) -> Tensor:
        """Pointwise ``CMP_NEQ`` (2-input); see :meth:`pointwise`."""
        return apply(self, P.CMP_NEQ, (a, b), compute_data_type, (alpha1, alpha2), name, params)

    def cmp_gt(
        self,
        a: Tensor,
        b: Tensor,
        *,
        compute_data_type: Any = None,
        alpha1: float = 1.0,
        alpha2: float = 1.0,
        name: str | None = None,
        **params: float,
    ) -> Tensor:
        """Pointwise ``CMP_GT`` (2-input); see :meth:`pointwise`."""
        return apply(self, P.CMP_GT, (a, b), compute_data_type, (alpha1, alpha2), name, params)

    def cmp_ge(
        self,
        a: Tensor,
        b: Tensor,
        *,
        compute_data_type: Any = None,
        alpha1: float = 1.0,
        alpha2: float = 1.0,
        name: str | None = None,
        **params: float,
    ) -> Tensor:
        """Pointwise ``CMP_GE`` (2-input); see :meth:`pointwise`."""
        return apply(self, P.CMP_GE, (a, b), compute_data_type, (alpha1, alpha2), name, params)

    def cmp_lt(
        self,
        a: Tensor,
        b: Tensor,
        *,
        compute_data_type: Any = None,
        alpha1: float = 1.0,
        alpha2: float = 1.0,
        name: str | None = None,
        **params: float,
    ) -> Tensor:
        """Pointwise ``CMP_LT`` (2-input); see :meth:`pointwise`."""
        return apply(self, P.CMP_LT, (a, b), compute_data_type, (alpha1, alpha2), name, params)

    def cmp_le(
        self,
        a: Tensor,
        b: Tensor,
        *,
        compute_data_type: Any = None,
        alpha1: float = 1.0,
        alpha2: float = 1.0,
        name: str | None = None,
        **params: float,
    ) -> Tensor:
        """Pointwise ``CMP_LE`` (2-input); see :meth:`pointwise`."""
        return apply(self, P.CMP_LE, (a, b), compute_data_type, (alpha1, alpha2), name, params)

    def logical_and(
        self,
        a: Tensor,
        b: Tensor,
        *,
        compute_data_type: Any = None,
        alpha1: float = 1.0,
        alpha2: float = 1.0,
        name: str | None = None,
        **params: float,
    ) -> Tensor:
        """Pointwise ``LOGICAL_AND`` (2-input); see :meth:`pointwise`."""
        return apply(self, P.LOGICAL_AND, (a, b), compute_data_type, (alpha1, alpha2), name, params)

    def logical_or(
        self,
        a: Tensor,
        b: Tensor,
        *,
        compute_data_type: Any = None,
        alpha1: float = 1.0,
        alpha2: float = 1.0,
        name: str | None = None,
        **params: float,
    ) -> Tensor:
        """Pointwise ``LOGICAL_OR`` (2-input); see :meth:`pointwise`."""
        return apply(self, P.LOGICAL_OR, (a, b), compute_data_type, (alpha1, alpha2), name, params)

    def logical_not(
        self,
        input: Tensor,
        *,
        compute_data_type: Any = None,
        name: str | None = None,
        **params: float,
    ) -> Tensor:
        """Pointwise ``LOGICAL_NOT`` (1-input); see :meth:`pointwise`."""
        return apply(self, P.LOGICAL_NOT, (input,), compute_data_type, (1.0, 1.0), name, params)

    def gen_index(
        self,
        input: Tensor,
        *,
        compute_data_type: Any = None,
        name: str | None = None,
        **params: float,
    ) -> Tensor:
        """Pointwise ``GEN_INDEX`` (1-input); see :meth:`pointwise`."""
        return apply(self, P.GEN_INDEX, (input,), compute_data_type, (1.0, 1.0), name, params)

    def binary_select(
        self,
        input0: Tensor,
        input1: Tensor,
        mask: Tensor,
        *,
        compute_data_type: Any = None,
        name: str | None = None,
    ) -> Tensor:
        """Pointwise ``BINARY_SELECT`` (3-input); see :meth:`pointwise`."""
        return apply(self, P.BINARY_SELECT, (input0, input1, mask), compute_data_type, name=name)

    # cudnn-frontend's spellings of two common ones
    bias = add
    scale = mul
