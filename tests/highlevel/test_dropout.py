"""CPU tests of dnn_dropout / dnn_dropout_grad and DropoutState (no GPU): the validation
catalogue, the state's lifecycle (binding, seeding, restoring, reserve growth, masks, close), the
C calls with a fake descriptor, call caching."""

from __future__ import annotations

from typing import ClassVar

import _fake_device as fd
import numpy as np
import pytest
from _fake_device import BF16, F16, F64, I32, U8, DummyHandle, Fake

import pycudnn
from pycudnn.descriptors import DropoutDescriptor
from pycudnn.highlevel import dropout
from pycudnn.highlevel.dropout import DropoutState, dnn_dropout, dnn_dropout_grad

no_c, capture = fd.no_c, fd.capture  # fixtures
X = (4, 3, 8, 8)


class FakeDescriptor:
    """Stands in for DropoutDescriptor (whose set/restore need a GPU); logs what it is asked."""

    made: ClassVar[list] = []

    def __init__(self, handle, p, states, size, seed):
        self.log = [("init", p, seed, size)]
        self.closed = False
        FakeDescriptor.made.append(self)

    def set(self, handle, p, states, size, seed):
        self.log.append(("set", p, seed, size))

    def restore(self, handle, p, states, size, seed):
        self.log.append(("restore", p, seed, size))

    def close(self):
        self.closed = True

    @staticmethod
    def states_size(handle):
        return 4096

    reserve_space_size = staticmethod(DropoutDescriptor.reserve_space_size)  # needs no GPU


@pytest.fixture
def fake(capture, monkeypatch):
    FakeDescriptor.made = []
    monkeypatch.setattr(dropout, "DropoutDescriptor", FakeDescriptor)
    return capture


# ==================================================================================================
# Validation
# ==================================================================================================
BAD = [
    ((np.zeros(X, np.float32), 0.5), {}, TypeError, "to_device"),
    ((Fake(X, BF16), 0.5), {}, TypeError, "unsupported dtype"),
    ((Fake(X, I32), 0.5), {}, TypeError, "unsupported dtype"),
    ((Fake(X), 1.0), {}, ValueError, "p=1.0 is out of range; expected a value in [0.0, 1.0)"),
    ((Fake(X), -0.1), {}, ValueError, "p=-0.1 is out of range"),
    ((Fake(X), float("nan")), {}, ValueError, "p must be finite"),
    ((Fake(X), "0.5"), {}, TypeError, "p must be a real number"),
    ((Fake(X), 0.5), {"seed": -1}, ValueError, "seed=-1 is out of range"),
    ((Fake(X), 0.5), {"seed": 2**64}, ValueError, "out of range"),
    ((Fake(X), 0.5), {"seed": True}, TypeError, "seed must be an int"),
    ((Fake(X), 0.5), {"seed": 1.5}, TypeError, "seed must be an int"),
    ((Fake(X), 0.5), {"state": object()}, TypeError, "state must be a DropoutState"),
    ((Fake((1,) * 9), 0.5), {}, ValueError, "9 dims"),
    ((Fake(X), 0.5), {"out": Fake((4, 3, 8))}, ValueError, "out has shape (4, 3, 8)"),
    ((Fake(X), 0.5), {"out": Fake(X, F64)}, TypeError, "out is float64"),
    ((Fake(X), 0.5), {"out": Fake(X, device=1)}, ValueError, "on device 1"),
    ((Fake(X, strides=(192, 64, 8, 0)), 0.5), {}, ValueError, "zero (broadcast) stride"),
]


@pytest.mark.parametrize(("args", "kwargs", "exc", "fragment"), BAD)
def test_forward_rejects_before_any_c_call(no_c, args, kwargs, exc, fragment):
    with pytest.raises(exc) as info:
        dnn_dropout(*args, **kwargs)
    assert fragment in str(info.value)


def test_backward_rejects_before_any_c_call(no_c):
    with pytest.raises(TypeError, match="dnn_dropout_grad: state must be a DropoutState"):
        dnn_dropout_grad(Fake(X), None)
    st = DropoutState(1)
    with pytest.raises(TypeError, match="unsupported dtype"):
        dnn_dropout_grad(Fake(X, BF16), st)


def test_gradient_needs_a_mask(fake):
    with pytest.raises(ValueError, match="dnn_dropout_grad: the DropoutState holds no mask yet"):
        dnn_dropout_grad(Fake(X), DropoutState(1))
    assert fake.calls == []


def test_state_validation():
    with pytest.raises(ValueError, match="DropoutState: seed=-3 is out of range"):
        DropoutState(-3)
    with pytest.raises(TypeError, match="seed must be an int"):
        DropoutState("7")
    assert 0 <= DropoutState().seed < 2**63
    assert DropoutState().seed != DropoutState().seed  # fresh random seeds
    assert DropoutState(2**64 - 1).seed == 2**64 - 1


