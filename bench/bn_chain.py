"""What cuDNN's conv-BN training fusions would save on ResNet-50 (issue 38's ceiling): GPU
kernel time of each fused pattern against the launches a fused training step runs for the
same work today, on the bottleneck blocks' real shapes.

A bottleneck is ``conv1 (1x1) -> bn1 -> relu -> conv2 (3x3) -> bn2 -> relu -> conv3 (1x1) ->
bn3 (+ x) -> relu``. Today (``convert(fuse=True)``) each batch norm with its ReLU is one cuDNN
kernel each way (``bn_act_train_run`` / ``bn_act_grad_run``), beside plain convolutions. The
fusions (``pycudnn.graph``, ``docs/graph.md``) replace, for the two inner batch norms:

* forward ``bn1+relu, conv2, bn2+relu, conv3`` (and conv1) by ``conv1 -> genstats``, BN
  finalize, ``scale-bias-relu -> conv2 -> genstats``, finalize, ``scale-bias-relu -> conv3``
  (with genstats, counted, though bn3's kernel still computes its own statistics);
* backward ``dgrad3, bn2+relu backward, wgrad3`` (and the same for conv2 / bn1) by
  ``dgrad3 -> drelu -> dbn_weight``, the batch norm's input gradient applied elementwise
  (``eq_dy * drelu + eq_x * y + eq_b``; its traffic, read two tensors and write one, timed as
  torch's add of two tensors: no such kernel is built) and ``scale-bias-relu -> wgrad3`` (the
  ReLU's output is no longer stored).

bn3 (with the residual) and conv1's data and weight gradients are the same both ways and not
counted. Per stage (identity blocks, batch ``--batch``, channels-last) and dtype: each launch's
GPU µs (``torch.profiler``, all kernels of ``--calls`` calls, per call), the forward and
backward sums both ways, and over the model (identity blocks 2, 3, 5, 2 per stage; the first
block of each stage, strided, is left out). A pattern cuDNN has no engine for prints ``no
engine``.

Besides the fusions, the same run times the other ways to the batch norms' memory rate: bn3's
traffic (``apply3_traffic``, torch's add of two such tensors) against its kernel today
(``bn_add_relu_fwd`` / ``_bwd``); cuDNN's graph batch norm (``graph_bn*``: NORM_FORWARD with the
addition and ReLU, NORM_BACKWARD through the ReLU's backward and alone); and pycudnn's own
kernels (``own_*``, :mod:`pycudnn.torch.bn_kernel`, each kernel's µs in ``own_kernels``).
``BNOWN`` sums the three batch norms of the identity blocks both ways.

Run on the GPU machine from the repository root::

    PYTHONPATH=. python3 bench/bn_chain.py [--batch 64] [--dtypes fp16,bf16] [--json out.json]
        [--policy autotune] [--heur-mode a,b,fallback]

``--policy autotune`` builds every graph (today's convolutions and the fused patterns alike) on
the fastest of the engines its heuristics modes list, timed by cuDNN's plans on scratch
buffers, where the default takes the first that builds.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import pycudnn  # noqa: E402  (after torch: one libcudnn)
from bench import torch_models as tm  # noqa: E402
from pycudnn import errors  # noqa: E402
from pycudnn.graph import Graph  # noqa: E402
from pycudnn.torch import bn_kernel  # noqa: E402
from pycudnn.torch.batchnorm import bn_act_grad_run, bn_act_train_run, reserve_bytes  # noqa: E402

CL = torch.channels_last
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
#: ResNet-50's stages: (middle channels, spatial side, identity blocks)
STAGES = ((64, 56, 2), (128, 28, 3), (256, 14, 5), (512, 7, 2))
EPS, MOMENTUM = 1e-5, 0.1


def _gpu_us(fn, calls: int, detail: dict | None = None) -> float:
    """GPU kernel µs per call of *fn* (every kernel it launches), after two warm-up calls;
    *detail* gets each kernel's µs per call."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    per = tm.profiled_kernels(fn, calls)
    if detail is not None:
        detail.update({name[:60]: round(us, 1) for name, (_, us) in per.items()})
    return sum(us for _, us in per.values())


def _nchw(t: torch.Tensor) -> tuple:
    return tuple(t.shape)


