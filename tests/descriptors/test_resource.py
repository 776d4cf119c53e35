"""Lifecycle of the RAII base (``pycudnn._resource``) through real descriptors, no GPU needed.

Double close, use after close (raises without calling C), ``with`` on a closed object, a failing
setter (no leak), ``from_ptr`` (never destroys), ``detach``, GC of dropped objects and cycles,
children keeping parents alive, live counters, and interpreter shutdown with live objects (in a
child process).
"""

from __future__ import annotations

import ctypes
import gc
import os
import subprocess
import sys
import textwrap
import weakref

import pytest
from _desc_shim import counting_c_calls

from pycudnn import _lib, _resource, api, descriptors, errors
from pycudnn.descriptors import (
    ActivationDescriptor,
    BackendDescriptor,
    ConvolutionDescriptor,
    DropoutDescriptor,
    FilterDescriptor,
    PoolingDescriptor,
    RNNDescriptor,
    TensorDescriptor,
)

FAMILIES = [
    lambda: TensorDescriptor((2, 3, 4, 5)),
    lambda: FilterDescriptor((8, 3, 3, 3)),
    lambda: ConvolutionDescriptor(1),
    lambda: PoolingDescriptor(2),
    lambda: ActivationDescriptor(),
    lambda: descriptors.LRNDescriptor(),
    lambda: descriptors.OpTensorDescriptor(),
    lambda: descriptors.ReduceTensorDescriptor(),
    lambda: DropoutDescriptor(),
    lambda: RNNDescriptor(8),
    lambda: descriptors.RNNDataDescriptor([3, 2], 4),
    lambda: descriptors.SpatialTransformerDescriptor((1, 2, 3, 4)),
    lambda: descriptors.CTCLossDescriptor(),
    lambda: BackendDescriptor("tensor"),
]
IDS = [
    "tensor",
    "filter",
    "conv",
    "pool",
    "act",
    "lrn",
    "optensor",
    "reduce",
    "dropout",
    "rnn",
    "rnndata",
    "st",
    "ctc",
    "backend",
]


@pytest.fixture(autouse=True)
def no_leaked_descriptors():
    """Every test here must leave the live counters where it found them."""
    gc.collect()
    before = _resource.live_counts()
    yield
    gc.collect()
    assert _resource.live_counts() == before


@pytest.mark.parametrize("make", FAMILIES, ids=IDS)
def test_close_is_idempotent_and_counted(make):
    d = make()
    cls = type(d)
    n = cls.live_count()
    assert n >= 1 and d.owned and not d.closed
    assert isinstance(d.ptr, int) and d.ptr > 0
    d.close()
    assert d.closed and not d.owned
    assert cls.live_count() == n - 1
    d.close()  # second close: no-op
    assert cls.live_count() == n - 1
    assert repr(d) == f"<{cls.__name__} (closed)>"


@pytest.mark.parametrize("make", FAMILIES, ids=IDS)
def test_use_after_close_raises_without_c_call(monkeypatch, make):
    d = make()
    d.close()
    with counting_c_calls(monkeypatch) as c_calls:
        for name in dir(type(d)):
            if name.startswith("_") or name in ("closed", "owned", "live_count", "from_ptr"):
                continue
            attr = getattr(type(d), name)
            if isinstance(attr, property):
                with pytest.raises(ValueError, match="is closed"):
                    getattr(d, name)
        with pytest.raises(ValueError, match="is closed"):
            _ = d.ptr
        with pytest.raises(ValueError, match="is closed"), d:
            pass
        with pytest.raises(ValueError, match="is closed"):
            d.detach()
        # ctypes reads _as_parameter_: a closed object cannot reach C by accident
        with pytest.raises(ctypes.ArgumentError, match=r"ValueError: .* is closed"):
            api.cudnnDestroyTensorDescriptor(d)
        assert c_calls.calls == []


def test_use_after_close_methods():
    t, w, c, p = (
        TensorDescriptor((1, 1, 4, 4)),
        FilterDescriptor((1, 1, 3, 3)),
        ConvolutionDescriptor(),
        PoolingDescriptor(2),
    )
    c.close()
    p.close()
    with pytest.raises(ValueError, match="ConvolutionDescriptor is closed"):
        c.forward_output_shape(t, w)
    with pytest.raises(ValueError, match="PoolingDescriptor is closed"):
        p.forward_output_shape(t)
    b = BackendDescriptor("tensor")
    b.close()
    for call in (
        lambda: b.set("TENSOR_UNIQUE_ID", "INT64", 1),
        lambda: b.get("TENSOR_UNIQUE_ID", "INT64", 1),
        b.finalize,
        lambda: b.is_finalized,
    ):
        with pytest.raises(ValueError, match="BackendDescriptor is closed"):
            call()