# ==================================================================================================
# Lifecycle
# ==================================================================================================
def test_lifecycle_without_gpu():
    st = DropoutState(seed=11)
    assert (st.seed, st.p, st.device, st.mask_shape, st.nbytes, st.closed) == (
        11,
        None,
        None,
        None,
        0,
        False,
    )
    assert "seed=11" in repr(st) and "unbound" in repr(st)
    with st as s:
        assert s is st
    assert st.closed and repr(st) == "DropoutState(closed)"
    st.close()  # idempotent
    with pytest.raises(ValueError, match="DropoutState is closed"), st:
        pass


def test_binding_seeding_and_reuse(fake):
    x = Fake(X)
    y, st = dnn_dropout(x, 0.25, seed=7)
    (desc,) = FakeDescriptor.made
    assert desc.log == [("init", 0.25, 7, 4096)]
    assert (st.seed, st.p, st.device, st.mask_shape) == (7, 0.25, 0, X)
    assert st.nbytes == 4096 + DropoutDescriptor.reserve_space_size(
        pycudnn.TensorDescriptor(X, "float32")
    )
    (args,) = fake.of("cudnnDropoutForward")
    assert args[1] is desc and args[3] == x.ptr and args[5] == y.ptr
    res_ptr, res_size = args[6], args[7]
    # reuse: the next mask of the same stream, no RNG re-initialisation
    dnn_dropout(x, 0.25, state=st)
    assert desc.log == [("init", 0.25, 7, 4096)]
    # a new p restores the descriptor (no re-init)
    dnn_dropout(x, 0.5, state=st)
    assert desc.log[-1] == ("restore", 0.5, 7, 4096) and st.p == 0.5
    # an explicit seed restarts the stream
    dnn_dropout(x, 0.5, seed=9, state=st)
    assert desc.log[-1] == ("set", 0.5, 9, 4096) and st.seed == 9
    # ... unless the state is fresh with that seed
    st2 = DropoutState(seed=5)
    dnn_dropout(x, 0.1, seed=5, state=st2)
    assert FakeDescriptor.made[-1].log == [("init", 0.1, 5, 4096)]
    # same reserve space for a same-size input; the forward records its mask shape
    args = fake.of("cudnnDropoutForward")[-2]
    assert (args[6], args[7]) == (res_ptr, res_size)


def test_reserve_grows_and_mask_shape_is_checked(fake):
    st = DropoutState(0)
    dnn_dropout(Fake((2, 3, 4, 5)), 0.5, state=st)
    small = fake.of("cudnnDropoutForward")[-1][6:8]
    dnn_dropout(Fake((64, 64, 8, 8)), 0.5, state=st)
    big = fake.of("cudnnDropoutForward")[-1][6:8]
    assert big[1] > small[1] and big[0] != small[0]
    dnn_dropout(Fake((2, 3, 4, 5)), 0.5, state=st)
    assert fake.of("cudnnDropoutForward")[-1][6:8] == big  # kept, not shrunk
    with pytest.raises(ValueError, match=r"dy has shape \(64, 64, 8, 8\) but the state's mask"):
        dnn_dropout_grad(Fake((64, 64, 8, 8)), st)
    dy = Fake((2, 3, 4, 5), F16, nhwc=True)  # another dtype and layout: the mask is logical
    dx = dnn_dropout_grad(dy, st)
    (args,) = fake.of("cudnnDropoutBackward")
    assert args[1] is FakeDescriptor.made[-1] and args[3] == dy.ptr and args[5] == dx.ptr
    assert args[6:8] == big
    assert dx.strides == dy.strides  # new dx in dy's memory order


def test_closed_state_and_other_device(fake, monkeypatch):
    st = DropoutState(0)
    dnn_dropout(Fake(X), 0.5, state=st)
    desc = FakeDescriptor.made[-1]
    st.close()
    assert desc.closed and st.nbytes == 0 and st.mask_shape is None
    with pytest.raises(ValueError, match="dnn_dropout: the DropoutState is closed"):
        dnn_dropout(Fake(X), 0.5, state=st)
    with pytest.raises(ValueError, match="dnn_dropout_grad: the DropoutState is closed"):
        dnn_dropout_grad(Fake(X), st)
    st = DropoutState(0)
    dnn_dropout(Fake(X), 0.5, state=st)
    other = DummyHandle()
    other.device = 1
    monkeypatch.setattr(dropout._call._handle, "get_handle", lambda device=None: other)
    n = len(fake.calls)
    with pytest.raises(ValueError, match="bound to device 0, the operands are on device 1"):
        dnn_dropout(Fake(X, device=1), 0.5, state=st)
    assert len(fake.calls) == n