class _Runner:
    """Builds one graph per pattern and times it; a pattern without an engine is None."""

    def __init__(self, dtype: torch.dtype, calls: int, build: dict) -> None:
        self.dtype, self.calls, self.build = dtype, calls, build
        self.why: dict[str, str] = {}

    def graph(self, name: str, make) -> tuple | None:
        g = Graph(io_data_type=self.dtype, name=name)
        pack_of = make(g)
        try:
            g.build(**self.build)
        except errors.CudnnError as exc:  # no engine, or cuDNN refused the graph's description
            self.why[name] = str(exc)[:200]
            return None
        return g, pack_of

    def time(self, name: str, make) -> float | None:
        got = self.graph(name, make)
        if got is None:
            return None
        g, pack = got
        stream = torch.cuda.current_stream()
        return _gpu_us(lambda: g.execute(pack, stream=stream), self.calls)


def _per_channel(c: int, device) -> list[torch.Tensor]:
    return [torch.rand(1, c, 1, 1, device=device) + 0.5 for _ in range(2)]


def stage_times(
    cm: int, side: int, batch: int, dtype: torch.dtype, calls: int, build: dict | None = None
) -> dict:
    """Each launch's GPU µs for one identity bottleneck of *cm* middle channels; *build*: the
    keywords every graph is built with (``Graph.build``'s *policy* and *heur_mode*)."""
    dev = torch.device("cuda")
    co = 4 * cm
    r = _Runner(dtype, calls, build or {})

    def act(c: int) -> torch.Tensor:
        return torch.randn(batch, c, side, side, device=dev).to(dtype, memory_format=CL)

    def weight(k: int, c: int, s: int) -> torch.Tensor:
        return (torch.randn(k, c, s, s, device=dev) * 0.05).to(dtype, memory_format=CL)

    x, y1, y2, dy3 = act(co), act(cm), act(cm), act(co)
    w1, w2, w3 = weight(cm, co, 1), weight(cm, cm, 3), weight(co, cm, 1)
    t: dict[str, float | None] = {}

    def image(g, xin, sbr):
        """*xin* as a graph input, after the scale-bias-ReLU prologue with *sbr*: ``(the
        convolution's image, the pack so far)``."""
        tx = g.tensor_like(xin, name="x")
        if not sbr:
            return tx, {tx: xin}
        s, b = (p.to(dtype) for p in _per_channel(xin.shape[1], dev))
        ts, tb = g.tensor_like(s, name="s"), g.tensor_like(b, name="b")
        return g.relu(g.add(g.mul(tx, ts), tb)), {tx: xin, ts: s, tb: b}

    def make_conv(g, math, xin, w, pad, gs, sbr):
        inp, pack = image(g, xin, sbr)
        tw = g.tensor_like(w, name="w")
        pack[tw] = w
        ty = g.conv_fprop(inp, tw, padding=pad).set_output(True)
        yo = torch.empty(batch, w.shape[0], side, side, device=dev, dtype=dtype)
        pack[ty] = yo.to(memory_format=CL)
        if gs:
            for tt in g.genstats(ty, compute_data_type=math):
                tt.set_output(True)
                pack[tt] = torch.empty(1, w.shape[0], 1, 1, device=dev)
        return pack

    def conv(name, xin, w, pad, gs=False, sbr=False):
        # genstats' math: the graph's (float32) first, then the activation's type (what
        # cudnn-frontend sets; bfloat16's prologue pattern takes only that)
        for math in (None, dtype) if gs else (None,):
            t[name] = r.time(name, lambda g, m=math: make_conv(g, m, xin, w, pad, gs, sbr))
            if t[name] is not None:
                return

    def dgrad(name, dy, w, pad, xlike, fused=False):
        def make(g):
            tdy, tw = g.tensor_like(dy, name="dy"), g.tensor_like(w, name="w")
            pack = {tdy: dy, tw: w}
            dx = g.conv_dgrad(tdy, tw, padding=pad, image_dim=_nchw(xlike))
            out = torch.empty_like(xlike)
            if not fused:
                pack[dx.set_output(True)] = out
                return pack
            tx = g.tensor_like(xlike, name="bn_in")
            per = _per_channel(xlike.shape[1], dev) + _per_channel(xlike.shape[1], dev)
            tm_, ti, tg, tb = (g.tensor_like(p) for p in per)
            bn_y = g.add(g.mul(g.mul(g.sub(tx, tm_), ti), tg), tb)
            td = g.relu_backward(dx, bn_y).set_output(True)
            pack |= {tx: xlike, tm_: per[0], ti: per[1], tg: per[2], tb: per[3], td: out}
            for o in g.dbn_weight(td, tx, tm_, ti, tg):
                o.set_output(True)
                pack[o] = torch.empty(1, xlike.shape[1], 1, 1, device=dev)
            return pack

        t[name] = r.time(name, make)

    def wgrad(name, xin, dy, w, pad, sbr=False):
        def make(g):
            inp, pack = image(g, xin, sbr)
            tdy = g.tensor_like(dy, name="dy")
            pack[tdy] = dy
            dw = g.conv_wgrad(inp, tdy, padding=pad, filter_dim=_nchw(w)).set_output(True)
            pack[dw] = torch.empty_like(w)
            return pack

        t[name] = r.time(name, make)

    # forward, today: plain convolutions, batch norm + ReLU one cuDNN kernel each
    conv("conv1", x, w1, 0)
    conv("conv2", y1, w2, 1)
    conv("conv3", y2, w3, 0)
    gamma, beta = torch.rand(cm, device=dev) + 0.5, torch.randn(cm, device=dev)
    running = (torch.zeros(cm, device=dev), torch.ones(cm, device=dev))
    n = reserve_bytes(tuple(y1.shape), dtype, dev.index or 0, False)
    saved = bn_act_train_run(y1, gamma, beta, None, running, EPS, MOMENTUM, n)
    t["bn_relu_fwd"] = _gpu_us(
        lambda: bn_act_train_run(y1, gamma, beta, None, running, EPS, MOMENTUM, n), calls
    )
    a, mean, invstd, reserve = saved
    t["bn_relu_bwd"] = _gpu_us(
        lambda: bn_act_grad_run(y1, a, y2, gamma, beta, mean, invstd, reserve, EPS, False), calls
    )
    # forward, fused
    conv("conv1_genstats", x, w1, 0, gs=True)
    conv("sbr_conv2_genstats", y1, w2, 1, gs=True, sbr=True)
    conv("sbr_conv3_genstats", y2, w3, 0, gs=True, sbr=True)

    def finalize(g):
        ins = [torch.rand(1, cm, 1, 1, device=dev) + 0.5 for _ in range(6)]
        tin = [g.tensor_like(v) for v in ins]
        outs = g.bn_finalize(
            *tin[:4], g.scalar(EPS), g.scalar(batch * side * side, "int64"),
            prev_running_mean=tin[4], prev_running_var=tin[5], momentum=g.scalar(MOMENTUM),
        )  # fmt: skip
        pack = dict(zip(tin, ins, strict=True))
        for o in outs:
            o.set_output(True)
            pack[o] = torch.empty(1, cm, 1, 1, device=dev)
        return pack

    fin = Graph(io_data_type="float32", name="bn_finalize")
    pack = finalize(fin)
    fin.build()
    t["bn_finalize"] = _gpu_us(lambda: fin.execute(pack, stream=torch.cuda.current_stream()), calls)
    # backward, today and fused (conv3's gradients against bn2; conv2's against bn1)
    dy2 = act(cm)
    dgrad("dgrad3", dy3, w3, 0, y2)
    dgrad("dgrad2", dy2, w2, 1, y1)
    dgrad("dgrad3_drelu_dbn", dy3, w3, 0, y2, fused=True)
    dgrad("dgrad2_drelu_dbn", dy2, w2, 1, y1, fused=True)
    wgrad("wgrad3", y2, dy3, w3, 0)
    wgrad("wgrad2", y1, dy2, w2, 1)
    wgrad("sbr_wgrad3", y2, dy3, w3, 0, sbr=True)
    wgrad("sbr_wgrad2", y1, dy2, w2, 1, sbr=True)
    out = torch.empty_like(y1)
    t["apply_traffic"] = _gpu_us(lambda: torch.add(y1, y2, out=out), calls)
    # bn3 with the residual: today one kernel (statistics, scale-bias, add, ReLU); with conv3's
    # genstats it would be finalize and an elementwise scale-bias-add-ReLU (traffic: read two,
    # write one, timed as torch's add)
    y3, z = act(co), act(co)
    g3, b3 = torch.rand(co, device=dev) + 0.5, torch.randn(co, device=dev)
    run3 = (torch.zeros(co, device=dev), torch.ones(co, device=dev))
    n3 = reserve_bytes(tuple(y3.shape), dtype, dev.index or 0, True)
    t["bn_add_relu_fwd"] = _gpu_us(
        lambda: bn_act_train_run(y3, g3, b3, z, run3, EPS, MOMENTUM, n3), calls
    )
    out3 = torch.empty_like(y3)
    t["apply3_traffic"] = _gpu_us(lambda: torch.add(y3, z, out=out3), calls)
    a3, m3, i3, res3 = bn_act_train_run(y3, g3, b3, z, run3, EPS, MOMENTUM, n3)
    t["bn_add_relu_bwd"] = _gpu_us(
        lambda: bn_act_grad_run(y3, a3, dy3, g3, b3, m3, i3, res3, EPS, True), calls
    )
    # the same batch norms in pycudnn's own kernels (pycudnn.torch.bn_kernel)
    mask1 = bn_kernel.train_forward(y1, gamma, beta, None, running, EPS, MOMENTUM, True)[3]
    mask3 = bn_kernel.train_forward(y3, g3, b3, z, run3, EPS, MOMENTUM, True)[3]
    own = {
        "own_bn_fwd": lambda: bn_kernel.train_forward(
            y1, gamma, beta, None, running, EPS, MOMENTUM, True
        ),
        "own_bn_bwd": lambda: bn_kernel.train_backward(y2, mask1, y1, gamma, mean, invstd, False),
        "own_bn3_fwd": lambda: bn_kernel.train_forward(y3, g3, b3, z, run3, EPS, MOMENTUM, True),
        "own_bn3_bwd": lambda: bn_kernel.train_backward(dy3, mask3, y3, g3, m3, i3, True),
    }
    kernels: dict[str, dict] = {}
    for name, fn in own.items():
        t[name] = _gpu_us(fn, calls, kernels.setdefault(name, {}))
    # the same batch norms as cuDNN's graph API builds them (NORM_FORWARD / NORM_BACKWARD,
    # the addition and the ReLU as pointwise operations of the same graph)
    for key, yy, zz, dd in (("", y1, None, y2), ("3", y3, z, dy3)):
        fwd = f"graph_bn{key}_fwd"
        t[fwd] = r.time(fwd, lambda g, x=yy, zz=zz: _bn_fwd(g, x, zz))
        bwd = f"graph_bn{key}_bwd"
        t[bwd] = r.time(bwd, lambda g, x=yy, d=dd, zz=zz: _bn_bwd(g, x, d, zz))
        t[bwd + "_alone"] = r.time(bwd, lambda g, x=yy, d=dd: _bn_bwd(g, x, d, None, False))
    return {"times": t, "no_engine": r.why, "own_kernels": kernels}


