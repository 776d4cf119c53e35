"""Stand-ins for other frameworks' dtype objects, shaped as the real ones are (no torch or JAX
needed to test that pycudnn takes them).

``torch.float16`` is an instance of ``torch.dtype`` (a class of module ``torch``): ``str`` and
``repr`` are ``"torch.float16"``, it has ``is_floating_point``, ``is_complex``, ``is_signed`` and
(torch >= 2.1) ``itemsize``, and neither a ``name`` attribute nor a numpy reading
(``np.dtype(torch.float16)`` raises ``TypeError``). ``torch.half`` is the same object.

``jax.numpy.float32``/``bfloat16`` are scalar *types* whose class attribute ``dtype`` is the numpy
dtype (``ml_dtypes.bfloat16``'s for bfloat16). CuPy's dtypes are numpy's own (``cupy.float16 is
numpy.float16``), so numpy stands for them.
"""

from __future__ import annotations

import numpy as np


class dtype:  # torch's class name
    __module__ = "torch"

    def __init__(self, name: str, itemsize: int, floating: bool) -> None:
        self._name, self.itemsize, self.is_floating_point = name, itemsize, floating
        self.is_complex, self.is_signed = False, name not in ("uint8", "bool")

    def __repr__(self) -> str:
        return f"torch.{self._name}"

    __str__ = __repr__


class _Torch:
    """``torch``'s dtype attributes."""

    float16 = half = dtype("float16", 2, True)
    bfloat16 = dtype("bfloat16", 2, True)
    float32 = float = dtype("float32", 4, True)
    float64 = double = dtype("float64", 8, True)
    int8 = dtype("int8", 1, False)
    uint8 = dtype("uint8", 1, False)
    int32 = int = dtype("int32", 4, False)
    int64 = long = dtype("int64", 8, False)
    bool = dtype("bool", 1, False)
    complex64 = dtype("complex64", 8, False)  # a dtype cuDNN tensors do not take


torch = _Torch()


class _JaxScalarMeta(type):
    """JAX's ``_ScalarMeta``: ``jnp.float32`` is a type with a numpy ``dtype``."""


def _jax_scalar(np_dtype: np.dtype) -> type:
    return _JaxScalarMeta(np_dtype.name, (), {"dtype": np_dtype, "__module__": "jax.numpy"})


def jax_numpy():
    """``jax.numpy``'s dtypes (bfloat16 through ml_dtypes, as JAX has it)."""
    import ml_dtypes

    class jnp:
        float16 = _jax_scalar(np.dtype("float16"))
        float32 = _jax_scalar(np.dtype("float32"))
        bfloat16 = _jax_scalar(np.dtype(ml_dtypes.bfloat16))

    return jnp
