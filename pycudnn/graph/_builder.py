"""The public graph builder: :class:`Graph` and its :class:`Tensor` handles.

A :class:`Graph` records tensors and operations in Python (nothing touches cuDNN until
:meth:`Graph.build`): every argument is checked when the operation is added, and output shapes
are inferred then, so a mistake is reported at the line that made it. :meth:`Graph.build`
freezes the graph into a :class:`~pycudnn.graph._key.GraphKey` -- plain data, hashable by
structure -- and asks the plan engine (:func:`._plans.plan`, the one that plans every graph the
library runs) for a plan, cached per thread under that key. :meth:`Graph.execute` runs it with
a mapping from tensors to device arrays.

The vocabulary follows cudnn-frontend's ``pygraph``: ``tensor``/``tensor_like``, ``conv_fprop``,
``conv_dgrad``, ``conv_wgrad``, ``matmul``, the pointwise operations by name (``add``, ``relu``,
``gelu``, ``cmp_gt``, ``binary_select``, ...), ``reduction``, ``layernorm``/``rmsnorm``/
``instancenorm``/``batchnorm`` and their ``_backward``, ``sdpa``/``sdpa_backward``, the conv-BN
training fusion's ``genstats``/``bn_finalize``/``dbn_weight``; tensors have ``set_output``,
``set_data_type``, ``set_dim``, ``set_stride``, ``set_name``, ``set_uid``.

The operations attach one way: each family of :mod:`.nodes` has one ``...Operations`` class
(:class:`~.nodes.conv.ConvOperations`, :class:`~.nodes.matmul.MatmulOperations`, ...), a
subclass of :class:`~._tensor.GraphBase` holding its methods next to its checks, shape
inference and encoding, and :class:`Graph` subclasses them all. A family uses the graph through
:class:`~._tensor.GraphBase`'s node protocol alone. This module keeps the graph itself: tensors,
pointer order, freezing, build, execute and JSON.
"""

from __future__ import annotations

import ctypes
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from .. import _config, _cuda, _layout, memory
from .. import handle as _handle
from .._types import dtype_name
from ..enums import BackendAttributeName as A
from ..enums import BackendAttributeType as T
from . import _args, _plans, _scratch, _variant
from ._args import load_plan as load_plan  # public: pycudnn.graph.load_plan
from ._key import (
    GraphKey,
    Policy,
    TensorSpec,
    device_of,
    freeze,
    main_data_type,
    node_specs,
    search_policy,
    structure,
)
from ._saved import read_saved
from ._tensor import (
    Tensor,
    alignment_of,
    as_dims,
    as_dtype,
    like_layout,
)
from ._tensor import like_strides as like_strides  # also the high level's (sdpa)
from .nodes._base import cudnn_version as cudnn_version  # also the high level's
from .nodes.bn_fusion import ConvBnOperations
from .nodes.conv import ConvOperations
from .nodes.matmul import MatmulOperations
from .nodes.norm import NormOperations
from .nodes.pointwise import POINTWISE_NAMES
from .nodes.pointwise_methods import PointwiseOperations
from .nodes.reduction import ReductionOperations
from .nodes.rng_reshape import RngReshapeOperations
from .nodes.sdpa import SdpaOperations

__all__ = ["POINTWISE_NAMES", "Graph", "Tensor", "load_plan"]


