"""The optional PyTorch adapter, ``pycudnn.torch``, without a GPU.

Without torch (CI): ``import pycudnn`` never imports torch and ``import pycudnn.torch`` works,
its names raising an ``ImportError`` that says what to install (child processes, torch blocked).
With torch: the module classes, ``convert`` and ``back``, the unsupported configurations (left
unconverted with a warning, or refused with ``strict=True`` and at construction), ``state_dict``
keys, CPU tensors running torch's own implementation, and the RNN weight packing against
``rnn_weights_from_torch``. The GPU tier is ``test_torch_adapter_gpu.py``.
"""

from __future__ import annotations

import copy
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
# a child process in which "import torch" fails as if torch were not installed
BLOCK_TORCH = textwrap.dedent(
    """
    import sys
    class _NoTorch:
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None
    sys.meta_path.insert(0, _NoTorch())
    """
)


def _child(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
        timeout=120,
    )


def test_import_pycudnn_does_not_import_torch():
    r = _child(
        "import sys, pycudnn, pycudnn.highlevel, pycudnn.memory\n"
        "import pycudnn.torch\n"  # the facade alone imports no torch either
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n"
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]", r.stdout


def test_the_adapter_imports_without_torch_and_says_what_to_install():
    r = _child(
        BLOCK_TORCH
        + textwrap.dedent(
            """
            import pycudnn.torch as pt
            assert pt.is_available() is False
            assert "convert" in pt.__all__ and "Conv2d" in dir(pt)
            for name in ("Conv2d", "convert", "use_torch_allocator"):
                try:
                    getattr(pt, name)
                except ImportError as exc:
                    assert "pip install torch" in str(exc), exc
                    assert "needs PyTorch" in str(exc), exc
                else:
                    raise AssertionError(name + " resolved without torch")
            try:
                from pycudnn.torch import LSTM  # noqa: F401
            except ImportError:
                pass
            else:
                raise AssertionError("from-import resolved without torch")
            try:
                pt.no_such_name
            except AttributeError:
                pass
            print("ok")
            """
        )
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


# ==================================================================================================
# With torch (CPU)
# ==================================================================================================
def _torch():
    return pytest.importorskip("torch")


def _pt():
    _torch()
    import pycudnn.torch as pt

    return pt


def _twins():
    """(torch.nn module, its constructor arguments) for every supported class."""
    torch = _torch()
    nn = torch.nn
    return [
        (nn.Conv1d, (3, 4, 3), {"stride": 2, "padding": 1, "dilation": 1, "groups": 1}),
        (nn.Conv2d, (4, 6, 3), {"padding": "same", "groups": 2, "bias": False}),
        (nn.Conv3d, (2, 4, (1, 3, 3)), {"stride": (1, 2, 2), "padding": (0, 1, 1)}),
        (nn.ConvTranspose1d, (3, 4, 3), {"stride": 2, "padding": 1, "output_padding": 1}),
        (nn.ConvTranspose2d, (4, 6, 3), {"groups": 2, "dilation": 2, "bias": False}),
        (nn.ConvTranspose3d, (2, 4, (1, 3, 3)), {"stride": (1, 2, 2), "padding": (0, 1, 1)}),
        (nn.MaxPool2d, (3,), {"stride": 2, "padding": 1}),
        (nn.MaxPool3d, (2,), {}),
        (nn.AvgPool2d, (3,), {"stride": 1, "padding": 1, "count_include_pad": False}),
        (nn.AvgPool3d, (2,), {"stride": 1}),
        (nn.BatchNorm1d, (5,), {"momentum": None}),
        (nn.BatchNorm2d, (5,), {"affine": False}),
        (nn.BatchNorm3d, (5,), {"track_running_stats": False}),
        (nn.ReLU, (), {"inplace": True}),
        (nn.Sigmoid, (), {}),
        (nn.Tanh, (), {}),
        (nn.ELU, (0.5,), {}),
        (nn.SiLU, (), {}),
        (nn.Hardtanh, (0.0, 3.0), {}),
        (nn.ReLU6, (), {}),
        (nn.Softmax, (1,), {}),
        (nn.LogSoftmax, (1,), {}),
        (nn.Dropout, (0.25,), {}),
        (nn.LocalResponseNorm, (5,), {"alpha": 1e-3, "beta": 0.75, "k": 2.0}),
        (nn.RNN, (4, 6, 2), {"nonlinearity": "relu", "batch_first": True}),
        (nn.LSTM, (4, 6), {"proj_size": 3, "bidirectional": True}),
        (nn.GRU, (4, 6, 2), {"dropout": 0.1, "bias": False}),
        (nn.LayerNorm, ((8, 8),), {"eps": 1e-6, "bias": False}),
        (nn.Linear, (8, 5), {}),
        (nn.CrossEntropyLoss, (), {"ignore_index": 1, "reduction": "sum"}),
    ] + ([(nn.RMSNorm, (8,), {})] if hasattr(nn, "RMSNorm") else [])  # torch >= 2.4


def test_every_supported_class_has_a_twin_with_the_same_constructor_and_state_dict():
    pt = _pt()
    torch = _torch()
    table = pt.supported_modules()
    assert {c for c, _a, _k in _twins()} == set(table)
    for name in pt.__all__:  # every public name resolves (torch is installed here)
        assert getattr(pt, name) is not None, name
    # every twin is a public name, and the package's names are its stub's (test_typing checks)
    assert {c.__name__ for c in table.values()} <= set(pt.__all__)
    for base, args, kwargs in _twins():
        twin = table[base]
        assert issubclass(twin, base) and twin.__name__ == base.__name__
        assert getattr(pt, twin.__name__) is twin
        torch.manual_seed(0)
        ref = base(*args, **kwargs)
        torch.manual_seed(0)
        mine = twin(*args, **kwargs)
        assert repr(mine) == repr(ref)
        sd_ref, sd = ref.state_dict(), mine.state_dict()
        assert list(sd) == list(sd_ref), base.__name__
        for k in sd:
            assert torch.equal(sd[k], sd_ref[k]), (base.__name__, k)
        mine.load_state_dict(sd_ref)  # loads unchanged
        assert twin.forward.__doc__


def test_convert_swaps_classes_in_place_and_back():
    pt = _pt()
    torch = _torch()
    nn = torch.nn
    model = nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Sequential(nn.Conv2d(4, 4, 3), nn.Tanh()),
        nn.Flatten(),
        nn.Linear(16, 3),
    )
    before = {name: m for name, m in model.named_modules()}
    params = {k: v.data_ptr() for k, v in model.state_dict().items()}
    hook_calls = []
    model[0].register_forward_hook(lambda *a: hook_calls.append(1))
    assert pt.convert(model) is model
    after = dict(model.named_modules())
    assert all(after[k] is before[k] for k in before)  # the same objects
    assert type(model[0]) is pt.Conv2d and type(model[4][1]) is pt.Tanh
    assert type(model[5]) is nn.Flatten and type(model[6]) is pt.Linear
    assert {k: v.data_ptr() for k, v in model.state_dict().items()} == params
    model(torch.randn(2, 1, 8, 8))  # CPU: torch's own implementation, hooks still run
    assert hook_calls == [1]
    pt.convert(model, back=True)
    assert type(model[0]) is nn.Conv2d and type(model[2]) is nn.ReLU
    assert type(model[4][0]) is nn.Conv2d