def _stats(x: torch.Tensor) -> list[torch.Tensor]:
    c = x.shape[1]
    return [torch.rand(1, c, 1, 1, device=x.device) + 0.5 for _ in range(4)]


def _bn_fwd(g: Graph, x: torch.Tensor, z: torch.Tensor | None) -> dict:
    """``relu(batch_norm(x) [+ z])`` in training, running statistics updated, one graph."""
    scale, bias, rm, rv = _stats(x)
    tx, ts, tb, trm, trv = (g.tensor_like(v) for v in (x, scale, bias, rm, rv))
    y, mean, inv, nrm, nrv = g.batchnorm(
        tx, ts, tb, g.scalar(EPS), in_running_mean=trm, in_running_var=trv,
        momentum=g.scalar(MOMENTUM),
    )  # fmt: skip
    pack = {tx: x, ts: scale, tb: bias, trm: rm, trv: rv}
    if z is not None:
        tz = g.tensor_like(z)
        pack[tz] = z
        y = g.add(y, tz)
    out = g.relu(y).set_output(True)
    pack[out] = torch.empty_like(x)
    for t in (mean, inv, nrm, nrv):
        t.set_output(True)
        pack[t] = torch.empty_like(scale)
    return pack


def _bn_bwd(
    g: Graph, x: torch.Tensor, dy: torch.Tensor, z: torch.Tensor | None, relu: bool = True
) -> dict:
    """The gradients of :func:`_bn_fwd` from its saved output and statistics, one graph
    (*relu* False: the norm's backward alone, from the ReLU's gradient)."""
    scale, mean, inv, _ = _stats(x)
    out = torch.relu(x)
    tdy, tx = g.tensor_like(dy), g.tensor_like(x)
    ts, tm, ti = (g.tensor_like(v) for v in (scale, mean, inv))
    pack = {tdy: dy, tx: x, ts: scale, tm: mean, ti: inv}
    d = tdy
    if relu:
        tout = g.tensor_like(out)
        pack[tout] = out
        d = g.relu_backward(tdy, tout)
    if z is not None and relu:
        pack[d.set_output(True)] = torch.empty_like(x)
    dx, ds, db = g.batchnorm_backward(d, tx, ts, tm, ti)
    pack[dx.set_output(True)] = torch.empty_like(x)
    for t in (ds, db):
        pack[t.set_output(True)] = torch.empty_like(scale)
    return pack