def test_in_place_and_overlap(fake):
    x = Fake(X)
    y, _ = dnn_dropout(x, 0.5, out=x)
    assert y is x
    with pytest.raises(ValueError, match="overlaps an input"):
        dnn_dropout(x, 0.5, out=Fake(X, ptr=x.ptr + 4))
    st = DropoutState(1)
    dnn_dropout(x, 0.5, state=st)
    dy = Fake(X)
    assert dnn_dropout_grad(dy, st, out=dy) is dy


def test_empty_input(fake):
    y, st = dnn_dropout(Fake((0, 3)), 0.5)
    assert y.shape == (0, 3) and fake.calls == [] and st.mask_shape == (0, 3)
    assert st.device is None  # nothing was bound
    dx = dnn_dropout_grad(Fake((0, 3)), st)
    assert dx.shape == (0, 3) and fake.calls == []


def test_second_call_skips_validation(fake, monkeypatch):
    builds = []
    real = dropout._build_forward

    def spy(*args):
        builds.append(args)
        return real(*args)

    monkeypatch.setattr(dropout, "_build_forward", spy)
    st = DropoutState(3)
    for _ in range(3):
        dnn_dropout(Fake(X), 0.5, state=st)
    assert len(builds) == 1 and len(fake.of("cudnnDropoutForward")) == 3
    # the cache holds no state (a state is freed with its last user reference)
    entry = next(iter(dropout._call.calls().data.values()))
    assert not hasattr(entry, "state") and dropout._RUN.args is None


def test_stream_argument_binds_the_handle(fake):
    dnn_dropout(Fake(X), 0.5, stream=5)
    assert fake.handle.stream == 5


def test_a_given_mask_holds_the_mask_instead_of_the_state(fake):
    """out_mask: cuDNN's reserve is the caller's array (the state keeps none and lends only its
    descriptor); the gradient takes it with p; a small, mistyped or strided mask is refused
    before the launch."""
    st = DropoutState(0)
    need = pycudnn.dropout_mask_bytes(X, np.float32)
    assert need == pycudnn.dropout_mask_bytes(list(X), "float32") > 0
    mask = Fake((need,), U8)
    dnn_dropout(Fake(X), 0.25, state=st, out_mask=mask)
    (args,) = fake.of("cudnnDropoutForward")
    assert args[6:8] == (mask.ptr, need) and st.mask_shape is None and st.nbytes == 4096
    with pytest.raises(ValueError, match="holds no mask yet"):
        dnn_dropout_grad(Fake(X), st)
    other = DropoutState(1)
    dnn_dropout(Fake((2, 2)), 0.5, state=other)  # bound, with another p
    dnn_dropout_grad(Fake(X), other, mask=mask, p=0.25)
    (args,) = fake.of("cudnnDropoutBackward")
    assert args[6:8] == (mask.ptr, need) and ("restore", 0.25, 1, 4096) in args[1].log
    n = len(fake.calls)
    for kw, exc, frag in (
        ({"mask": mask}, ValueError, "mask and p go together"),
        ({"p": 0.25}, ValueError, "mask and p go together"),
        ({"mask": Fake((need - 1,), U8), "p": 0.25}, ValueError, f"needs {need}"),
        ({"mask": Fake((need,), F16), "p": 0.25}, TypeError, "uint8"),
        ({"mask": Fake((need,), U8, device=1), "p": 0.25}, ValueError, "device 1"),
        ({"mask": Fake((need,), U8, strides=(2,)), "p": 0.25}, ValueError, "contiguous"),
    ):
        with pytest.raises(exc, match=frag):
            dnn_dropout_grad(Fake(X), other, **kw)
    with pytest.raises(ValueError, match=f"needs {need}"):
        dnn_dropout(Fake(X), 0.25, state=st, out_mask=Fake((8,), U8))
    assert len(fake.calls) == n  # nothing launched


def test_mask_bytes_checks_its_arguments():
    assert pycudnn.dropout_mask_bytes((3, 0), np.float16) == 0
    for shape, exc in (((), ValueError), ((1,) * 9, ValueError), ((2, -1), ValueError),
                       ((2.0,), ValueError), ((True,), ValueError)):  # fmt: skip
        with pytest.raises(exc, match="dropout_mask_bytes: shape"):
            pycudnn.dropout_mask_bytes(shape, np.float32)
    with pytest.raises(TypeError, match="float16, float32 or float64"):
        pycudnn.dropout_mask_bytes((4,), np.int32)


def test_exports():
    assert dropout.__all__ == [
        "DropoutState",
        "dnn_dropout",
        "dnn_dropout_grad",
        "dropout_mask_bytes",
    ]
