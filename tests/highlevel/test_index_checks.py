"""Issue 42 item 5: the opt-in check of attention's page tables and sequence lengths
(``pycudnn.config.check_indices`` or ``check_indices=``), without a GPU.

The operands are fake device arrays holding host values (what the check reads back); every way
into CUDA/cuDNN raises ``CCall`` (``no_c``), so a refusal is seen to come before the launch,
and a call the check lets through reaches the first C call. Off by default: nothing is read.
"""

from __future__ import annotations

import numpy as np
import pytest
from _fake_device import F16, CCall, Fake
from _fake_device import no_c as no_c  # the fixture

import pycudnn
from pycudnn import memory
from pycudnn.enums import DataType
from pycudnn.highlevel import _index_checks

I32 = DataType.INT32
B, H, SQ, D = 3, 4, 1, 64
NUM_BLOCKS, BLOCK, PAGES = 10, 16, 4  # each sequence can address 64 keys


@pytest.fixture
def reads(no_c, monkeypatch):
    """``memory.asarray`` reads a fake array (its ``get`` returns its host values); the reads
    are recorded."""
    seen = []

    def asarray(obj, *a, **kw):
        seen.append(obj)
        return obj

    monkeypatch.setattr(memory, "asarray", asarray)
    return seen


def ints(values):
    a = np.asarray(values, np.int32)
    return Fake(a.shape, I32, host=a)


def _paged(table, lens_kv, lens_q=None, table_v=None, **kw):
    q = Fake((B, H, SQ, D), F16)
    kc, vc = Fake((NUM_BLOCKS, 2, BLOCK, D), F16), Fake((NUM_BLOCKS, 2, BLOCK, D), F16)
    return pycudnn.dnn_sdpa_paged(
        q,
        kc,
        vc,
        ints(table),
        ints(lens_kv),
        seq_lens_q=None if lens_q is None else ints(lens_q),
        page_table_v=None if table_v is None else ints(table_v),
        **kw,
    )


GOOD = [[0, 1, 2, 3], [4, 5, -1, -1], [9, -7, 99, 0]]  # padding past each sequence's pages
LENS = [64, 20, 16]  # pages used: 4, 2, 1


def test_valid_tables_and_lengths_pass_to_the_launch(reads):
    with pytest.raises(CCall):
        _paged(GOOD, LENS, check_indices=True)
    assert len(reads) == 2  # the lengths and the table, read once each


@pytest.mark.parametrize(
    ("table", "lens", "match"),
    [
        (
            [[0, 1, 2, 10], [4, 5, 0, 0], [9, 0, 0, 0]],
            LENS,
            r"page_table\[0, 3\] = 10 is not a block of the cache \[0, 10\)",
        ),
        (
            [[0, 1, 2, 3], [4, -1, 0, 0], [9, 0, 0, 0]],
            LENS,
            r"page_table\[1, 1\] = -1 is not a block .*sequence 1's 20 keys use its first 2",
        ),
        (GOOD, [64, 65, 1], r"seq_lens_kv\[1\] = 65 is outside \[0, 64\]"),
        (GOOD, [64, -3, 1], r"seq_lens_kv\[1\] = -3 is outside \[0, 64\]"),
    ],
)
def test_bad_entries_are_refused_before_the_launch(reads, table, lens, match):
    with pytest.raises(ValueError, match=f"dnn_sdpa_paged: {match}"):
        _paged(table, lens, check_indices=True)


def test_v_table_and_query_lengths(reads):
    bad_v = [[0, 1, 2, 3], [4, 5, 0, 0], [12, 0, 0, 0]]
    with pytest.raises(ValueError, match=r"page_table_v\[2, 0\] = 12"):
        _paged(GOOD, LENS, table_v=bad_v, check_indices=True)
    with pytest.raises(ValueError, match=r"seq_lens_q\[0\] = 2 is outside \[0, 1\]"):
        _paged(GOOD, LENS, lens_q=[2, 1, 1], check_indices=True)
    with pytest.raises(ValueError, match=r"seq_lens_kv\[0\] = 64 is outside \[0, 32\]"):
        _paged(GOOD, LENS, max_seqlen_kv=32, check_indices=True)


def test_off_by_default_and_by_config(reads):
    bad = [[0, 1, 2, 99]] * 3
    with pytest.raises(CCall):  # unchecked: reaches the launch
        _paged(bad, LENS)
    assert reads == []
    with pycudnn.config.override(check_indices=True):
        with pytest.raises(ValueError, match=r"page_table\[0, 3\] = 99"):
            _paged(bad, LENS)
        with pytest.raises(CCall):  # the call's argument wins over the flag
            _paged(bad, LENS, check_indices=False)
    with pytest.raises(ValueError, match="check_indices"):
        _paged(GOOD, LENS, check_indices="maybe")


def test_bad_shapes_are_left_to_the_calls_own_checks(reads):
    """A table of another dtype or shape is not read: the call's validation names it."""
    with pytest.raises(TypeError, match="page_table must be an int32"):
        pycudnn.dnn_sdpa_paged(
            Fake((B, H, SQ, D), F16),
            Fake((NUM_BLOCKS, 2, BLOCK, D), F16),
            Fake((NUM_BLOCKS, 2, BLOCK, D), F16),
            Fake((B, PAGES), F16),
            ints(LENS),
            check_indices=True,
        )


@pytest.mark.parametrize("func", ["dnn_sdpa", "dnn_sdpa_grad"])
def test_dense_padding_lengths(reads, func):
    q, k, v = Fake((2, H, 8, D), F16), Fake((2, H, 32, D), F16), Fake((2, H, 32, D), F16)
    extra = () if func == "dnn_sdpa" else (Fake((2, H, 8, D), F16),) * 2 + (Fake((2, H, 8, 1)),)

    def call(lq, lkv, **kw):
        return getattr(pycudnn, func)(
            q, k, v, *extra, seq_lens_q=ints(lq), seq_lens_kv=ints(lkv), **kw
        )

    with pytest.raises(ValueError, match=rf"{func}: seq_lens_q\[1\] = 9 is outside \[0, 8\]"):
        call([8, 9], [32, 32], check_indices=True)
    with pytest.raises(ValueError, match=rf"{func}: seq_lens_kv\[0\] = 33 is outside \[0, 32\]"):
        call([8, 8], [33, 32], check_indices=True)
    with pytest.raises((CCall, ValueError, TypeError)) as info:
        call([8, 8], [33, 32])  # unchecked by default
    assert "seq_lens_kv[0]" not in str(info.value)


def test_the_module_documents_the_default():
    assert "flash-attn" in _index_checks.__doc__ and "vLLM" in _index_checks.__doc__
    assert pycudnn.config.check_indices is False
