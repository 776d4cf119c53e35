"""Launch programs of fused regions (``convert(model, fuse=True)``) on the CPU: the fakes tier
(pycudnn's functions replaced by torch computations behind their real signatures) plus a fake of
the lean path's bound entries that, like a real entry, runs **from pointers alone**: each launch
rebuilds its operands at the addresses it is given. A replayed program therefore really reads and
writes its arena places, its accumulated gradients and its output tensors, so a wrong slot, offset
or lifetime gives a wrong number here. Outputs, gradients, running statistics and
``num_batches_tracked`` are compared with the unfused torch model in float64 over several steps.
cuDNN's numbers are the GPU tier's (``test_torch_program_gpu.py``).
"""

from __future__ import annotations

import copy
import ctypes
import gc
import re
import threading
import weakref

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import test_torch_fuse as tf  # noqa: E402  (tests/torch_adapter is on sys.path)
from test_torch_fuse import bn_act, fakes  # noqa: E402, F401  (fixtures)

import pycudnn.torch as pt  # noqa: E402
from pycudnn.highlevel import _bound  # noqa: E402
from pycudnn.torch import _lean, fuse, program, region, region_pool  # noqa: E402

# outputs of each lean tag (the operands are the inputs', then these)
_N_OUT = {"conv_fwd": 1, "conv_dgrad": 1, "conv_wgrad": 1, "conv_fused": 1, "bn_train": 3}
_N_OUT |= {"bn_eval": 1, "bn_grad": 3, "bnr": 4, "act_fwd": 1, "act_bwd": 1}


class _Handle:
    device = 0

    def set_stream(self, s):
        pass


def _at(ptr, shape, stride, dtype):
    """A CPU tensor over the bytes at *ptr* (no copy)."""
    if 0 in shape:
        return torch.empty(shape, dtype=dtype)
    n = (sum((a - 1) * b for a, b in zip(shape, stride, strict=True)) + 1) * dtype.itemsize
    buf = (ctypes.c_char * max(n, 1)).from_address(ptr)
    return torch.frombuffer(buf, dtype=torch.uint8, count=n).view(dtype).as_strided(shape, stride)


def _subst(obj, table):
    if isinstance(obj, torch.Tensor):
        return table.get(id(obj), obj)
    if isinstance(obj, tuple | list):
        return type(obj)(_subst(o, table) for o in obj)
    return obj


class FakeEntry:
    """A bound entry that runs its slow function on operands rebuilt at the given pointers."""

    handle = _Handle()
    lean = True

    def __init__(self, tag, tensors, slow, args):
        name = tag[0]
        n_out = 4 if name == "bnr_grad" and tag[2] else 3 if name == "bnr_grad" else _N_OUT[name]
        self.n_in = len(tensors) - n_out
        self.metas = [(tuple(t.shape), t.stride(), t.dtype) for t in tensors]
        self.ids = [id(t) for t in tensors]
        self.keep = tensors  # the ids stay valid
        self.slow, self.args = slow, args
        LAUNCHES.append(name)

    def launch(self, ptrs):
        table = {}
        for i, p, (shape, stride, dt) in zip(self.ids, ptrs, self.metas, strict=True):
            table.setdefault(i, _at(p, shape, stride, dt))
        self.slow(*_subst(self.args, table))


LAUNCHES: list[str] = []
_STORE: dict = {}


def fake_launch(tag, tensors, stream, slow, *args):
    key = (tag, tuple((t.shape, t.stride(), t.dtype, t.data_ptr() & 15) for t in tensors))
    entry = _STORE.get(key)
    if entry is None:
        slow(*args)
        entry = _STORE[key] = FakeEntry(tag, tensors, slow, args)
    else:
        entry.launch(tuple(t.data_ptr() for t in tensors))
    tape = getattr(_lean._local, "tape", None)
    if tape is not None:
        tape.append((entry, tensors))


@pytest.fixture
def lean(bn_act, monkeypatch):  # noqa: F811
    monkeypatch.setattr(_lean, "launch", fake_launch)
    monkeypatch.setattr(_bound, "current_device", lambda: -1)  # a CPU tensor's get_device()
    monkeypatch.setattr(region, "cuda_ok", tf._ok)
    _STORE.clear()
    LAUNCHES.clear()
    yield