def test_convert_exclude_predicate_and_a_module_as_the_model():
    pt = _pt()
    nn = _torch().nn
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.ReLU())
    pt.convert(model, exclude=lambda m: isinstance(m, nn.BatchNorm2d))
    assert [type(m) for m in model] == [pt.Conv2d, nn.BatchNorm2d, pt.ReLU]
    conv = nn.Conv3d(1, 1, 1)
    assert type(pt.convert(conv)) is pt.Conv3d
    assert type(pt.convert(conv, back=True)) is nn.Conv3d
    with pytest.raises(TypeError, match=r"torch\.nn\.Module"):
        pt.convert(object())


def test_convert_leaves_subclasses_alone():
    pt = _pt()
    nn = _torch().nn

    class MyConv(nn.Conv2d):
        pass

    m = MyConv(1, 1, 1)
    pt.convert(m)
    assert type(m) is MyConv


UNSUPPORTED = [
    ("Conv2d", (1, 2, 3), {"padding_mode": "reflect"}, "padding_mode='reflect'"),
    ("Conv1d", (1, 2, 4), {"padding": "same"}, "asymmetrically"),
    ("MaxPool2d", (2,), {"ceil_mode": True}, "ceil_mode"),
    ("MaxPool2d", (2,), {"return_indices": True}, "return_indices"),
    ("MaxPool3d", (3,), {"dilation": 2}, "dilation"),
    ("AvgPool2d", (2,), {"divisor_override": 3}, "divisor_override"),
    ("AvgPool3d", (2,), {"ceil_mode": True}, "ceil_mode"),
    ("Hardtanh", (), {}, "min_val=0"),
    ("Softmax", (), {"dim": 2}, "dim=2"),
    ("LogSoftmax", (), {}, "dim=None"),
    ("Dropout", (), {"p": 1.0}, "p=1.0"),
    ("LocalResponseNorm", (4,), {}, "size=4"),
    ("LocalResponseNorm", (5,), {"k": 0.0}, "k >= 1e-5"),
    ("CrossEntropyLoss", (), {"label_smoothing": 0.1}, "label_smoothing=0.1"),
]


