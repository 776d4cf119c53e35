"""The type variables and aliases of the high-level signatures (type checkers only).

Everything here is under ``TYPE_CHECKING``: importing this module at run time defines nothing,
so annotating the hot-path functions costs no import and no call.

``Out`` (``Out2``, ``Out3``, ``Out4``) is the type of an ``out=`` argument: a ``TypeVar`` whose
default (PEP 696) is :class:`~pycudnn.DeviceArray`. One signature ``out: Out | None = None) ->
Out`` then says both "a new DeviceArray when *out* is not given" and "*out*'s own type when it
is", with no ``@overload`` repeating the long parameter lists. ``Given`` is an argument returned
as itself. Overloads remain only where another argument changes the *shape* of the result
(``training``, ``return_indices``, running averages, a residual).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Literal, TypeAlias, TypedDict

    from typing_extensions import TypeVar

    from ..memory import DeviceArray
    from ..typing import DeviceArrayLike, StreamLike

    Out = TypeVar("Out", bound=DeviceArrayLike, default=DeviceArray)
    Out2 = TypeVar("Out2", bound=DeviceArrayLike, default=DeviceArray)
    Out3 = TypeVar("Out3", bound=DeviceArrayLike, default=DeviceArray)
    Out4 = TypeVar("Out4", bound=DeviceArrayLike, default=DeviceArray)
    Given = TypeVar("Given", bound=DeviceArrayLike)
    Given2 = TypeVar("Given2", bound=DeviceArrayLike)

    # the canonical spellings (the functions also take them in any case)
    BorderMode: TypeAlias = Literal["valid", "full", "half"] | int | tuple[int, ...]
    ConvMode: TypeAlias = Literal["conv", "cross"]
    DirectionHint: TypeAlias = Literal["forward", "forward!", "bprop weights", "bprop inputs"]
    ConvAlgo: TypeAlias = Literal[
        "small",
        "none",
        "large",
        "fft",
        "fft_tiling",
        "winograd",
        "winograd_non_fused",
        "deterministic",
        "guess_once",
        "guess_on_shape_change",
        "time_once",
        "time_on_shape_change",
    ]
    PoolMode: TypeAlias = Literal[
        "max", "average_inc_pad", "average_exc_pad", "max_deterministic", "average", "sum"
    ]
    ReduceOp: TypeAlias = Literal[
        "add",
        "sum",
        "mul",
        "prod",
        "min",
        "minimum",
        "max",
        "maximum",
        "amax",
        "avg",
        "mean",
        "norm1",
        "norm2",
        "mul_no_zeros",
    ]
    Precision: TypeAlias = Literal["as_input_f32", "as_input", "float16", "float32", "float64"]
    EpilogueName: TypeAlias = Literal[
        "relu", "clipped_relu", "gelu", "gelu_tanh", "silu", "swish", "sigmoid", "tanh", "elu"
    ]
    #: a fused activation: its name, or (name, parameter) for clipped_relu's ceiling, elu's alpha
    Epilogue: TypeAlias = EpilogueName | tuple[EpilogueName, float]

    class SdpaOptions(TypedDict, total=False):
        """The keyword-only options :func:`dnn_sdpa` and :func:`dnn_sdpa_grad` share."""

        seq_lens_q: DeviceArrayLike | None
        seq_lens_kv: DeviceArrayLike | None
        diagonal_alignment: Literal["top_left", "bottom_right"]
        left_bound: int | None
        right_bound: int | None
        alibi: bool
        sink: DeviceArrayLike | None
        check_indices: bool | None
        stream: StreamLike