class Two(nn.Module):
    """A stem, a strided BasicBlock with a downsample, a Bottleneck; a pooling between."""

    def __init__(self):
        super().__init__()
        self.stem = tf.ConvBNAct(nn.ReLU(), c=4)
        self.pool = nn.MaxPool2d(2)
        self.layer = nn.Sequential(tf.BasicBlock(4, 8, 2), tf.Bottleneck(8, 4, 8))

    def forward(self, x):
        return self.layer(self.pool(self.stem(x)))


def _x(cin, n=2):
    return torch.randn(n, cin, 8, 8).double().to(memory_format=torch.channels_last)


def _programs(model):
    return [what for _, _, what in fuse.programs(model)]


def _regions(model):
    return [r for _, r in fuse.regions(model)]


@pytest.mark.usefixtures("lean")
@pytest.mark.parametrize("make", [tf.BasicBlock, tf.Bottleneck, Two], ids=lambda f: f.__name__)
def test_training_region_replays_programs_exactly(make):
    ref, mine = tf._pair(make)
    cin = 8 if make is tf.Bottleneck else 4 if make is tf.BasicBlock else 3
    for step in range(3):
        n = len(LAUNCHES)
        tf._same_step(ref, mine, _x(cin))
        if step:
            assert len(LAUNCHES) == n  # no new binding: every launch was a replay
        for p in list(ref.parameters()) + list(mine.parameters()):
            p.grad = None
    progs = _programs(mine)
    assert progs and all("backward program" in w for w in progs), progs
    # the step's one arena, as the programs hold it (bytes of the step's intermediate results)
    arenas = [b.fwd.arena_bytes for r in _regions(mine) for b in r._store().values()]
    assert all(n > 0 for n in arenas)
    assert [re.search(r"one arena of ([\d.]+) MiB[;( ]", w).group(1) for w in progs] == [
        f"{n / 2**20:.1f}" for n in arenas
    ]
    # and the bytes the backward makes outside it as it runs, where it does
    owns = [b.bwd.own_peak() for r in _regions(mine) for b in r._store().values()]
    assert any(owns)  # (the stem's batch-norm gradient: its forward's arena is all busy)
    assert [
        (m.group(1) if (m := re.search(r"\(and up to ([\d.]+) MiB as the backward", w)) else 0)
        for w in progs
    ] == [f"{n / 2**20:.1f}" if n else 0 for n in owns]
    # then the kernels the chains' batch norms ran on, per region: every conv -> bn -> [add ->]
    # relu chain cuDNN's fused kernel (these CPU fakes), a chain without a ReLU its separate calls
    chains = [r.pattern for _, r in fuse.fusions(mine) if r.pattern.startswith("conv")]
    relu = sum(p in ("conv_bn_act", "conv_bn_add_act") for p in chains)
    said: dict[str, int] = {}
    for w in progs:
        for n, path in re.findall(r"(\d+) on ([^,]+)", w.split("; batch norms: ")[1]):
            said[path] = said.get(path, 0) + int(n)
    want = {"cuDNN's fused kernel": relu, "cuDNN's separate calls": len(chains) - relu}
    assert said == {k: v for k, v in want.items() if v}, (progs, chains)
    for a, b in zip(mine.buffers(), ref.buffers(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


@pytest.mark.usefixtures("lean")
def test_region_is_one_autograd_node():
    _, mine = tf._pair(tf.Bottleneck)
    x = _x(8).requires_grad_()
    y = mine(x)
    node = y.grad_fn
    while type(node).__name__ == "GetitemBackward0" or "Getitem" in type(node).__name__:
        node = node.next_functions[0][0]
    assert type(node).__name__ == "_RegionFnBackward"


@pytest.mark.usefixtures("lean")
def test_eval_region_replays_and_refolds():
    ref, mine = tf._pair(Two)
    ref.eval()
    mine.eval()
    for _ in range(3):
        x = _x(3)
        with torch.no_grad():
            torch.testing.assert_close(mine(x), ref(x), rtol=1e-9, atol=1e-9)
    assert all(re.fullmatch(r"forward program of \d+ launches, arena of [\d.]+ MiB", w)
               for w in _programs(mine)), _programs(mine)  # fmt: skip
    n = len(LAUNCHES)
    with torch.no_grad():  # a parameter changed in place: the fold follows, no new binding
        for m in (ref, mine):
            m.layer[0].bn1.weight.mul_(1.5)
            m.layer[1].bn3.running_var.add_(0.25)
        x = _x(3)
        torch.testing.assert_close(mine(x), ref(x), rtol=1e-9, atol=1e-9)
    assert len(LAUNCHES) == n


@pytest.mark.usefixtures("lean")
def test_training_without_gradient_updates_statistics():
    ref, mine = tf._pair(Two)
    for _ in range(3):
        x = _x(3)
        with torch.no_grad():
            torch.testing.assert_close(mine(x), ref(x), rtol=1e-9, atol=1e-9)
    for a, b in zip(mine.buffers(), ref.buffers(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


@pytest.mark.usefixtures("lean")
def test_new_signature_binds_again_and_hooks_run_the_modules():
    ref, mine = tf._pair(tf.Bottleneck)
    tf._same_step(ref, mine, _x(8, n=2))
    tf._same_step(ref, mine, _x(8, n=3))
    assert len(_programs(mine)) == 2
    seen = []
    mine.bn2.register_forward_hook(lambda m, i, o: seen.append(1))
    tf._same_step(ref, mine, _x(8, n=2))
    assert seen == [1]


@pytest.mark.usefixtures("fakes")
def test_not_lean_calls_run_the_chains_and_say_why(monkeypatch):
    """Without bound entries (the plain fakes) the region records nothing replayable: the
    chains run one by one, with the reason in programs()."""
    monkeypatch.setattr(region, "cuda_ok", tf._ok)
    monkeypatch.setattr(_bound, "current_device", lambda: -1)
    ref, mine = tf._pair(tf.BasicBlock)
    ref.eval()
    mine.eval()
    x = torch.randn(2, 4, 8, 8).double()
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(mine(x), ref(x), rtol=1e-9, atol=1e-9)
    assert any("not a bound (lean) call" in w for w in _programs(mine)), _programs(mine)


class E:
    """An entry that launches nothing: for :func:`program.record`'s planning alone."""

    n_in = 1
    handle = _Handle()
    lean = True

    def launch(self, ptrs):
        pass


def test_record_refuses_foreign_operands_and_plans_lifetimes():
    a, b, c = torch.empty(10), torch.empty(100), torch.empty(100)
    d = torch.empty(100)
    # a -> b -> c -> d: with reuse, b and d may share bytes (b's last reader ran before d)
    got = program.record([(E(), (a, b)), (E(), (b, c)), (E(), (c, d))], [a], [d], reuse=True)
    prog, tensors = got
    assert tensors[0] is a and len(prog.offsets) == 2
    assert prog.offsets[0] != prog.offsets[1]
    assert prog.arena_bytes == 2 * program._up(400)
    alone = program.record([(E(), (a, b)), (E(), (b, c)), (E(), (c, d))], [a], [d], reuse=False)
    assert alone[0].arena_bytes == 2 * program._up(400)
    foreign = torch.empty(10)
    why = program.record([(E(), (foreign, b))], [a], [b], reuse=True)
    assert isinstance(why, str) and "no launch produced" in why
    assert "not a bound" in program.record([(None, (a, b))], [a], [b], reuse=True)


def test_a_fixed_layout_puts_unplaced_results_in_a_scratch_buffer():
    """With *places* (a custom op's arena, laid out by its fake too), the results the layout
    names go where it says; those it does not (a kernel's partial sums, read by the next launch
    only) go to a scratch buffer of the program's own, sharing bytes by lifetime, made per run;
    the arena keeps the layout's size."""
    a = torch.empty(10)
    part1, kept, part2, out = torch.empty(100), torch.empty(20), torch.empty(300), torch.empty(5)
    chain = [(E(), (a, part1)), (E(), (part1, kept)), (E(), (kept, part2)), (E(), (part2, out))]
    prog, tensors = program.record(chain, [a], [out], reuse=False, places={id(kept): 512},
                                   arena_bytes=1024)  # fmt: skip
    assert prog.arena_bytes == 1024 and prog.offsets == (512,)
    assert prog.scratch == (0, 0)  # part1's last reader ran before part2 is written
    assert prog.scratch_bytes == program._up(1200)
    assert [id(t) for t in tensors] == [id(a), id(kept), id(part1), id(part2), id(out)]
    (arena,), outs, slots = prog.run([a.data_ptr()], torch.device("cpu"), 0)
    assert arena.numel() == 1024 and slots[1] == arena.data_ptr() + 512
    assert slots[2] == slots[3] != slots[1] and outs[0].shape == out.shape
    bare = program.record(chain[:2], [a], [kept], reuse=False, places={}, arena_bytes=0)[0]
    assert bare.arena_bytes == 0 and bare.scratch_bytes == program._up(400)


def test_a_backward_takes_the_forwards_bytes_after_their_last_reader():
    a, b, c, d = torch.empty(10), torch.empty(100), torch.empty(100), torch.empty(100)
    fwd, ftensors = program.record([(E(), (a, b)), (E(), (b, c)), (E(), (c, d))], [a], [d],
                                   reuse=False)  # fmt: skip
    assert fwd.arena_bytes == 2 * program._up(400)  # b and c, one after the other
    # the backward reads c, then b: g1 and g2 may take neither's bytes (a launch never writes
    # where it reads), g3 takes c's (launch 1 read c last)
    dd, g1, g2, g3, g4 = (torch.empty(100) for _ in range(5))
    launches = [(E(), (dd, g1)), (E(), (g1, c, g2)), (E(), (g2, g3)), (E(), (g3, b, g4))]
    busy = program.held(fwd, ftensors, launches)
    up = program._up(400)
    assert sorted(busy.places) == [(0, up, 0, 3), (up, up, 0, 1)]
    assert busy.arena_bytes == 2 * up and busy.cuts == (0,)
    bwd, btensors = program.record(launches, [dd, *ftensors], [g4], reuse=True, busy=busy)
    # g3 in c's place; g1 and g2 fit nowhere in the forward's arena: tensors of their own, made
    # as they are first written, given back after their last reader (the arena is not grown)
    assert bwd.offsets == (up,) and bwd.arena_bytes == fwd.arena_bytes == 2 * up
    assert bwd.temps == (up, up) and not bwd.scratch_bytes
    n = 1 + len(ftensors)
    assert [id(t) for t in btensors[n:]] == [id(g3), id(g1), id(g2), id(g4)]
    # before launch 0: g1 made; 1: g2; 2: g1 given back; 3: g2 given back, the output made
    assert bwd.plan == {0: ((), (), (0,), ()), 1: ((), (), (1,), ()), 2: ((), (0,), (), ()),
                        3: ((), (1,), (), (0,))}  # fmt: skip
    # a forward's arena smaller than the places it holds is a planning error, said
    small_fwd = program.Held(busy.places, up, busy.cuts)
    why = program.record(launches, [dd, *ftensors], [g4], reuse=True, busy=small_fwd)
    assert isinstance(why, str) and "smaller than its places" in why
    # run in the forward's arena, or in one of its own
    arena = [torch.empty(fwd.arena_bytes, dtype=torch.uint8)]
    got, (out,), slots = bwd.run([0] * n, torch.device("cpu"), 0, arena)
    assert got is arena and slots[n] == arena[0].data_ptr() + up
    assert out.shape == g4.shape and slots[-1] == out.data_ptr()
    assert slots[n + 1] and slots[n + 2]  # g1 and g2 were made
    small = [torch.empty(8, dtype=torch.uint8)]
    own, _, _ = bwd.run([0] * n, torch.device("cpu"), 0, small)
    assert own is not small and own[0].numel() == bwd.arena_bytes
    # a result the backward reads outlives the forward; the others share bytes by lifetime
    e = torch.empty(100)
    chain = [(E(), (a, b)), (E(), (b, c)), (E(), (c, d)), (E(), (d, e))]
    assert program.record(chain, [a], [e], reuse=True)[0].arena_bytes == 2 * up  # d in b's place
    kept = program.record(chain, [a], [e], reuse=True, live={id(b)})[0]
    assert kept.arena_bytes == 3 * up and kept.offsets[0] not in kept.offsets[1:]


def test_a_backward_gives_the_forwards_chunks_back_as_it_goes():
    """A forward's arena in chunks (no place straddles a cut); its backward gives each back
    after the last launch using it, and keeps its own results within a chunk only where that
    chunk's forward places keep it anyway (elsewhere: tensors of their own)."""
    x = torch.empty(10)
    r = [torch.empty(100) for _ in range(4)]  # the forward's results, all read by the backward
    fwd_l = [(E(), (x, r[0]))] + [(E(), (r[i], r[i + 1])) for i in range(3)]
    fwd, ft = program.record(fwd_l, [x], [], reuse=True, live={id(t) for t in r}, chunks=4)
    up = program._up(400)
    assert fwd.offsets == (0, up, 2 * up, 3 * up) and fwd.cuts == (0, up, 2 * up, 3 * up)
    assert fwd.chunk_bytes == (up,) * 4 and fwd.places == ((0, 0), (1, 0), (2, 0), (3, 0))
    # the backward reads r3, r2, r1, r0 in turn (as a backward reads a forward's results)
    dd = torch.empty(100)
    g = [torch.empty(100) for _ in range(4)]
    bwd_l = [(E(), (dd, r[3], g[0])), (E(), (g[0], r[2], g[1])), (E(), (g[1], r[1], g[2])),
             (E(), (g[2], r[0], g[3]))]  # fmt: skip
    busy = program.held(fwd, ft, bwd_l)
    bwd, _ = program.record(bwd_l, [dd, *ft], [g[3]], reuse=True, busy=busy)
    assert bwd.cuts == fwd.cuts and bwd.arena_bytes == fwd.arena_bytes
    # g0 (launches 0-1), g1 (1-2), g2 (2-3) fit in no chunk: r0's is full to the end, and the
    # others are given back before their last readers: tensors of their own
    assert bwd.offsets == () and bwd.temps == (up, up, up)
    # r3's chunk (3) goes back before launch 1, r2's (2) before 2, r1's (1) before 3
    drops = {i: todo[0] for i, todo in bwd.plan.items() if todo[0]}
    assert drops == {1: (3,), 2: (2,), 3: (1,)}
    arena = [torch.empty(up, dtype=torch.uint8) for _ in range(4)]
    kept = list(arena)
    got, _, slots = bwd.run([0] * len([dd, *ft]), torch.device("cpu"), 0, arena)
    assert got is arena and got[0] is kept[0] and got[1:] == [None, None, None]
    n = 1 + len(ft)
    # g0-g2 and the output made; those alive at once apart (g2 may take g0's bytes: g0 went
    # back before g2 was made)
    assert all(slots[n : n + 4]) and slots[n] != slots[n + 1] != slots[n + 2]
    assert bwd.own_peak() == 2 * up  # at most two of them at once
    # a forward laid out in one piece when asked for no chunks
    one, _ = program.record(fwd_l, [x], [], reuse=True, live={id(t) for t in r})
    assert one.cuts == (0,) and one.chunk_bytes == (4 * up,)


@pytest.mark.usefixtures("lean")
def test_a_second_backward_of_one_forward_reruns_it(monkeypatch):
    """``retain_graph=True``: the first backward wrote its gradients over forward results it had
    read (one arena for both); a second backward of the same forward reruns the forward program
    and gets torch's gradients again, the running statistics untouched by the rerun."""
    ref, mine = tf._pair(Two)
    for step in range(3):  # the first step binds; the later ones replay the programs
        stats = []
        for m in (ref, mine):
            for p in m.parameters():
                p.grad = None
            torch.manual_seed(step)
            x = _x(3).requires_grad_()
            y = m(x)
            dy = torch.randn_like(y)
            y.backward(dy, retain_graph=True)
            first = [p.grad.clone() for p in m.parameters()]
            buffers = [t.clone() for t in m.buffers()]
            y.backward(dy)  # accumulates the same gradients once more
            for p, g in zip(m.parameters(), first, strict=True):
                torch.testing.assert_close(p.grad, 2 * g, rtol=1e-9, atol=1e-9)
            for t, was in zip(m.buffers(), buffers, strict=True):
                assert torch.equal(t, was)
            stats.append([p.grad for p in m.parameters()] + list(m.buffers()))
        for a, b in zip(*stats, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)
    assert all("backward program" in w for w in _programs(mine)), _programs(mine)


@pytest.mark.usefixtures("lean")
def test_the_arena_goes_back_when_the_backward_ends(monkeypatch):
    """A step's arena is freed as its backward ends, while the graph (the output) is still
    held, as autograd frees saved tensors: a training loop that keeps last step's loss while
    the next forward runs must not hold two arenas."""
    arenas = []
    run = program.Program.run

    def spy(self, *args, **kwargs):
        got = run(self, *args, **kwargs)
        arenas.extend(weakref.ref(t) for t in got[0] if t is not None)  # (its chunks)
        return got

    monkeypatch.setattr(program.Program, "run", spy)
    _, mine = tf._pair(Two)
    for step in range(3):
        for p in mine.parameters():
            p.grad = None
        y = mine(_x(3).requires_grad_())
        y.backward(torch.ones_like(y))
        gc.collect()
        if step:  # (the first step records the programs: no arena yet)
            assert arenas and all(a() is None for a in arenas), step  # y still holds the graph
        del y


def test_tapes_do_not_nest():
    with _lean.Tape(), pytest.raises(RuntimeError, match="already recording"), _lean.Tape():
        pass
    assert getattr(_lean._local, "tape", None) is None


def test_tape_is_per_thread():
    seen = []
    with _lean.Tape() as tape:
        t = threading.Thread(target=lambda: seen.append(getattr(_lean._local, "tape", None)))
        t.start()
        t.join()
    assert seen == [None] and tape.launches == []


def _steps(model, x, n=3):
    """*n* training steps of *model* on *x* (plain backward of a fixed gradient, no optimizer):
    the last output, the input's and parameters' gradients, the buffers."""
    torch.manual_seed(1)
    for _ in range(n):
        for p in model.parameters():
            p.grad = None
        xi = x.clone().requires_grad_()
        y = model(xi)
        y.backward(torch.randn_like(y))
    grads = [xi.grad, *(p.grad for p in model.parameters())]
    return [y, *grads, *model.buffers()]


def _same_with_and_without_programs(make, x, prepare):
    base = make()
    prepare(base)
    a = pt.convert(copy.deepcopy(base), fuse=True, strict=True)
    b = pt.convert(copy.deepcopy(base), fuse=True, strict=True)
    got = _steps(a, x)
    region.use_programs(False)
    try:
        want = _steps(b, x)
    finally:
        region.use_programs(True)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    return a


def _half_bn(model):
    model.float()
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.to(torch.bfloat16)


@pytest.mark.usefixtures("lean")
def test_half_batch_norm_parameters_are_cast_once_per_step(monkeypatch):
    """bfloat16 batch-norm parameters and statistics (a model moved to bfloat16 whole): the
    region casts them to float32 once per step, writes the statistics back and returns the
    gradients in bfloat16, as the chains do with a cast per module."""
    monkeypatch.setattr(tf.fused_train, "HALVES", (torch.float32,))
    x = torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last)
    a = _same_with_and_without_programs(Two, x, _half_bn)
    assert all("backward program" in w for w in _programs(a)), _programs(a)
    # the programs' float32 batch-norm gradients were cast together, one concatenation and one
    # cast, and autograd kept the bfloat16 views as the gradients (no copy a parameter)
    bns = [m for m in a.modules() if isinstance(m, nn.BatchNorm2d)]
    grads = [p.grad for m in bns for p in (m.weight, m.bias)]
    assert all(g.dtype == torch.bfloat16 for g in grads)
    assert len({g.untyped_storage().data_ptr() for g in grads}) < len(grads)


def test_small_gradients_of_cast_inputs_are_cast_together():
    """``_cast_small``: the small gradients whose dtype is not their input's become views of one
    cast concatenation per kind (equal to casting each); large ones, those already in their
    input's dtype and None are left as they are (autograd casts the large ones itself)."""
    bf, f32 = torch.bfloat16, torch.float32
    big = region.SMALL_GRAD + 1
    ins = tuple(
        torch.empty(n, dtype=d) for n, d in ((3, bf), (5, bf), (2, f32), (big, bf), (4, bf))
    )
    grads = [torch.randn(3), torch.randn(5), torch.randn(2), torch.randn(big), None]
    got = region._cast_small(list(grads), ins)
    assert got[0].dtype == got[1].dtype == bf
    assert got[0].untyped_storage().data_ptr() == got[1].untyped_storage().data_ptr()
    assert torch.equal(got[0], grads[0].to(bf)) and torch.equal(got[1], grads[1].to(bf))
    assert got[2] is grads[2] and got[3] is grads[3] and got[4] is None


@pytest.mark.usefixtures("lean")
def test_autocast_casts_the_weights_once_per_step(monkeypatch):
    """Under autocast (its dtype patched in: the CPU has no CUDA autocast) the region casts the
    convolution weights once per step and returns their gradients in float32."""
    monkeypatch.setattr(tf.fused_train, "HALVES", (torch.bfloat16,))
    for module in (region, tf.fused):
        monkeypatch.setattr(module, "autocast_dtype", lambda: torch.bfloat16)
    x = torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last)

    def prepare(model):
        model.float()

    a = _same_with_and_without_programs(Two, x, prepare)
    assert all("backward program" in w for w in _programs(a)), _programs(a)


def test_a_block_with_a_downsample_is_one_region():
    """torchvision's order (conv1, conv2, then the downsample of the block's input, then the
    add): the chains merge into one region per connected group (the stem apart: a pooling
    between)."""
    model = pt.convert(Two().double(), fuse=True)
    gm = model.__dict__["forward"].__self__
    sizes = [len(r.parts) for r in gm.children() if isinstance(r, region.FusedRegion)]
    assert sizes == [6]  # the stem's region is inside its pooling's module
    stems = [m for m in gm.children() if isinstance(m, region_pool.FusedPool)]
    assert len(stems) == 1 and len(stems[0].region.parts) == 1
    assert [len(r.parts) for _, r in fuse.regions(model)] == [1, 6]


@pytest.mark.parametrize("bad", [1, 0, "yes", None])
def test_use_programs_takes_a_bool_only(bad):
    with pytest.raises(TypeError, match="use_programs: enabled must be a bool"):
        region.use_programs(bad)


@pytest.mark.usefixtures("lean")
def test_programs_are_per_thread():
    """Another thread records its own program (bound entries hold their thread's handle)."""
    ref, mine = tf._pair(Two)
    ref.eval()
    mine.eval()
    x = _x(3)
    with torch.no_grad():
        mine(x)
        mine(x)

        def run():
            with torch.no_grad():  # grad mode is per thread
                mine(x)
                mine(x)

        t = threading.Thread(target=run)
        t.start()
        t.join()
        torch.testing.assert_close(mine(x), ref(x), rtol=1e-9, atol=1e-9)
    sigs = [sig for _, sig, _ in fuse.programs(mine)]
    assert len({s[-1] for s in sigs}) == 2  # two threads


@pytest.mark.usefixtures("lean")
@pytest.mark.parametrize("grad", [False, True])
def test_an_unreplayable_training_run_says_why(grad, monkeypatch):
    """Without cuDNN's fused batch norm (separate calls: torch adds the residual) a training
    region cannot be replayed: the chains run, and programs() gives the reason as text."""
    monkeypatch.setattr(tf.fused_train, "HALVES", ())
    ref, mine = tf._pair(tf.BasicBlock)
    for _ in range(2):
        x = _x(4)
        if grad:
            tf._same_step(ref, mine, x)
        else:
            with torch.no_grad():
                torch.testing.assert_close(mine(x), ref(x), rtol=1e-9, atol=1e-9)
    (what,) = _programs(mine)
    assert what == (
        "the chains one by one: a residual added by torch (no fused batch-norm kernel here); "
        "batch norms: 2 on cuDNN's separate calls"
    )