@pytest.mark.parametrize(
    ("name", "args", "kwargs", "words"), UNSUPPORTED, ids=[f"{u[0]}-{u[3]}" for u in UNSUPPORTED]
)
def test_unsupported_configurations_stay_torch_modules(name, args, kwargs, words):
    pt = _pt()
    nn = _torch().nn
    base = getattr(nn, name)
    model = nn.Sequential(nn.ReLU(), base(*args, **kwargs))
    assert words in pt.unsupported_reason(model[1])
    with pytest.warns(UserWarning, match=rf"convert: 1 \({name}.*stays a torch module"):
        pt.convert(model)
    assert type(model[1]) is base and type(model[0]) is pt.ReLU
    with pytest.raises(ValueError, match="stays a torch module"):
        pt.convert(nn.Sequential(base(*args, **kwargs)), strict=True)
    with pytest.raises(ValueError, match=rf"pycudnn.torch.{name}: "):
        getattr(pt, name)(*args, **kwargs)


def test_unsupported_dtypes_stay_torch_modules():
    pt = _pt()
    torch = _torch()
    nn = torch.nn
    for m in (nn.LSTM(2, 3).to(torch.bfloat16), nn.Conv2d(1, 1, 1).to(torch.complex64)):
        assert "cuDNN computes on" in pt.unsupported_reason(m)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            pt.convert(m)
        assert type(m) in (nn.LSTM, nn.Conv2d) and w
    assert pt.unsupported_reason(nn.Identity()).endswith("is not a module pycudnn.torch converts")


def test_cpu_tensors_run_torchs_implementation():
    pt = _pt()
    torch = _torch()
    nn = torch.nn
    torch.manual_seed(0)
    x = torch.randn(3, 2, 8, 8)
    for base, args, kwargs in _twins():
        torch.manual_seed(1)
        ref = base(*args, **kwargs)
        mine = copy.deepcopy(ref)
        pt.convert(mine)
        assert type(mine) is pt.supported_modules()[base]
        if base in (nn.RNN, nn.LSTM, nn.GRU):
            inp = torch.randn(2, 5, 4)
        elif base in (nn.Conv1d, nn.ConvTranspose1d):
            inp = torch.randn(2, 3, 9)
        elif base in (nn.Conv3d, nn.ConvTranspose3d, nn.MaxPool3d, nn.AvgPool3d, nn.BatchNorm3d):
            inp = torch.randn(2, x.shape[1] if base is not nn.BatchNorm3d else 5, 4, 6, 6)
        elif base in (nn.Conv2d, nn.ConvTranspose2d):
            inp = torch.randn(2, 4, 6, 6)
        elif base in (nn.BatchNorm1d, nn.BatchNorm2d):
            inp = torch.randn(4, 5, 3, 3) if base is nn.BatchNorm2d else torch.randn(4, 5)
        else:
            inp = x.clone()
        if base in (nn.Dropout, nn.GRU):  # random masks: compare the deterministic mode
            ref.eval()
            mine.eval()
        extra = (torch.randint(0, 2, (3, 8, 8)),) if base is nn.CrossEntropyLoss else ()
        want = ref(inp.clone(), *extra)
        got = mine(inp.clone(), *extra)
        flat_w = want if isinstance(want, torch.Tensor) else want[0]
        flat_g = got if isinstance(got, torch.Tensor) else got[0]
        torch.testing.assert_close(flat_g, flat_w, msg=base.__name__)


