"""NVIDIA cudnn-frontend's Python package (``import cudnn``, its ``pygraph`` API) as a third peer.

Used by ``runner.py`` on the GPU machine when the package is importable (``nvidia-cudnn-frontend``,
installed from the wheel carried with the run). Every graph is built once per problem (heuristics
mode A, then FALLBACK; plan finalized) outside the timed loops; the timed call is
``graph.execute(variant_pack, workspace, handle=handle)`` with a variant pack dict keyed by the
graph's tensors, as the frontend's samples do. The handle runs on torch's current stream.

Math modes as for torch and pycudnn: fp32 without TF32 bars engines with the TENSOR_CORE or
DOWN_CONVERT_INPUTS numerical note (what PyTorch's ``filterEngineConfigs`` and pycudnn do);
then the first plan that builds is taken plan by plan. The frontend has no autotuning of its
own, so it runs its heuristic plan in both modes.

Nothing here imports torch or cudnn at module level: ``load`` does, and says why not when it
cannot (the reason goes into the JSON and the report, and the column is skipped).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

ENV_DISABLE = "BENCH_NO_FRONTEND"  # set (non-empty) to skip the frontend column


@dataclass
class FeCall:
    """One built frontend graph: ``run()`` executes it with the prebuilt variant pack."""

    graph: Any
    pack: dict
    workspace: Any
    run: Callable[[], object]
    plan: str = ""
    build_ms: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


def load(
    torch: Any, torch_cudnn_version: int, libcudnn_files: Callable[[], Sequence[str]], stream: int
) -> tuple[Frontend | None, dict[str, Any]]:
    """Import the frontend and check it runs on torch's libcudnn; ``(None, info)`` with
    ``info["reason"]`` when it cannot be used."""
    info: dict[str, Any] = {"available": False}
    if os.environ.get(ENV_DISABLE):
        info["reason"] = f"disabled by ${ENV_DISABLE}"
        return None, info
    try:
        import cudnn  # nvidia-cudnn-frontend
    except Exception as exc:  # absent, or a broken install
        info["reason"] = f"import cudnn failed: {type(exc).__name__}: {exc}"
        return None, info
    try:
        info["version"] = getattr(cudnn, "__version__", "?")
        info["module"] = getattr(cudnn, "__file__", "?")
        if not hasattr(cudnn, "pygraph"):
            info["reason"] = f"cudnn {info['version']} at {info['module']} has no pygraph"
            return None, info
        bv = int(cudnn.backend_version())
        info["backend_version"] = bv
        if bv != int(torch_cudnn_version):
            info["reason"] = f"frontend runs on cuDNN {bv}, torch on {torch_cudnn_version}"
            return None, info
        files = [f for f in libcudnn_files() if os.path.basename(f) == "libcudnn.so.9"]
        info["libcudnn_files"] = files
        if len(files) != 1:
            info["reason"] = f"expected one libcudnn.so.9 mapped after import cudnn, found {files}"
            return None, info
        handle = cudnn.create_handle()
        cudnn.set_stream(handle=handle, stream=stream)
        fe = Frontend(cudnn, torch, handle, stream)
    except Exception as exc:
        info["reason"] = f"frontend setup failed: {type(exc).__name__}: {exc}"
        return None, info
    info["available"] = True
    info["heuristics"] = "A, FALLBACK (rank 0 that builds); no autotuning"
    return fe, info


class Frontend:
    """Builds conv fprop/dgrad/wgrad and fused conv+bias(+z)+relu graphs on torch tensors."""

    def __init__(self, cudnn: Any, torch: Any, handle: Any, stream: int) -> None:
        self.cudnn = cudnn
        self.torch = torch
        self.handle = handle
        self.stream = stream

    # -- helpers --------------------------------------------------------------------------------
    def data_type(self, t: Any) -> Any:
        dt = self.cudnn.data_type
        name = str(t.dtype).removeprefix("torch.")
        table = {"bfloat16": dt.BFLOAT16, "float16": dt.HALF, "float32": dt.FLOAT}
        if name not in table:
            raise ValueError(f"no cudnn data type for {t.dtype}")
        return table[name]

    def new_graph(self, io: Any) -> Any:
        f32 = self.cudnn.data_type.FLOAT
        return self.cudnn.pygraph(
            io_data_type=self.data_type(io),
            intermediate_data_type=f32,
            compute_data_type=f32,
            handle=self.handle,
        )

    def tensor(self, g: Any, name: str, t: Any) -> Any:
        return g.tensor(
            name=name, dim=list(t.shape), stride=list(t.stride()), data_type=self.data_type(t)
        )

    @staticmethod
    def note_filters(dtype: str, tf32: bool) -> list[str]:
        """Numerical notes barred for fp32 data, as torch and pycudnn bar them: without TF32,
        tensor-core (TF32) engines and engines that down-convert their inputs. fp16/bf16 graphs
        take the frontend's own walk unfiltered."""
        if dtype != "float32" or tf32:
            return []
        return ["TENSOR_CORE", "DOWN_CONVERT_INPUTS"]

    def finish(self, g: Any, pack: dict, barred: Sequence[str]) -> FeCall:
        """Plan, build the first plan that builds, allocate the workspace; time the build."""
        cudnn, torch = self.cudnn, self.torch
        t0 = time.perf_counter()
        if barred:
            g.deselect_numeric_notes([getattr(cudnn.numerical_note, n) for n in barred])
        g.validate()
        g.build_operation_graph()
        g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        g.check_support()
        chosen = self.build_first(g, bool(barred))
        ws_size = int(g.get_workspace_size())
        ws = torch.empty(ws_size, device="cuda", dtype=torch.uint8)
        h = self.handle

        def run() -> object:
            return g.execute(pack, ws, handle=h)

        torch.cuda.synchronize()
        build_ms = (time.perf_counter() - t0) * 1e3
        try:
            plan = str(g.get_plan_name_at_index(chosen))
        except Exception as exc:  # diagnostics only
            plan = f"? ({type(exc).__name__})"
        return FeCall(g, pack, ws, run, plan=plan, build_ms=build_ms, extra={"workspace": ws_size})

    @staticmethod
    def build_first(g: Any, filtered: bool) -> int:
        """Index of the plan built. Without note filters, the frontend's own walk; with them,
        plan by plan, since a backend entry barred by a note may raise instead of declining."""
        if not filtered:
            g.build_plans()
            return int(getattr(g, "_plan_index", 0))
        errors = []
        for i in range(int(g.get_execution_plan_count())):
            try:
                g.select_plan(i)
                g.build_plans()
                return i
            except Exception as exc:
                errors.append(f"[{i}] {type(exc).__name__}: {str(exc)[:100]}")
        raise RuntimeError("no frontend plan built: " + "; ".join(errors[:6]))

    # -- graphs ---------------------------------------------------------------------------------
    def conv(
        self,
        op: str,
        geom: Any,
        dtype: str,
        tf32: bool,
        x: Any,
        w: Any,
        y: Any,
    ) -> FeCall:
        """fwd: y = conv(x, w); dgrad: x = dgrad(y=dy, w) (x is the output); wgrad:
        w = wgrad(x, y=dy) (w is the output). Grouped convs follow from w's C/groups dim."""
        g = self.new_graph(x)
        kw = dict(padding=list(geom.pad), stride=list(geom.stride), dilation=list(geom.dilation))
        if op == "fwd":
            X, W = self.tensor(g, "X", x), self.tensor(g, "W", w)
            out = g.conv_fprop(image=X, weight=W, name="conv", **kw)
            out.set_output(True).set_dim(list(y.shape)).set_stride(list(y.stride()))
            pack = {X: x, W: w, out: y}
        elif op == "dgrad":
            DY, W = self.tensor(g, "DY", y), self.tensor(g, "W", w)
            out = g.conv_dgrad(loss=DY, filter=W, name="dgrad", **kw)
            out.set_output(True).set_dim(list(x.shape)).set_stride(list(x.stride()))
            pack = {DY: y, W: w, out: x}
        elif op == "wgrad":
            X, DY = self.tensor(g, "X", x), self.tensor(g, "DY", y)
            out = g.conv_wgrad(image=X, loss=DY, name="wgrad", **kw)
            out.set_output(True).set_dim(list(w.shape)).set_stride(list(w.stride()))
            pack = {X: x, DY: y, out: w}
        else:
            raise ValueError(op)
        call = self.finish(g, pack, self.note_filters(dtype, tf32))
        call.extra["out"] = out
        return call

    def fused(
        self,
        x: Any,
        w: Any,
        b4: Any,
        z: Any | None,
        y: Any,
        pad: Sequence[int],
        stride: Sequence[int],
        dtype: str,
    ) -> FeCall:
        """y = relu(conv(x, w) + b4 [+ z]) as one graph: conv_fprop -> bias [-> add z] -> relu.
        ``b4`` is the bias as a (1, K, 1, 1) tensor."""
        g = self.new_graph(x)
        X, W, B = self.tensor(g, "X", x), self.tensor(g, "W", w), self.tensor(g, "B", b4)
        conv = g.conv_fprop(
            image=X,
            weight=W,
            padding=list(pad),
            stride=list(stride),
            dilation=[1] * len(pad),
            name="conv",
        )
        t = g.bias(name="bias", input=conv, bias=B)
        pack = {X: x, W: w, B: b4}
        if z is not None:
            Z = self.tensor(g, "Z", z)
            t = g.add(name="residual", a=t, b=Z)
            pack[Z] = z
        out = g.relu(name="relu", input=t)
        out.set_output(True).set_dim(list(y.shape)).set_stride(list(y.stride()))
        pack[out] = y
        call = self.finish(g, pack, self.note_filters(dtype, False))
        call.extra["out"] = out
        return call

    # -- the tiny conv's host-time variants -----------------------------------------------------
    def tiny(self, x: Any, w: Any, y: Any) -> tuple[FeCall, Callable, Callable]:
        """(call, reuse(xi), new_buffers(xi)): the same variant pack dict every call, or a new
        dict per call with the given input and a new output tensor (what ``F.conv2d`` does)."""
        from .harness import ConvGeom

        geom = ConvGeom(1, 8, 8, (8, 8), (3, 3), pad=(1, 1))
        call = self.conv("fwd", geom, "float32", False, x, w, y)
        g, ws, h, torch = call.graph, call.workspace, self.handle, self.torch
        X, W, Y = (k for k in call.pack)  # insertion order: X, W, out
        pack = call.pack
        shape = tuple(y.shape)

        def reuse(_xi: Any) -> object:
            return g.execute(pack, ws, handle=h)

        def new_buffers(xi: Any) -> object:
            out = torch.empty(shape, device="cuda")
            g.execute({X: xi, W: w, Y: out}, ws, handle=h)
            return out

        return call, reuse, new_buffers
