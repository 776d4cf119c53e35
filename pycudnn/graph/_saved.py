"""Reading a plan saved by :meth:`Graph.serialize`: every field checked, each refusal naming
the graph, the field and what was expected (not a raw ``JSONDecodeError`` or ``KeyError``)."""

from __future__ import annotations

import json
from typing import Any

from ._key import unnamed

__all__ = ["read_saved"]


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def read_saved(graph: str, data: Any, structure: Any, version: int) -> dict[str, Any]:
    """The saved plan *data* (the JSON text of ``serialize()``) as a dict, checked against
    this graph's *structure* (unnamed) and the loaded cuDNN *version*."""
    where = f"{graph}.deserialize"
    if isinstance(data, bytes | bytearray):
        try:
            data = data.decode()
        except UnicodeDecodeError as exc:
            raise ValueError(f"{where}: data is not UTF-8 text: {exc}") from None
    if not isinstance(data, str):
        raise TypeError(
            f"{where}: data must be the str that serialize() returned, got {type(data).__name__}"
        )
    try:
        saved = json.loads(data)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: data is not the JSON serialize() writes: {exc}") from None
    if not isinstance(saved, dict):
        raise ValueError(
            f"{where}: data must be the JSON object serialize() writes, got a "
            f"{type(saved).__name__}"
        )
    for field, kind, what in (
        ("graph", dict, "the graph's structure"),
        ("cudnn_version", int, "an int (cudnnGetVersion())"),
        ("plan", str, "cuDNN's JSON plan (a str)"),
    ):
        value = saved.get(field)
        if field not in saved:
            raise ValueError(f"{where}: data has no {field!r} (expected {what})")
        if isinstance(value, bool) or not isinstance(value, kind):
            raise TypeError(f"{where}: {field!r} must be {what}, got {_describe(value)}")
    engine = saved.get("engine", -1)
    if isinstance(engine, bool) or not isinstance(engine, int):
        raise TypeError(f"{where}: 'engine' must be an int, got {_describe(engine)}")
    try:
        same = unnamed(saved["graph"]) == unnamed(structure)
    except (AttributeError, TypeError):  # tensors or nodes that are not objects
        same = False
    if not same:
        raise ValueError(f"{graph}: the saved plan is for another graph structure")
    if saved["cudnn_version"] != version:
        raise ValueError(
            f"{graph}: the plan was saved with cuDNN {saved['cudnn_version']}, this is {version}"
        )
    return saved
