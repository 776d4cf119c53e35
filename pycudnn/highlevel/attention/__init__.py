"""Scaled dot-product attention on cuDNN's fused flash-attention engines: ``dnn_sdpa`` and its
gradient ``dnn_sdpa_grad`` on dense (and padded) operands, ``dnn_sdpa_varlen`` and
``dnn_sdpa_varlen_grad`` on packed variable-length sequences, ``dnn_sdpa_paged`` over a paged KV
cache; each call one builder graph (:mod:`pycudnn.graph.nodes.sdpa`) planned and cached like
every graph.

Dense layout: q ``(B, H, S_q, D)``, k ``(B, H_k, S_kv, D)``, v ``(B, H_k, S_kv, D_v)`` as
logical dims; a ``(B, S, H, D)`` array is passed as its ``transpose(1, 2)`` view (strides carry
the layout, nothing is copied). ``H`` a multiple of ``H_k``: grouped-query (and, ``H_k = 1``,
multi-query) attention. The head dim must be contiguous (stride 1); other operands go through
a packed copy. float16 and bfloat16 (cuDNN's fused attention has no float32 engine).

Masks: ``is_causal`` (top-left aligned, as torch's, or bottom-right), a band
(``left_bound``/``right_bound``: sliding windows), an additive ``attn_mask`` (a bias, with its
gradient), ALiBi, sink tokens (:mod:`._masks`), and per-batch valid lengths
``seq_lens_q``/``seq_lens_kv`` (int32 device arrays of shape (B,)): rows and columns past a
batch's lengths are masked (padding).

Dropout: ``dropout_p`` with a ``seed`` (Philox; the same seed gives the same mask, and the
gradient with the same seed regenerates it). Without a seed a random one is drawn, and the
backward cannot reproduce the mask: pass a seed when training with dropout.

Packed sequences (the "THD" layout of flash-attn's ``flash_attn_varlen_func`` and torch's
``varlen_attn``, on cuDNN's ragged offsets, :meth:`pycudnn.graph.Tensor.set_ragged_offset`): the
sequences of a batch are concatenated token after token, with no padding between them: q
``(total_q, H, D)``, k ``(total_kv, H_k, D)``, v ``(total_kv, H_k, D_v)``, and
``cu_seqlens_q``/``cu_seqlens_kv`` the ``B + 1`` cumulative lengths (``[0, s_0, s_0 + s_1,
...]``). The graph sees each operand as ``(B, H, max_seqlen, D)`` with the token stride as the
sequence stride; cuDNN finds batch ``b``'s first row at the element offset ``cu_seqlens[b] *
token stride`` (one offset array per distinct token stride) and bounds its rows by the lengths
``cu_seqlens[b + 1] - cu_seqlens[b]`` (the padding mask, which cuDNN requires with ragged
offsets). The softmax statistics are float32 ``(total_q, H, 1)``, packed like q. The cumulative
lengths are checked on the host before any C call (they decide where cuDNN reads and writes): a
host sequence or NumPy array is read as is; a device array is copied to the host first -- a
small copy that **synchronises** the call's stream. The lengths and offsets the graph reads are
uploaded once per distinct content (cached), so a training loop that repeats its batch shapes
uploads nothing.

Paged KV cache (inference; vLLM's and FlashInfer's layout): keys and values live in fixed-size
blocks (pages) of a shared pool, ``k_cache``/``v_cache`` ``(num_blocks, H_k, block_size, D)`` as
logical dims (vLLM's ``(num_blocks, block_size, H_k, D)`` storage is passed as its
``transpose(1, 2)`` view), and an int32 ``page_table`` ``(B, pages_per_sequence)`` says which
block holds each sequence's tokens ``[i * block_size, (i + 1) * block_size)``. One table serves K
and V unless ``page_table_v`` is given (cuDNN reads each through its own paged cache load).
Decode is ``S_q = 1``; prefill and speculative decoding ``S_q > 1`` new queries, the last of each
sequence's keys (causal masks are bottom-right aligned, as ``flash_attn_with_kvcache``'s). The
table's entries, the lengths' values and the blocks' contents are not checked by default: they
live on the device, and checking them costs a copy and a synchronisation per call (flash-attn
and vLLM leave them unchecked too); ``check_indices=True`` (or ``pycudnn.config.check_indices``)
checks them on the host before the launch (:mod:`pycudnn.highlevel._index_checks`).

Internals
---------
The package is built around one frozen request, in one direction (each module imports only those
before it):

* :mod:`._request`: the :class:`~._request.AttentionRequest` (dense, padded, ragged or paged
  layout; masks, bounds, ALiBi, sink, dropout; either direction) and the validated
  :class:`~._request.Checked` call;
* :mod:`._options`, :mod:`._masks`, :mod:`._cu_seqlens`: the scalar options, the masks, the
  packed lengths checked (the ALiBi slopes and the uploaded lengths are device caches of the
  one registry: ``clear_caches()`` frees them, ``cache_info()`` counts them);
* :mod:`._operands`: the one operand reader (a request into a checked call);
* :mod:`._calls`: the call entries (dropout's seeded one, the paged default lengths' one);
* :mod:`._graph`: one forward and one backward graph builder through the graph nodes;
* :mod:`._key`: the hot path (call keys and pointers, the thread's call cache);
* this module: the public functions, each passing its arguments as plain tuples to :mod:`._key`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal, overload

from . import _key

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from ...memory import DeviceArray
    from ...typing import DeviceArrayLike, StreamLike
    from .._annotations import Out, SdpaOptions

    #: cumulative lengths: host ints (a list, a NumPy array) or an int32 device array
    CuSeqlens = Sequence[int] | DeviceArrayLike

__all__ = [
    "dnn_sdpa",
    "dnn_sdpa_grad",
    "dnn_sdpa_paged",
    "dnn_sdpa_varlen",
    "dnn_sdpa_varlen_grad",
]


# training decides between out and (out, stats)
@overload
def dnn_sdpa(
    q: DeviceArrayLike,
    k: DeviceArrayLike,
    v: DeviceArrayLike,
    attn_mask: DeviceArrayLike | None = ...,
    is_causal: bool = ...,
    scale: float | None = ...,
    dropout_p: float = ...,
    seed: int | None = ...,
    training: Literal[False] = ...,
    *,
    out: Out | None = ...,
    out_stats: DeviceArrayLike | None = ...,
    **options: Unpack[SdpaOptions],
) -> Out: ...
@overload
def dnn_sdpa(
    q: DeviceArrayLike,
    k: DeviceArrayLike,
    v: DeviceArrayLike,
    attn_mask: DeviceArrayLike | None = ...,
    is_causal: bool = ...,
    scale: float | None = ...,
    dropout_p: float = ...,
    seed: int | None = ...,
    training: Literal[True] = ...,
    *,
    out: Out | None = ...,
    out_stats: DeviceArrayLike | None = ...,
    **options: Unpack[SdpaOptions],
) -> tuple[Out, DeviceArray]: ...
@overload
def dnn_sdpa(
    q: DeviceArrayLike,
    k: DeviceArrayLike,
    v: DeviceArrayLike,
    attn_mask: DeviceArrayLike | None = ...,
    is_causal: bool = ...,
    scale: float | None = ...,
    dropout_p: float = ...,
    seed: int | None = ...,
    training: bool = ...,
    *,
    out: Out | None = ...,
    out_stats: DeviceArrayLike | None = ...,
    **options: Unpack[SdpaOptions],
) -> Out | tuple[Out, DeviceArray]: ...


def dnn_sdpa(
    q: DeviceArrayLike,
    k: DeviceArrayLike,
    v: DeviceArrayLike,
    attn_mask: DeviceArrayLike | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
    seed: int | None = None,
    training: bool = False,
    *,
    seq_lens_q: DeviceArrayLike | None = None,
    seq_lens_kv: DeviceArrayLike | None = None,
    diagonal_alignment: Literal["top_left", "bottom_right"] = "top_left",
    left_bound: int | None = None,
    right_bound: int | None = None,
    alibi: bool = False,
    sink: DeviceArrayLike | None = None,
    out: Out | None = None,
    out_stats: DeviceArrayLike | None = None,
    check_indices: bool | None = None,
    stream: StreamLike = None,
) -> Any:
    """Scaled dot-product attention, ``softmax(scale * q k^T + mask) v``, on cuDNN's fused
    flash-attention engines.

    Parameters
    ----------
    q, k, v : device array
        ``(B, H, S_q, D)``, ``(B, H_k, S_kv, D)``, ``(B, H_k, S_kv, D_v)``; float16 or
        bfloat16; ``H`` a multiple of ``H_k``; D and D_v multiples of 8, at most 256. Any
        strides (``x.transpose(1, 2)`` of a (B, S, H, D) array).
    attn_mask : device array, optional
        An additive mask (a bias) of q's dtype, ``(B or 1, H or 1, S_q, S_kv)``: 0 to
        attend, ``-inf`` to mask, any value to bias. A boolean mask is refused
        (``TypeError``): pass its additive form (see ``docs/graph.md``).
    is_causal : bool
        Mask keys after each query (top-left aligned, as ``torch``'s ``is_causal``;
        bottom-right with *diagonal_alignment*); the same as ``right_bound=0``.
    scale : float, optional
        Default ``1 / sqrt(D)``.
    dropout_p : float
        Probability of zeroing an attention weight, in [0, 1).
    seed : int, optional
        Dropout's Philox seed (default random); pass the same to :func:`dnn_sdpa_grad`.
    training : bool
        Also return the softmax statistics the backward needs.
    seq_lens_q, seq_lens_kv : device array, optional
        int32 ``(B,)`` valid lengths per batch (both or neither): padding masks.
    diagonal_alignment : {"top_left", "bottom_right"}
        The diagonal of the causal mask and the band: through the first query and key, or
        through the last query and key (decode, ``S_q < S_kv``).
    left_bound, right_bound : int, optional
        The band (sliding window): query ``i`` sees keys ``j`` with ``i - left_bound < j <=
        i + right_bound`` (shifted by ``S_kv - S_q`` bottom-right); left_bound >= 1,
        right_bound >= 0.
    alibi : bool
        Add ALiBi's ``slope_h * (j - i)`` (the paper's slopes for H heads); needs a causal
        mask for the backward.
    sink : device array, optional
        float32 ``(H,)`` or ``(1, H, 1, 1)`` sink logits: one extra softmax term per head
        with no value (cuDNN 9.13+).
    out : device array, optional
        ``(B, H, S_q, D_v)``, q's dtype, head dim contiguous.
    out_stats : device array, optional
        Where to write the statistics (``training=True`` only): float32 ``(B, H, S_q, 1)``,
        contiguous. With *out* and *out_stats* given, a repeated call launches with no
        allocation (how a framework binds the call once: ``pycudnn.torch``'s lean path).
    stream : optional
        CUDA stream; default the operands' framework's current stream (torch, CuPy), else the
        handle's stream.
    check_indices : bool, optional
        Read *seq_lens_q*/*seq_lens_kv* back and refuse a length outside ``[0, S_q]`` /
        ``[0, S_kv]`` before the launch (a copy and a synchronisation per call); default
        ``pycudnn.config.check_indices`` (False: unchecked, as flash-attn leaves them).

    Returns
    -------
    out, or (out, stats) when *training*
        ``stats``: float32 ``(B, H, S_q, 1)``, each row's log-sum-exp.

    Raises
    ------
    NotSupportedError
        float32/float64 data, head dims not multiples of 8 or over 256, a GPU older than
        sm80, or no engine in the loaded cuDNN for the case (the message says which).
    TypeError, ValueError
        Host arrays, mismatched shapes, bad options, a bad *out* (before any C call).

    Examples
    --------
    >>> o = pycudnn.dnn_sdpa(q, k, v, is_causal=True)
    """
    return _key.dense_forward(
        (q, k, v),
        (attn_mask, is_causal, scale, dropout_p, seed, training),
        (seq_lens_q, seq_lens_kv),
        (diagonal_alignment, left_bound, right_bound, alibi, sink),
        (out, out_stats),
        check_indices,
        stream,
    )


def dnn_sdpa_grad(
    q: DeviceArrayLike,
    k: DeviceArrayLike,
    v: DeviceArrayLike,
    out: DeviceArrayLike,
    dout: DeviceArrayLike,
    stats: DeviceArrayLike,
    attn_mask: DeviceArrayLike | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
    seed: int | None = None,
    *,
    seq_lens_q: DeviceArrayLike | None = None,
    seq_lens_kv: DeviceArrayLike | None = None,
    diagonal_alignment: Literal["top_left", "bottom_right"] = "top_left",
    left_bound: int | None = None,
    right_bound: int | None = None,
    alibi: bool = False,
    sink: DeviceArrayLike | None = None,
    bias_grad: bool = False,
    sink_grad: bool = False,
    deterministic: bool | None = None,
    out_grads: tuple[DeviceArrayLike, DeviceArrayLike, DeviceArrayLike] | None = None,
    check_indices: bool | None = None,
    stream: StreamLike = None,
) -> tuple[DeviceArray, ...]:
    """Gradients ``(dq, dk, dv)`` of :func:`dnn_sdpa`.

    Parameters
    ----------
    q, k, v, out, dout : device array
        The forward's inputs and output, and the output's gradient (out's shape and dtype).
    stats : device array
        The forward's statistics (``training=True``), float32 ``(B, H, S_q, 1)``.
    attn_mask, is_causal, scale, dropout_p, seq_lens_q, seq_lens_kv
        As in the forward.
    diagonal_alignment, left_bound, right_bound, alibi, sink
        As in the forward.
    bias_grad : bool
        Also return the gradient of *attn_mask* (cuDNN computes it only for a ``(1, H, S_q,
        S_kv)`` mask; other shapes raise ``NotSupportedError``).
    sink_grad : bool
        Also return the gradient of *sink* (float32 ``(1, H, 1, 1)``). Not yet verified on
        cuDNN 9.19: ``True`` raises ``NotSupportedError``.
    seed : int
        The forward's dropout seed (required when *dropout_p* > 0).
    deterministic : bool, optional
        cuDNN's deterministic variant (no float32 dQ accumulator); default
        ``pycudnn.config.deterministic``.
    out_grads : (dq, dk, dv) device arrays, optional
        Where to write the three gradients (shapes and dtype of q, k, v; head dim contiguous);
        not with *bias_grad* or *sink_grad*. With them given, a repeated call launches with no
        allocation (``pycudnn.torch``'s lean path binds the call so).
    stream : optional
        CUDA stream.
    check_indices : bool, optional
        As for :func:`dnn_sdpa`: the lengths checked on the host before the launch.

    Returns
    -------
    (dq, dk, dv[, dbias][, dsink])
        In q's, k's and v's memory order; dk and dv summed over each group of query heads;
        ``dbias`` (q's dtype) when *bias_grad*, ``dsink`` when *sink_grad*.
    """
    return _key.dense_backward(
        (q, k, v, out, dout, stats),
        (attn_mask, is_causal, scale, dropout_p, seed, deterministic),
        (seq_lens_q, seq_lens_kv),
        (diagonal_alignment, left_bound, right_bound, alibi, sink),
        (bias_grad, sink_grad),
        out_grads,
        (check_indices, stream),
    )


# ==================================================================================================
# Packed variable-length sequences
# ==================================================================================================


@overload
def dnn_sdpa_varlen(
    q: DeviceArrayLike,
    k: DeviceArrayLike,
    v: DeviceArrayLike,
    cu_seqlens_q: CuSeqlens,
    cu_seqlens_kv: CuSeqlens,
    max_seqlen_q: int,
    max_seqlen_kv: int,
    is_causal: bool = ...,
    scale: float | None = ...,
    dropout_p: float = ...,
    seed: int | None = ...,
    training: Literal[False] = ...,
    *,
    out: Out | None = ...,
    stream: StreamLike = ...,
) -> Out: ...
@overload
def dnn_sdpa_varlen(
    q: DeviceArrayLike,
    k: DeviceArrayLike,
    v: DeviceArrayLike,
    cu_seqlens_q: CuSeqlens,
    cu_seqlens_kv: CuSeqlens,
    max_seqlen_q: int,
    max_seqlen_kv: int,
    is_causal: bool = ...,
    scale: float | None = ...,
    dropout_p: float = ...,
    seed: int | None = ...,
    training: Literal[True] = ...,
    *,
    out: Out | None = ...,
    stream: StreamLike = ...,
) -> tuple[Out, DeviceArray]: ...
@overload
def dnn_sdpa_varlen(
    q: DeviceArrayLike,
    k: DeviceArrayLike,
    v: DeviceArrayLike,
    cu_seqlens_q: CuSeqlens,
    cu_seqlens_kv: CuSeqlens,
    max_seqlen_q: int,
    max_seqlen_kv: int,
    is_causal: bool = ...,
    scale: float | None = ...,
    dropout_p: float = ...,
    seed: int | None = ...,
    training: bool = ...,
    *,
    out: Out | None = ...,
    stream: StreamLike = ...,
) -> Out | tuple[Out, DeviceArray]: ...


def dnn_sdpa_varlen(
    q: DeviceArrayLike,
    k: DeviceArrayLike,
    v: DeviceArrayLike,
    cu_seqlens_q: CuSeqlens,
    cu_seqlens_kv: CuSeqlens,
    max_seqlen_q: int,
    max_seqlen_kv: int,
    is_causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
    seed: int | None = None,
    training: bool = False,
    *,
    out: Out | None = None,
    stream: StreamLike = None,
) -> Any:
    """Attention over packed variable-length sequences (the "THD" layout of flash-attn's
    ``flash_attn_varlen_func``), on cuDNN's fused flash-attention engines.

    Parameters
    ----------
    q, k, v : device array
        ``(total_q, H, D)``, ``(total_kv, H_k, D)``, ``(total_kv, H_k, D_v)``: the sequences
        concatenated along the first dim; float16 or bfloat16; ``H`` a multiple of ``H_k``
        (grouped-query); D and D_v multiples of 8, at most 256; the head dim contiguous (any
        token and head strides: a slice of a packed qkv array is taken as is).
    cu_seqlens_q, cu_seqlens_kv : sequence of int, NumPy array or int32 device array
        ``(B + 1,)`` cumulative lengths ``[0, s_0, s_0 + s_1, ..., total]``; every sequence has
        at least one token. A device array is read back to the host to be checked (a small
        copy that synchronises the stream).
    max_seqlen_q, max_seqlen_kv : int
        At least the longest sequence (part of the plan: keep them fixed, e.g. the batch's
        bucket, so that one plan serves many batches).
    is_causal : bool
        Mask the keys after each query, within each sequence, top-left aligned (as ``torch``'s
        ``is_causal``; the same as flash-attn's bottom-right causal when each sequence's q
        and kv lengths are equal).
    scale : float, optional
        Default ``1 / sqrt(D)``.
    dropout_p : float
        Probability of zeroing an attention weight, in [0, 1).
    seed : int, optional
        Dropout's Philox seed (default random); pass the same to
        :func:`dnn_sdpa_varlen_grad`.
    training : bool
        Also return the softmax statistics the backward needs.
    out : device array, optional
        ``(total_q, H, D_v)``, q's dtype, head dim contiguous.
    stream : optional
        CUDA stream; default the operands' framework's current stream (torch, CuPy), else the
        handle's stream.

    Returns
    -------
    out, or (out, stats) when *training*
        ``out`` ``(total_q, H, D_v)``, packed; ``stats`` float32 ``(total_q, H, 1)``, each
        query row's log-sum-exp (natural log), packed like q's tokens.

    Raises
    ------
    NotSupportedError
        float32/float64 data, head dims not multiples of 8 or over 256, a GPU older than sm90
        before cuDNN 9.18.1, grouped-query heads before cuDNN 9.6, or no engine in the loaded
        cuDNN for the case.
    TypeError, ValueError
        Bad operands or options, cumulative lengths that do not start at 0, do not increase,
        do not end at the total tokens, or hold a sequence longer than its maximum (before any
        C call).

    Examples
    --------
    >>> cu = [0, 5, 12]  # two sequences of 5 and 7 tokens; q, k, v (12, H, D)
    >>> o = pycudnn.dnn_sdpa_varlen(q, k, v, cu, cu, 7, 7, is_causal=True)
    """
    return _key.ragged_forward(
        (q, k, v),
        (cu_seqlens_q, cu_seqlens_kv),
        (max_seqlen_q, max_seqlen_kv),
        (is_causal, scale, dropout_p, seed, training),
        out,
        stream,
    )


def dnn_sdpa_varlen_grad(
    q: DeviceArrayLike,
    k: DeviceArrayLike,
    v: DeviceArrayLike,
    out: DeviceArrayLike,
    dout: DeviceArrayLike,
    stats: DeviceArrayLike,
    cu_seqlens_q: CuSeqlens,
    cu_seqlens_kv: CuSeqlens,
    max_seqlen_q: int,
    max_seqlen_kv: int,
    is_causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
    seed: int | None = None,
    *,
    deterministic: bool | None = None,
    stream: StreamLike = None,
) -> tuple[DeviceArray, DeviceArray, DeviceArray]:
    """Gradients ``(dq, dk, dv)`` of :func:`dnn_sdpa_varlen`.

    Parameters
    ----------
    q, k, v, out, dout : device array
        The forward's packed inputs and output, and the output's gradient (out's shape and
        dtype, head dim contiguous).
    stats : device array
        The forward's statistics (``training=True``), float32 ``(total_q, H, 1)``, contiguous.
    cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, is_causal, scale, dropout_p
        As in the forward.
    seed : int
        The forward's dropout seed (required when *dropout_p* > 0).
    deterministic : bool, optional
        cuDNN's deterministic variant (no float32 dQ accumulator); default
        ``pycudnn.config.deterministic``.
    stream : optional
        CUDA stream.

    Returns
    -------
    (dq, dk, dv)
        Packed ``(total_q, H, D)``, ``(total_kv, H_k, D)``, ``(total_kv, H_k, D_v)``; dk and
        dv summed over each group of query heads.

    Raises
    ------
    NotSupportedError
        As the forward, and a sequence of one query and one key everywhere (``max_seqlen_q =
        max_seqlen_kv = 1``, which cuDNN's backward does not run).
    TypeError, ValueError
        Bad operands, options or cumulative lengths (before any C call).
    """
    return _key.ragged_backward(
        (q, k, v, out, dout, stats),
        (cu_seqlens_q, cu_seqlens_kv),
        (max_seqlen_q, max_seqlen_kv),
        (is_causal, scale, dropout_p, seed),
        deterministic,
        stream,
    )


# ==================================================================================================
# A paged KV cache
# ==================================================================================================


def dnn_sdpa_paged(
    q: DeviceArrayLike,
    k_cache: DeviceArrayLike,
    v_cache: DeviceArrayLike,
    page_table: DeviceArrayLike,
    seq_lens_kv: DeviceArrayLike,
    max_seqlen_kv: int | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    *,
    page_table_v: DeviceArrayLike | None = None,
    seq_lens_q: DeviceArrayLike | None = None,
    out: Out | None = None,
    stream: StreamLike = None,
    check_indices: bool | None = None,
) -> Out:
    """Scaled dot-product attention of new queries over a paged KV cache, ``softmax(scale * q
    k^T + mask) v`` with k and v gathered from their blocks, on cuDNN's fused flash-attention
    engines (forward only; cuDNN 9.5 or newer).

    Parameters
    ----------
    q : device array
        ``(B, H, S_q, D)``, float16 or bfloat16, any strides (``x.transpose(1, 2)`` of a (B,
        S_q, H, D) array); ``S_q = 1`` for decode.
    k_cache, v_cache : device array
        ``(num_blocks, H_k, block_size, D)`` and ``(num_blocks, H_k, block_size, D_v)``, q's
        dtype, head dim contiguous (vLLM's ``(num_blocks, block_size, H_k, D)`` storage as its
        ``transpose(1, 2)`` view); ``H`` a multiple of ``H_k`` (grouped-query attention); D and
        D_v multiples of 8, at most 256 (over 128: cuDNN 9.10 or newer).
    page_table : device array
        int32 ``(B, pages_per_sequence)``: ``page_table[b, i]`` is the block of k_cache (and of
        v_cache unless *page_table_v*) that holds tokens ``i * block_size`` to ``(i + 1) *
        block_size - 1`` of sequence ``b``. Any positive strides (a slice of a wider table).
    seq_lens_kv : device array
        int32 ``(B,)``: each sequence's number of cached keys (the new queries' included).
    max_seqlen_kv : int, optional
        The longest ``seq_lens_kv`` the graph serves, at most ``pages_per_sequence *
        block_size`` (the default); the graph reads ``ceil(max_seqlen_kv / block_size)`` pages
        per sequence. A smaller bound is a smaller graph.
    is_causal : bool
        Mask keys after each query, bottom-right aligned: query ``i`` of sequence ``b`` sees
        keys ``j <= i + seq_lens_kv[b] - seq_lens_q[b]`` (the queries are the sequence's last
        tokens). With ``S_q = 1`` the last query sees every key anyway (cuDNN 9.10 or newer
        runs the mask there; older ones refuse it: pass ``is_causal=False``).
    scale : float, optional
        Default ``1 / sqrt(D)``.
    page_table_v : device array, optional
        V's own int32 ``(B, pages)`` table (default: *page_table* serves both).
    seq_lens_q : device array, optional
        int32 ``(B,)`` valid queries per sequence (default: all ``S_q``); rows past a
        sequence's length are left as cuDNN writes them (zeros).
    out : device array, optional
        ``(B, H, S_q, D_v)``, q's dtype, head dim contiguous.
    stream : optional
        CUDA stream; default the operands' framework's current stream (torch, CuPy), else the
        handle's stream.
    check_indices : bool, optional
        Read the page tables and lengths back and refuse, before the launch, a length outside
        ``[0, S_q]`` / ``[0, max_seqlen_kv]`` or a page a sequence's length uses that names no
        block of the cache (a copy and a synchronisation per call). Default
        ``pycudnn.config.check_indices`` (False: unchecked, as flash-attn and vLLM leave them).

    Returns
    -------
    out
        ``(B, H, S_q, D_v)`` in q's memory order (or *out*).

    Raises
    ------
    NotSupportedError
        float32/float64 data, head dims not multiples of 8 or over 256, a GPU older than
        sm80, a cuDNN older than 9.5 (9.10 for head dims over 128 or a causal decode), or no
        engine in the loaded cuDNN for the case (the message says which).
    TypeError, ValueError
        Host arrays, a page table that is not int32 ``(B, pages)``, mismatched shapes,
        devices or dtypes, *max_seqlen_kv* beyond the table, bad options, a bad *out*
        (before any C call).

    Examples
    --------
    >>> o = pycudnn.dnn_sdpa_paged(q, k_cache, v_cache, block_table, cache_lens)  # decode
    """
    return _key.paged_forward(
        (q, k_cache, v_cache),
        (page_table, page_table_v, max_seqlen_kv),
        (seq_lens_q, seq_lens_kv),
        (is_causal, scale),
        out,
        check_indices,
        stream,
    )