def sums(t: dict) -> dict:
    """Forward and backward µs of the counted work, today and fused (None where a fused
    pattern has no engine)."""

    def total(names, extra=0.0):
        vals = [t[k] for k in names]
        return None if any(v is None for v in vals) else sum(vals) + extra

    bn_f, bn_b, fin, app = t["bn_relu_fwd"], t["bn_relu_bwd"], t["bn_finalize"], "apply_traffic"
    own = ["own_bn_fwd", "own_bn_bwd", "own_bn3_fwd", "own_bn3_bwd"]
    return {
        "bn_today": 2 * (bn_f + bn_b) + t["bn_add_relu_fwd"] + t["bn_add_relu_bwd"],
        "bn_own": 2 * (t[own[0]] + t[own[1]]) + t[own[2]] + t[own[3]],
        "bn3_today": t["bn_add_relu_fwd"],
        "bn3_fused": fin + t["apply3_traffic"],
        "fwd_today": total(["conv1", "conv2", "conv3"], 2 * bn_f),
        "fwd_fused": total(["conv1_genstats", "sbr_conv2_genstats", "sbr_conv3_genstats"], 2 * fin),
        "bwd_today": total(["dgrad3", "wgrad3", "dgrad2", "wgrad2"], 2 * bn_b),
        "bwd_fused": total(
            ["dgrad3_drelu_dbn", "sbr_wgrad3", "dgrad2_drelu_dbn", "sbr_wgrad2", app, app]
        ),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--dtypes", default="fp16,bf16")
    p.add_argument("--calls", type=int, default=20)
    p.add_argument(
        "--policy", default="heuristics", choices=("heuristics", "autotune"),
        help="how every graph picks its engine (autotune: the fastest of those that build)",
    )  # fmt: skip
    p.add_argument("--heur-mode", default="a,fallback", help="cuDNN heuristics modes, in order")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    build = {"policy": args.policy, "heur_mode": tuple(args.heur_mode.split(","))}
    dts = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    for d in dts:
        if d not in DTYPES:
            p.error(f"--dtypes: unknown dtype {d!r} (of {', '.join(DTYPES)})")
    torch.manual_seed(0)
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "cudnn": pycudnn.version(), "build": build}  # fmt: skip
    print(
        f"# {meta['gpu']}, torch {meta['torch']}, cuDNN {meta['cudnn']}, batch {args.batch}, "
        f"graphs built with {build}"
    )
    res = []
    for d in dts:
        keys = ("bn_today", "bn_own", "bn3_today", "bn3_fused")
        model = dict.fromkeys((*keys, "fwd_today", "fwd_fused", "bwd_today", "bwd_fused"), 0.0)
        for cm, side, blocks in STAGES:
            got = stage_times(cm, side, args.batch, DTYPES[d], args.calls, build)
            s = sums(got["times"])
            res.append({"dtype": d, "mid": cm, "side": side, "blocks": blocks, **got, "sums": s})
            cells = ", ".join(
                f"{k} {'no engine' if v is None else f'{v:.1f}'}" for k, v in got["times"].items()
            )
            print(f"  {d} {cm}x{side}x{side}: {cells}")
            for k, v in s.items():
                model[k] = None if v is None or model[k] is None else model[k] + blocks * v
            for name, why in got["no_engine"].items():
                print(f"    {name}: {why}")
            for name, per in got["own_kernels"].items():
                print(f"  {d} {cm}: {name} kernels: {per}")
        f = {k: "n/a" if v is None else f"{v / 1e3:.3f} ms" for k, v in model.items()}
        print(
            f"BNCHAIN {d}: forward today {f['fwd_today']}, fused {f['fwd_fused']}; "
            f"backward today {f['bwd_today']}, fused {f['bwd_fused']} "
            "(ResNet-50's 12 identity blocks, inner batch norms); bn3 forward today "
            f"{f['bn3_today']}, genstats-finalize-apply {f['bn3_fused']}",
            flush=True,
        )
        print(
            f"BNOWN {d}: the three batch norms of the 12 identity blocks, forward and backward: "
            f"cuDNN's fused kernels {f['bn_today']}, pycudnn's kernels {f['bn_own']}",
            flush=True,
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": meta, "stages": res}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
