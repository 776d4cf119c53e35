"""``close()`` racing a use of the same object from another thread (issue 16).

The rule (``pycudnn/_resource.py``): no lock on the use path; ``close()`` marks the object closed
first, and destroys the C object only when nobody holds its typed handle -- a method or
``pycudnn.api`` call in flight, a backend descriptor that has it as an attribute -- deferring
the destroy otherwise. Uses that start after ``close()`` raise ``ValueError``. Raw ``.ptr`` ints
are not tracked (single owner).
"""

from __future__ import annotations

import ctypes
import json
import os
import pathlib
import subprocess
import sys

import pytest

from pycudnn import _resource, errors
from pycudnn.descriptors import BackendDescriptor, TensorDescriptor

CHILD = pathlib.Path(__file__).resolve().parents[1] / "support" / "_close_race_child.py"


def test_the_refcount_rule_is_calibrated_here():
    assert _resource._DEFER  # this interpreter tells a lone handle from a shared one


def test_close_defers_while_a_call_holds_the_handle():
    t = TensorDescriptor((2, 3, 4, 5))
    before = TensorDescriptor.live_count()
    h = t._h()  # what a method holds during its C call
    t.close()
    assert t.closed
    with pytest.raises(ValueError, match="closed"):
        _ = t.shape
    assert TensorDescriptor.live_count() == before  # not destroyed yet
    size = ctypes.c_size_t()
    raw = errors.checked("cudnnGetTensorSizeInBytes", warn=False)
    raw(h, ctypes.byref(size))  # the C object is still valid for the call in flight
    assert size.value == 480
    del h
    assert TensorDescriptor.live_count() == before - 1  # destroyed once let go


def test_a_child_closed_first_lives_while_its_parent_refers_to_it():
    x = BackendDescriptor("tensor")
    op = BackendDescriptor("operation_pointwise")
    op.set("OPERATION_POINTWISE_XDESC", "BACKEND_DESCRIPTOR", x)
    n = BackendDescriptor.live_count()
    x.close()
    assert x.closed and BackendDescriptor.live_count() == n  # op still refers to it
    op.close()
    assert BackendDescriptor.live_count() == n - 2


def test_unheld_close_is_immediate():
    t = TensorDescriptor((1, 1, 1))
    n = TensorDescriptor.live_count()
    t.close()
    assert TensorDescriptor.live_count() == n - 1
    assert not _resource._graveyard


@pytest.mark.slow
def test_close_racing_uses_from_other_threads_in_child_process():
    rounds = int(os.environ.get("PYCUDNN_RACE_ROUNDS", "300"))
    proc = subprocess.run(
        [sys.executable, str(CHILD), str(rounds), "4", "20000"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    # a negative return code is a signal: the child crashed (the SIGSEGV)
    assert proc.returncode == 0, f"rc={proc.returncode}\n{proc.stderr[-3000:]}"
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    print(
        f"\nclose race: {out['rounds']} rounds x {out['threads']} threads, {out['uses']} uses "
        f"({out['ok']} ok, {out['closed']} refused as closed), wrong values "
        f"{out['wrong_values']}; leak phase {out['leak']}"
    )
    assert out["wrong_values"] == 0 and out["other_errors"] == 0, out
    assert out["closed"] > 0 and out["ok"] > 0  # both outcomes were reached
    assert out["live_after"] == {} and out["live_after_leak"] == {}, out
    assert out["leak"]["rss_growth_kib"] < 2048, out["leak"]
