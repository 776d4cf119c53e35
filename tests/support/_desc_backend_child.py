"""Child process: backend finalize and read-back, run with the stub ``libcuda.so.1`` (built by
``test_backend_descriptors.py``) on ``LD_LIBRARY_PATH``, which lets cuDNN's engine library load
with no GPU. Prints one JSON line with the values read back; the parent asserts on them.
"""

from __future__ import annotations

import fractions
import json

from pycudnn import errors
from pycudnn.descriptors import BackendDescriptor as B


def attempt(fn):
    try:
        return fn()
    except errors.CudnnError as exc:
        return {"error": type(exc).__name__, "status": int(exc.status)}


def main() -> None:
    out = {}
    x = B.tensor((1, 8, 16, 16), dtype="float16", uid=1, alignment=16)
    w = B.tensor((8, 8, 3, 3), (72, 1, 24, 8), dtype="float16", uid=2)
    y = B.tensor((1, 8, 16, 16), dtype="float16", uid=3, is_virtual=True)
    conv = B.convolution((1, 1), None, 1, (1, 1), compute_type="float32")
    op = B.operation_convolution_forward(x, w, y, conv, alpha=0.5, beta=0.25)
    b = B.tensor((1, 8, 1, 1), dtype="float32", uid=4)
    z = B.tensor((1, 8, 16, 16), dtype="float32", uid=5)
    pw = B.pointwise("add", "float32")
    add = B.operation_pointwise(pw, y, z, b, alpha1=1.0, alpha2=2.0)
    graph = B.operation_graph([op, add])

    out["finalized"] = [d.is_finalized for d in (x, w, y, conv, op, pw, add, graph)]
    out["x_dims"] = attempt(lambda: x.get("TENSOR_DIMENSIONS", "INT64"))
    out["x_strides"] = attempt(lambda: x.get("TENSOR_STRIDES", "INT64", 4))
    out["w_strides"] = attempt(lambda: w.get("TENSOR_STRIDES", "INT64"))
    out["x_dtype"] = attempt(lambda: [int(v) for v in x.get("TENSOR_DATA_TYPE", "DATA_TYPE", 1)])
    out["x_uid"] = attempt(lambda: x.get("TENSOR_UNIQUE_ID", "INT64", 1))
    out["x_align"] = attempt(lambda: x.get("TENSOR_BYTE_ALIGNMENT", "INT64", 1))
    out["y_virtual"] = attempt(lambda: y.get("TENSOR_IS_VIRTUAL", "BOOLEAN", 1))
    out["conv_dilations"] = attempt(lambda: conv.get("CONVOLUTION_DILATIONS", "INT64"))
    out["conv_strides"] = attempt(lambda: conv.get("CONVOLUTION_FILTER_STRIDES", "INT64"))
    out["conv_pre"] = attempt(lambda: conv.get("CONVOLUTION_PRE_PADDINGS", "INT64"))
    out["conv_dims"] = attempt(lambda: conv.get("CONVOLUTION_SPATIAL_DIMS", "INT64", 1))
    out["conv_comp"] = attempt(
        lambda: [int(v) for v in conv.get("CONVOLUTION_COMP_TYPE", "DATA_TYPE", 1)]
    )
    out["op_alpha"] = attempt(lambda: op.get("OPERATION_CONVOLUTION_FORWARD_ALPHA", "DOUBLE", 1))
    out["op_beta"] = attempt(lambda: op.get("OPERATION_CONVOLUTION_FORWARD_BETA", "DOUBLE", 1))
    xs = op.get(
        "OPERATION_CONVOLUTION_FORWARD_X", "BACKEND_DESCRIPTOR", 1, descriptor_type="tensor"
    )
    out["op_x_dims"] = xs[0].get("TENSOR_DIMENSIONS", "INT64")
    out["op_x_uid"] = xs[0].get("TENSOR_UNIQUE_ID", "INT64", 1)
    out["graph_engines"] = attempt(
        lambda: graph.get("OPERATIONGRAPH_ENGINE_GLOBAL_COUNT", "INT64", 1)
    )
    # wrong type on read-back, and any set after finalize: categorised errors
    out["wrong_type_get"] = attempt(lambda: x.get("TENSOR_DIMENSIONS", "DOUBLE", 4))
    out["set_after_finalize"] = attempt(lambda: x.set("TENSOR_UNIQUE_ID", "INT64", 9))
    # heuristics and engine up to what works without a device
    heur = B("ENGINEHEUR_DESCRIPTOR")
    heur.set("ENGINEHEUR_OPERATION_GRAPH", "BACKEND_DESCRIPTOR", graph)
    heur.set("ENGINEHEUR_MODE", "HEUR_MODE", "MODE_INSTANT")
    heur.finalize()
    out["heur_results"] = len(
        heur.get("ENGINEHEUR_RESULTS", "BACKEND_DESCRIPTOR", 4, descriptor_type="ENGINECFG")
    )
    engine = B("ENGINE_DESCRIPTOR")
    engine.set("ENGINE_OPERATION_GRAPH", "BACKEND_DESCRIPTOR", graph)
    engine.set("ENGINE_GLOBAL_INDEX", "INT64", 0)
    engine.finalize()
    out["engine_index"] = attempt(lambda: engine.get("ENGINE_GLOBAL_INDEX", "INT64", 1))
    # FRACTION and FLOAT values round-trip through a resample / pointwise-less descriptor
    rs = B("RESAMPLE_DESCRIPTOR")
    rs.set("RESAMPLE_MODE", "RESAMPLE_MODE", "MAXPOOL")
    rs.set("RESAMPLE_COMP_TYPE", "DATA_TYPE", "float32")
    rs.set("RESAMPLE_SPATIAL_DIMS", "INT64", 2)
    rs.set("RESAMPLE_WINDOW_DIMS", "FRACTION", [fractions.Fraction(2), (3, 1)])
    rs.set("RESAMPLE_STRIDES", "FRACTION", [2, 2])
    rs.set("RESAMPLE_PRE_PADDINGS", "FRACTION", [0, 0])
    rs.set("RESAMPLE_POST_PADDINGS", "FRACTION", [0, 0])
    rs.set("RESAMPLE_NAN_PROPAGATION", "NAN_PROPOGATION", "PROPAGATE_NAN")
    rs.set("RESAMPLE_PADDING_MODE", "PADDING_MODE", "NEG_INF_PAD")
    out["resample_finalize"] = attempt(lambda: rs.finalize().is_finalized)
    if rs.is_finalized:
        out["resample_window"] = [str(f) for f in rs.get("RESAMPLE_WINDOW_DIMS", "FRACTION", 2)]
    for d in (x, w, y, conv, op, b, z, pw, add, graph, heur, engine, rs, *xs):
        d.close()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
