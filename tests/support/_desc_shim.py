"""Counting shim over the C layer, for tests that must prove "no C call was made".

Every C call of the descriptor layer goes through ``errors.checked`` (looked up at each call,
never cached by the layer) or a raw ``_lib`` function (finalizers). The shim wraps both: it
patches ``errors.checked``, and replaces every bound ``_lib`` function with a counting wrapper.
"""

from __future__ import annotations

import contextlib

import pytest

from pycudnn import _lib, errors


class CCalls:
    """Names of the C functions called since the last :meth:`reset`."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def reset(self) -> None:
        self.calls.clear()

    def __len__(self) -> int:
        return len(self.calls)


@contextlib.contextmanager
def counting_c_calls(monkeypatch: pytest.MonkeyPatch):
    rec = CCalls()
    real_checked = errors.checked

    def wrap(name, fn):
        def counted(*args):
            rec.calls.append(name)
            return fn(*args)

        counted.__name__ = name
        return counted

    monkeypatch.setattr(errors, "checked", lambda name, **kw: wrap(name, real_checked(name, **kw)))
    for name in _lib.PROTOTYPES:
        monkeypatch.setattr(_lib, name, wrap(name, getattr(_lib, name)), raising=False)
    yield rec