def test_with_closes():
    with TensorDescriptor((1, 2, 3, 4)) as t:
        assert t.shape == (1, 2, 3, 4)
    assert t.closed
    with pytest.raises(ValueError, match="closed"), t:
        pass


def test_failing_setter_does_not_leak(monkeypatch):
    """cuDNN refusing the set call after create: the finalizer (armed at create) frees it."""
    destroyed = []
    real = errors.checked

    def failing(name, **kw):
        if name == "cudnnSetTensorNdDescriptor":

            def fail(*args):
                raise errors.BadParamError(2000, name, "injected")

            return fail
        return real(name, **kw)

    gc.collect()
    before = TensorDescriptor.live_count()
    monkeypatch.setattr(errors, "checked", failing)
    real_release = _resource._release

    def spy(destroy, ptr, counter, *a):
        destroyed.append(ptr)
        real_release(destroy, ptr, counter, *a)

    monkeypatch.setattr(_resource, "_release", spy)
    with pytest.raises(errors.BadParamError, match="injected"):
        TensorDescriptor((1, 2, 3, 4))
    gc.collect()
    assert TensorDescriptor.live_count() == before
    assert len(destroyed) == 1


def test_real_cudnn_rejection_does_not_leak():
    gc.collect()
    before = descriptors.RNNDataDescriptor.live_count()
    for _ in range(3):
        with pytest.raises(errors.BadParamError):
            descriptors.RNNDataDescriptor([3, 2], 4, 5, layout="seq_major_packed")
    gc.collect()
    assert descriptors.RNNDataDescriptor.live_count() == before


def test_from_ptr_never_destroys_and_keeps_owner_alive():
    t = TensorDescriptor((2, 3, 4, 5))
    n = TensorDescriptor.live_count()
    marker = type("Owner", (), {})()
    ref = weakref.ref(marker)
    view = TensorDescriptor.from_ptr(t.ptr, owner=marker)
    del marker
    gc.collect()
    assert ref() is not None  # kept alive by the view
    assert TensorDescriptor.live_count() == n  # borrowed wrappers are not counted
    assert not view.owned and view.shape == (2, 3, 4, 5)
    view.close()
    gc.collect()
    assert ref() is None
    assert t.shape == (2, 3, 4, 5)  # still alive: the view did not destroy it
    t.close()


def test_from_ptr_dies_with_closed_owner():
    t = TensorDescriptor((2, 3, 4, 5))
    view = TensorDescriptor.from_ptr(t.ptr, owner=t)
    t.close()
    with pytest.raises(ValueError, match="closed"):
        _ = view.shape


@pytest.mark.parametrize("bad", [0, -1, 2**64, "0x1", 1.0, None, True])
def test_from_ptr_rejects_bad_pointers(bad):
    with pytest.raises((TypeError, ValueError)):
        TensorDescriptor.from_ptr(bad)


def test_detach_hands_out_ownership():
    t = TensorDescriptor((2, 3, 4, 5))
    n = TensorDescriptor.live_count()
    ptr = t.detach()
    assert t.closed and TensorDescriptor.live_count() == n - 1
    del t
    gc.collect()
    # still valid: we own it now
    again = TensorDescriptor.from_ptr(ptr)
    assert again.shape == (2, 3, 4, 5)
    again.close()
    api.cudnnDestroyTensorDescriptor(ptr)


@pytest.mark.parametrize("make", FAMILIES, ids=IDS)
def test_dropped_objects_are_freed_by_gc(make):
    gc.collect()
    d = make()
    cls = type(d)
    n = cls.live_count()
    # a reference cycle through the object: only the cyclic GC can free it
    holder = {"d": d}
    holder["self"] = holder
    d._refs.append(holder)
    del d, holder
    gc.collect()
    assert cls.live_count() == n - 1


def test_children_keep_parents_alive():
    drop = DropoutDescriptor()
    ref = weakref.ref(drop)
    rnn = RNNDescriptor(8, dropout=drop)
    del drop
    gc.collect()
    assert ref() is not None
    rnn.close()
    gc.collect()
    assert ref() is None

    x = BackendDescriptor.tensor((1, 4, 8, 8), uid=1, finalize=False)
    xref = weakref.ref(x)
    op = BackendDescriptor("OPERATION_POINTWISE_DESCRIPTOR")
    op.set("OPERATION_POINTWISE_XDESC", "BACKEND_DESCRIPTOR", x)
    del x
    gc.collect()
    assert xref() is not None
    op.close()
    gc.collect()
    assert xref() is None