class Graph(
    ConvOperations,
    MatmulOperations,
    RngReshapeOperations,
    PointwiseOperations,
    ReductionOperations,
    NormOperations,
    SdpaOperations,
    ConvBnOperations,
):
    """A cuDNN operation graph built from Python, then planned, cached and executed.

    Parameters
    ----------
    io_data_type : dtype-like, optional
        Data type of the graph's inputs and real outputs that do not set one (``"bfloat16"``,
        ``"float16"``, ``"float32"``, a numpy/torch dtype, a ``DataType``).
    intermediate_data_type : dtype-like
        Data type of virtual (intermediate) tensors; default float32.
    compute_data_type : dtype-like
        Math precision of the operations; default float32.
    name : str
        Used in error messages.

    Examples
    --------
    A convolution with its bias and ReLU, as one graph (run on a GPU)::

        g = pycudnn.graph.Graph(io_data_type="float16")
        x = g.tensor_like(x_gpu, name="x")
        w = g.tensor_like(w_gpu, name="w")
        b = g.tensor_like(b_gpu, name="b")
        y = g.relu(g.add(g.conv_fprop(x, w, padding=1), b)).set_output(True)
        g.build()
        g.execute({x: x_gpu, w: w_gpu, b: b_gpu, y: y_gpu})
    """

    def __init__(
        self,
        io_data_type: Any = None,
        intermediate_data_type: Any = "float32",
        compute_data_type: Any = "float32",
        *,
        name: str = "graph",
    ) -> None:
        super().__init__(io_data_type, intermediate_data_type, compute_data_type, name)
        self._key: GraphKey | None = None
        self._plan: Any = None
        self._handle: Any = None
        self._label: str | None = None  # what a high-level caller's graph computes
        self._api = "pycudnn.graph"  # the function errors name
        self._order: tuple[Tensor, ...] = ()

    def __repr__(self) -> str:
        dt = [
            dtype_name(d) if d is not None else "auto"
            for d in (self.io_data_type, self.intermediate_data_type, self.compute_data_type)
        ]
        ops = [n[0] for n in self._nodes]
        shown = ", ".join(ops[:8]) + (f", ... ({len(ops)})" if len(ops) > 8 else "")
        state = "built" if self._key is not None else "not built"
        return (
            f"Graph({self.name!r}, io={dt[0]}, intermediate={dt[1]}, compute={dt[2]}, "
            f"{len(self._tensors)} tensors, ops=[{shown}], {state})"
        )

    # -- tensors -------------------------------------------------------------------------------
    def tensor(
        self,
        dim: Sequence[int],
        stride: Sequence[int] | None = None,
        data_type: Any = None,
        *,
        name: str | None = None,
        is_pass_by_value: bool = False,
        uid: int | None = None,
        alignment: int = 16,
        ragged_offset: Tensor | None = None,
    ) -> Tensor:
        """A graph input of shape *dim* (element *stride*, packed row-major by default).

        ``is_pass_by_value``: a scalar passed at execute time as a Python number (not a device
        array), e.g. a scale; its dims must all be 1. ``ragged_offset``: packed variable-length
        rows (:meth:`Tensor.set_ragged_offset`).
        """
        d = as_dims(dim, f"{self.name}: tensor dim")
        if stride is None:
            s = _layout.packed_strides(d)
        else:
            s = as_dims(stride, f"{self.name}: tensor stride")
        if len(s) != len(d):
            raise ValueError(f"{self.name}: stride {s} has {len(s)} values, dim {d} has {len(d)}")
        dt = as_dtype(data_type, f"{self.name}: data_type", allow_none=True)
        by_value = _config.parse_bool(is_pass_by_value, f"{self.name}.tensor", "is_pass_by_value")
        if by_value and math.prod(d) != 1:
            raise ValueError(f"{self.name}: a pass-by-value tensor is a scalar; dim {d} is not")
        t = self._new(name, (d, s, dt), False, by_value)
        if uid is not None:
            t.set_uid(uid)
        if alignment != 16:
            t.set_alignment(alignment)
        if ragged_offset is not None:
            t.set_ragged_offset(ragged_offset)
        return t

    def tensor_like(self, array: Any, *, name: str | None = None) -> Tensor:
        """A graph input with the shape, element strides and data type of a device array
        (torch tensor, CuPy/JAX array, ``DeviceArray``); its address's alignment is kept."""
        try:
            a = memory.asarray(array, check=False)
        except Exception as exc:
            raise TypeError(f"{self.name}: tensor_like needs a device array: {exc}") from None
        dt = as_dtype(a.dtype, f"{self.name}: tensor_like dtype")
        dim, stride = like_layout(f"{self.name}: tensor_like", a)
        t = self._new(name, (dim, stride, dt), False)
        t._alignment = alignment_of(a.ptr)
        return t

    def scalar(
        self, value: float, data_type: Any = "float32", *, name: str | None = None
    ) -> Tensor:
        """A constant scalar (a by-value tensor whose value the graph keeps and passes itself)."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{self.name}: scalar value must be a real number, got {value!r}")
        dt = as_dtype(data_type, f"{self.name}: scalar data_type")
        return self._constant(value, dt, name)

    # -- freeze, plan, execute ------------------------------------------------------------------
    def set_io_order(self, *tensors: Tensor) -> Graph:
        """Put these real tensors first, in this order, in the pointer order of ``plan.run``
        (for callers that run :attr:`plan` themselves; :meth:`execute` does not need it)."""
        for i, t in enumerate(tensors):
            self._check("set_io_order", f"tensors[{i}]", t)
        self._order = tuple(tensors)
        return self

    def validate(self) -> Graph:
        """Check what Python can before cuDNN sees the graph: every real tensor has a data
        type, outputs exist, uids are unique. Returns the graph."""
        self._freeze_tensors()
        return self

    def _freeze_tensors(self) -> tuple[tuple[TensorSpec, ...], tuple[int, ...]]:
        return freeze(self, self._order)

    def key(
        self,
        *,
        device: int | None = None,
        policy: str = "heuristics",
        heur_mode: Any = ("a", "fallback"),
        deterministic: bool | None = None,
        allow_tf32: bool | None = None,
        workspace_limit: int | None = None,
        deny_numerical_notes: Sequence[Any] = (),
        deny_behavior_notes: Sequence[Any] = (),
    ) -> GraphKey:
        """The frozen graph with its search policy (what :meth:`build` plans and caches)."""
        tensors, uids = self._freeze_tensors()
        flags, where = _config.config.snapshot(), f"{self.name}.build"
        allow_tf32 = flags.allow_tf32 if allow_tf32 is None else allow_tf32
        deterministic = flags.deterministic if deterministic is None else deterministic
        wl = flags.workspace_limit if workspace_limit is None else workspace_limit
        searched = search_policy(
            self.name, policy, heur_mode, wl, (deny_numerical_notes, deny_behavior_notes)
        )
        policy = Policy(
            dtype=int(main_data_type(tensors) if self.io_data_type is None else self.io_data_type),
            device=_cuda.current_device() if device is None else device_of(where, device),
            cudnn_version=cudnn_version(),
            allow_tf32=_config.parse_bool(allow_tf32, where, "allow_tf32"),
            deterministic=_config.parse_bool(deterministic, where, "deterministic"),
            **searched,
        )
        names = (tuple(t._name for t in self._tensors), tuple(n[1] for n in self._nodes))
        nodes = node_specs(self, tensors)
        return GraphKey(tensors, nodes, uids, policy, names=names, label=self._label, api=self._api)

    def build(
        self,
        heur_mode: Any = ("a", "fallback"),
        *,
        policy: str = "heuristics",
        deterministic: bool | None = None,
        allow_tf32: bool | None = None,
        workspace_limit: int | None = None,
        deny_numerical_notes: Sequence[Any] = (),
        deny_behavior_notes: Sequence[Any] = (),
        device: int | None = None,
    ) -> Graph:
        """Freeze the graph and find its execution plan (cached per thread by structure).

        Parameters
        ----------
        heur_mode : str or sequence of str
            cuDNN heuristics modes tried in order: ``'a'``, ``'b'``, ``'instant'``,
            ``'fallback'``.
        policy : {'heuristics', 'autotune'}
            The first engine that builds, or the fastest of those that build (timed on
            zero-filled scratch buffers).
        deterministic, allow_tf32, workspace_limit
            Engine filters; default ``pycudnn.config``'s.
        deny_numerical_notes, deny_behavior_notes
            Engines with any of these notes (``BackendNumericalNote`` /
            ``BackendBehaviorNote`` members or names, e.g. ``"RUNTIME_COMPILATION"``) are
            skipped.
        device : int, optional
            Default the current device.

        Raises
        ------
        NotSupportedError
            No engine runs the graph here; the message lists every engine tried and why.
        CudnnError
            cuDNN refused a node: the message names the node, its kind and the attribute.
        """
        key = self.key(
            device=device,
            policy=policy,
            heur_mode=heur_mode,
            deterministic=deterministic,
            allow_tf32=allow_tf32,
            workspace_limit=workspace_limit,
            deny_numerical_notes=deny_numerical_notes,
            deny_behavior_notes=deny_behavior_notes,
        )
        h = _handle.get_handle(key.device)
        _args.refuse_capture(self.name, h)
        with _cuda.DeviceContext(key.device):
            self._plan = _plans.plan(key, h)
        self._key, self._handle = key, h
        return self

    def check_support(self, **build_kw: Any) -> Graph:
        """:meth:`build` if not built yet (cuDNN's support check *is* finding an engine)."""
        if self._plan is None:
            self.build(**build_kw)
        return self

    @property
    def plan(self) -> Any:
        """The execution plan (:class:`pycudnn.graph._plans.GraphPlan`) after :meth:`build`."""
        if self._plan is None:
            raise RuntimeError(f"{self.name}: call build() first")
        return self._plan

    def describe(self) -> str:
        """The engine chosen and its workspace, e.g. ``engine 10 (workspace 0 B)``."""
        return self.plan.describe()

    def get_workspace_size(self) -> int:
        """Bytes of workspace :meth:`execute` needs (the engine's and the scratch tensors')."""
        return _scratch.workspace_layout(self.plan.workspace, self._key.scratch)[0]

    def execute(
        self, variant_pack: Mapping[Any, Any], workspace: Any = None, *, stream: Any = None
    ) -> None:
        """Run the plan on device arrays.

        Parameters
        ----------
        variant_pack : mapping
            Tensor (or its name, or its uid) -> device array, for every real input and output;
            by-value tensors (not :meth:`scalar` constants) -> a Python number.
        workspace : device array, optional
            At least :meth:`get_workspace_size` bytes; default the handle's workspace.
        stream : optional
            A CUDA stream (torch/CuPy/cuda.core stream or handle); default the handle's.

        Raises
        ------
        KeyError
            A real tensor has no array in *variant_pack* (the message names it).
        ValueError, TypeError
            An array's shape, strides, dtype or device differs from its tensor's.

        Notes
        -----
        A repeated call with the same signature (the dict's keys in order; each torch tensor's
        or DeviceArray's shape, strides, dtype, device, alignment) skips the per-array checks;
        scalars, overlaps, workspace and stream are still read each call. What is cached:
        :mod:`pycudnn.graph._variant` and docs/graph.md, "Host cost".
        """
        plan, key = self.plan, self._key
        ptrs, _keepalive = self._pointers(variant_pack)
        scratch = _variant.scratch(self)
        h = self._handle
        if workspace is not None:  # checked before the first CUDA call, as stream is
            total, offsets = _scratch.workspace_layout(plan.workspace, scratch)
            wa = _args.workspace_array(self.name, workspace, total, key.device)
        if stream is not None:
            _args.stream_arg(self.name, stream)
        with _cuda.DeviceContext(key.device):
            if stream is not None:
                h.set_stream(stream)
            if workspace is None:
                plan.launch(ptrs, scratch)
                return
            _scratch.fill_scratch(scratch, ptrs, wa.ptr, offsets, h.stream)
            plan.run(*ptrs, wa.ptr if plan.workspace else 0)

    def _pointers(self, variant_pack: Mapping[Any, Any]) -> tuple[list[int], list[Any]]:
        """``(pointers in the key's uid order, host scalars to keep alive)``: the checked
        variant pack (:func:`._variant.pointers`; bound to its signature after one call)."""
        return _variant.pointers(self, variant_pack)

    def constant_pointers(self) -> tuple[int, ...]:
        """Host addresses of the :meth:`scalar` constants, in a call's pointer order (after the
        real tensors); for callers that run :attr:`plan` themselves."""
        key = self._key if self._key is not None else self.key(device=0)
        by_uid = {spec.uid: t for t, spec in zip(self._tensors, key.tensors, strict=True)}
        out = []
        for uid in key.uids:
            t = by_uid[uid]
            if t._by_value:
                if t._value is None:
                    raise ValueError(f"{self.name}: by-value tensor {t._name!r} has no constant")
                out.append(ctypes.addressof(t._value))
        return tuple(out)

    def _lookup(self, k: Any) -> Tensor:
        if isinstance(k, Tensor):
            if k._graph is not self:
                raise ValueError(f"{self.name}: tensor {k._name!r} belongs to another graph")
            return k
        if isinstance(k, str):
            found = [t for t in self._tensors if t._name == k]
            if len(found) != 1:
                which = "no" if not found else "more than one"
                raise KeyError(f"{self.name}: {which} tensor named {k!r}")
            return found[0]
        if isinstance(k, int) and not isinstance(k, bool):
            for t, spec in zip(self._tensors, self._key.tensors, strict=True):
                if spec.uid == k:
                    return t
            raise KeyError(f"{self.name}: no tensor with uid {k}")
        raise TypeError(f"{self.name}: variant_pack keys are Tensors, names or uids; got {k!r}")

    # -- saving plans ----------------------------------------------------------------------------
    def to_json(self) -> str:
        """The graph's structure (tensors, nodes, data types) as JSON: no GPU needed."""
        return json.dumps(structure(self, self._freeze_tensors()[0]), sort_keys=True)

    def serialize(self) -> str:
        """The built plan as JSON (cuDNN's plan representation and this graph's structure), for
        :meth:`deserialize` in a later process: an autotuned choice survives a restart."""
        plan = self.plan
        text = plan.plan.get(A.EXECUTION_PLAN_JSON_REPRESENTATION, T.CHAR)[0]
        doc = {
            "graph": json.loads(self.to_json()),
            "plan": text,
            "cudnn_version": self._key.cudnn_version,
            "engine": plan.engine.index,
        }
        return json.dumps(doc)

    def deserialize(self, data: str, *, device: int | None = None) -> Graph:
        """Load a plan saved by :meth:`serialize` for this same graph (no engine search).

        Raises
        ------
        ValueError
            *data* was saved for another graph structure or another cuDNN version.
        """
        saved = read_saved(self.name, data, json.loads(self.to_json()), cudnn_version())
        key = self.key(device=device)
        h = _handle.get_handle(key.device)
        with _cuda.DeviceContext(key.device):
            gp = load_plan(saved["plan"], h, key.uids, engine=int(saved.get("engine", -1)))
        _plans.remember(key, gp)
        self._key, self._handle, self._plan = key, h, gp
        return self