def test_deepcopy_and_pickle_of_a_converted_model():
    pt = _pt()
    torch = _torch()
    nn = torch.nn
    import io

    model = pt.convert(nn.Sequential(nn.Conv2d(1, 2, 3), nn.LSTM(3, 3)))
    clone = copy.deepcopy(model)
    assert type(clone[0]) is pt.Conv2d and clone[0].weight is not model[0].weight
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    assert type(loaded[1]) is pt.LSTM
    torch.testing.assert_close(loaded[0].weight, model[0].weight)


@pytest.mark.parametrize(
    ("cls", "mode", "kwargs"),
    [
        ("LSTM", "lstm", {}),
        ("LSTM", "lstm", {"proj_size": 3, "bidirectional": True}),
        ("GRU", "gru", {"bidirectional": True}),
        ("RNN", "rnn_tanh", {"bias": False}),
        ("RNN", "rnn_relu", {"nonlinearity": "relu"}),
    ],
)
def test_rnn_flat_weights_is_rnn_weights_from_torch_and_differentiable(cls, mode, kwargs):
    pt = _pt()
    torch = _torch()
    from pycudnn.highlevel.rnn_layout import (
        canonical_rnn_layout,
        rnn_weights_from_torch,
        rnn_weights_to_torch,
    )

    m = getattr(torch.nn, cls)(5, 6, 2, **kwargs)
    lay = canonical_rnn_layout(
        mode,
        5,
        6,
        2,
        kwargs.get("bidirectional", False),
        kwargs.get("proj_size"),
        bias=kwargs.get("bias", True),
    )
    flat = pt.rnn_flat_weights(m, lay)
    assert flat.shape == (lay.size,)
    np.testing.assert_array_equal(flat.detach().numpy(), rnn_weights_from_torch(m, lay))
    # d(sum(flat * arange)) / d(param) is where each element of param sits in the buffer
    (flat * torch.arange(lay.size, dtype=flat.dtype)).sum().backward()
    where = rnn_weights_to_torch(np.arange(lay.size), lay)
    for name, p in m.named_parameters():
        torch.testing.assert_close(p.grad, torch.as_tensor(where[name]).to(p.dtype), msg=name)


def test_use_torch_allocator_installs_and_removes_the_resource():
    pt = _pt()
    from pycudnn.memory import allocator

    previous = allocator.memory_resource()
    try:
        pt.use_torch_allocator()
        assert isinstance(allocator.memory_resource(), pt.TorchMemoryResource)
        assert repr(allocator.memory_resource()) == "TorchMemoryResource()"
        pt.use_torch_allocator(False)
        assert isinstance(allocator.memory_resource(), allocator.CachingAllocator)
    finally:
        allocator.set_memory_resource(previous)


def test_workspaces_come_from_an_installed_resource():
    """``Handle.workspace`` takes its buffer from a resource that ``set_memory_resource``
    installed (no GPU: a fake resource and a handle wrapped with ``from_ptr``)."""
    from pycudnn import Handle
    from pycudnn.memory import allocator

    class Blk:
        def __init__(self, n, d, s):
            self.ptr, self.nbytes, self.device, self.stream = 0x1000 * n, n, d, s

    class Res:
        def __init__(self):
            self.log = []

        def allocate(self, nbytes, device, stream, keep=None):
            self.log.append((nbytes, device, stream))
            return Blk(nbytes, device, stream)

    res = Res()
    previous = allocator.set_memory_resource(res)
    try:
        h = Handle.from_ptr(0xDEAD, 0, stream=7)
        ptr, size = h.workspace(3 << 20)
        assert res.log == [(3 << 20, 0, 7)] and (ptr, size) == (0x1000 * (3 << 20), 3 << 20)
        assert h.workspace(1 << 20) == (ptr, size)  # reused
        ws = allocator.workspace_allocation(512, 0, 7)
        assert isinstance(ws, allocator.ResourceAllocation) and ws.block is not None
        ws.release(7)
        assert ws.block is None
        ws.close()
        h.release_workspace()
        assert h.workspace_size() == 0
    finally:
        allocator.set_memory_resource(previous)