def test_live_counts_are_per_class():
    gc.collect()
    base = dict(_resource.live_counts())
    ts = [TensorDescriptor((1, 1, 1, 1)) for _ in range(3)]
    ps = [PoolingDescriptor(2) for _ in range(2)]
    counts = _resource.live_counts()
    assert counts["TensorDescriptor"] == base.get("TensorDescriptor", 0) + 3
    assert counts["PoolingDescriptor"] == base.get("PoolingDescriptor", 0) + 2
    assert descriptors.live_counts() == counts
    for d in ts + ps:
        d.close()


def test_finalizer_holds_no_reference_to_the_object():
    t = TensorDescriptor((1, 1, 1, 1))
    fin = t._finalizer
    _obj, func, args, _kwargs = fin.peek()
    assert func is _resource._release
    assert all(not isinstance(a, _resource.Resource) for a in args)
    assert isinstance(args[1], int)
    t.close()


def test_gc_finalizer_skips_at_shutdown(monkeypatch):
    calls = []
    counter = _resource._LiveCounter()
    counter.add(1)
    _resource._release(lambda p: calls.append(p), 123, counter, lambda: True)
    assert calls == [] and counter.value == 1  # skipped: interpreter finalizing
    _resource._release(lambda p: calls.append(p), 123, counter, lambda: False)
    assert calls == [123] and counter.value == 0


SHUTDOWN = textwrap.dedent(
    """
    import gc, sys
    from pycudnn.descriptors import *
    keep = [
        TensorDescriptor((2, 3, 4, 5)), FilterDescriptor((8, 3, 3, 3)), ConvolutionDescriptor(1),
        PoolingDescriptor(2), ActivationDescriptor(), LRNDescriptor(), OpTensorDescriptor(),
        ReduceTensorDescriptor(), DropoutDescriptor(), RNNDataDescriptor([3], 4),
        SpatialTransformerDescriptor((1, 2, 3, 4)), CTCLossDescriptor(),
        BackendDescriptor.tensor((1, 2, 3), uid=7, finalize=False),
    ]
    keep.append(RNNDescriptor(8, dropout=keep[8]))
    # a cycle that only the final GC pass would collect, and a module-global borrowed view
    cyc = [TensorDescriptor((1, 1, 1, 1))]
    cyc.append(cyc)
    view = TensorDescriptor.from_ptr(keep[0].ptr, owner=keep[0])
    del cyc
    sys.stdout.write("alive\\n")
    """
)


def test_interpreter_shutdown_with_live_objects():
    env = dict(os.environ, PYTHONWARNINGS="error")
    proc = subprocess.run(
        [sys.executable, "-c", SHUTDOWN], capture_output=True, text=True, timeout=120, env=env
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "alive\n"
    assert "Exception ignored" not in proc.stderr, proc.stderr


def test_explicit_close_works_for_raw_handles():
    # the typed ctypes handle is what C receives; a closed object gives ctypes a ValueError
    t = TensorDescriptor((1, 1, 1, 1))
    assert isinstance(t._as_parameter_, _lib.cudnnTensorDescriptor_t)
    size = ctypes.c_size_t()
    api.cudnnGetTensorSizeInBytes(t, ctypes.byref(size))
    assert size.value == 4
    t.close()


@pytest.mark.parametrize("make", FAMILIES, ids=IDS)
def test_from_ptr_wrapper_reads_the_same(make):
    """Properties read through cuDNN: a borrowed wrapper reports what the owner does."""
    d = make()
    view = type(d).from_ptr(d.ptr, owner=d)
    skip = {"ptr", "owned", "closed", "is_set", "descriptor_type", "is_finalized"}
    names = [
        n
        for n in dir(type(d))
        if not n.startswith("_") and isinstance(getattr(type(d), n), property) and n not in skip
    ]
    for name in names:
        try:
            expected = getattr(d, name)
        except ValueError:  # e.g. DropoutDescriptor.dropout without a handle
            continue
        if isinstance(d, descriptors.SpatialTransformerDescriptor):
            assert getattr(view, name) is None  # no getter in cuDNN
        else:
            assert getattr(view, name) == expected, name
    assert repr(view).endswith(", borrowed)") or "ptr=" in repr(view)
    view.close()
    d.close()
