"""RAII base for every object that owns a cuDNN C handle: the descriptors and the ``Handle``.

Design decisions:

* **Release with ``weakref.finalize``, never ``__del__``.** The finalizer holds only the raw
  pointer value, the destroy callable (by default the early-bound raw ``cudnnDestroy*``
  function; a subclass whose destroy needs more, like the ``Handle`` that must make its device
  current, supplies its own through :meth:`Resource._destroyer`) and the class's live counter --
  never the Python object -- so reference cycles cannot keep a handle alive or resurrect it.
* **The finalizer is armed right after ``cudnnCreate*``** (in :meth:`Resource._adopt`), before any
  ``cudnnSet*``: a setter that raises cannot leak the C object.
* **``close()`` is idempotent and explicit**; use after close raises ``ValueError`` *without
  calling C*; ``with`` closes on exit and refuses an already closed object.
* **Ownership is explicit**: ``ptr`` is the address as an ``int``; ``from_ptr(ptr, owner=...)``
  wraps a C object made elsewhere without ever destroying it (keeping *owner* alive);
  ``detach()`` hands the address out and disarms the finalizer.
* **Children keep their parents alive** through ``_refs`` (strong references to handles, device
  buffers, other descriptors); parents never refer to children.
* **Interpreter shutdown**: a finalizer run by the garbage collector returns early once
  ``sys.is_finalizing()`` (the library may already be unloaded); host-only descriptors set
  ``atexit=False`` because the OS reclaims their memory, while the ``Handle`` (device state)
  keeps ``atexit=True`` and is destroyed by the ``atexit`` pass, before finalization begins.
  An explicit ``close()`` never skips.
* **``close()`` racing a use from another thread cannot free memory in use.** The typed ctypes
  handle (``_as_parameter_``) is what every C call receives: the object's own methods hold it in a
  local (:meth:`Resource._h`), ``pycudnn.api`` calls hold it in ctypes' converted arguments, and a
  backend descriptor holds the handles of the descriptors set as its attributes. ``close()``
  first marks the object closed (any later use raises ``ValueError`` without calling C), then
  destroys the C object at once if nobody else holds that handle (its reference count), and
  otherwise buries it: the destroy happens at the next ``close()`` (or live count) after the last
  holder let go -- a call in flight returned, the parent descriptor was closed. No lock is taken
  on the use path, so it costs nothing there. The one rule left to the user: a raw address
  (``.ptr`` as an ``int``) is not tracked, so an object whose address was handed out as an int
  must not be closed while that int is in use (single owner). A buried object counts as live
  until it is really destroyed.
* **Live counters**: every class counts the C objects it owns and has not released yet
  (``Cls.live_count()``); wrappers from ``from_ptr`` own nothing and are not counted. Leak tests
  read them.

This module may import ``_lib`` (types, raw destroy functions) and ``errors`` only.
"""

from __future__ import annotations

import ctypes
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any, ClassVar, Self

from . import errors
from ._generated import lib as _lib

__all__ = ["Resource", "live_counts"]


class _LiveCounter:
    """A thread-safe counter of owned, not yet released C objects of one class."""

    __slots__ = ("_lock", "value")

    def __init__(self) -> None:
        self.value = 0
        self._lock = threading.Lock()

    def add(self, n: int) -> None:
        with self._lock:
            self.value += n


_COUNTERS: dict[str, _LiveCounter] = {}


def live_counts() -> dict[str, int]:
    """Owned, not yet released C objects per wrapper class name (non-zero entries only)."""
    _sweep()
    return {name: c.value for name, c in _COUNTERS.items() if c.value}


# -- deferred destroys: closed objects whose typed handle was still held ------------------------
_graveyard: list[tuple[Any, Callable[[Any], int], int, _LiveCounter]] = []
_graveyard_lock = threading.Lock()


def _refs(h: Any) -> int:
    return sys.getrefcount(h)


def _probe() -> int:
    h = ctypes.c_void_p()
    return _refs(h)


# what _refs reports for an object held by nothing but its caller's one local variable, in this
# interpreter (CPython 3.11: the local, the parameter and getrefcount's argument)
_ALONE = _probe()


def _alone(h: Any) -> bool:
    """True when only the caller's one local reference holds *h* (nothing else does)."""
    return sys.getrefcount(h) <= _ALONE  # same shape as _probe -> _refs


def _calibrated() -> bool:
    """Whether :func:`_alone` tells a lone handle from a shared one here (else never defer)."""
    h = ctypes.c_void_p()
    if not _alone(h):
        return False
    held = [h]
    shared = not _alone(h)
    del held
    return shared and _alone(h)


_DEFER = _calibrated()


def _bury(h: Any, destroy: Callable[[Any], int], ptr: int, counter: _LiveCounter) -> None:
    with _graveyard_lock:
        _graveyard.append((h, destroy, ptr, counter))


def _sweep() -> None:
    """Destroy the buried objects nobody holds any more (cheap when there are none)."""
    if not _graveyard:
        return
    with _graveyard_lock:
        entries = _graveyard[:]
        _graveyard.clear()
    keep = []
    while entries:
        entry = entries.pop()
        h = entry[0]
        entry = (None, *entry[1:])
        if _alone(h):
            del h
            _release(entry[1], entry[2], entry[3])
        else:
            keep.append((h, *entry[1:]))
    if keep:
        with _graveyard_lock:
            _graveyard.extend(keep)


def _release(
    destroy: Callable[[Any], int],
    ptr: int,
    counter: _LiveCounter,
    _is_finalizing: Callable[[], bool] = sys.is_finalizing,
) -> None:
    """Finalizer body when the garbage collector (not ``close()``) releases an object."""
    if _is_finalizing():
        return  # the interpreter (and maybe libcudnn) is being torn down: let the OS reclaim
    try:
        destroy(ptr)
    except Exception:  # raising inside a finalizer helps no one
        pass
    counter.add(-1)


class _Dead:
    """``_as_parameter_`` of a closed object: ctypes reads it and gets this ValueError."""

    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    @property
    def _as_parameter_(self) -> Any:
        raise ValueError(f"{self._name} is closed")


class Resource:
    """Base of the RAII wrappers around one cuDNN C object.

    Subclasses set the class attributes ``_c_type`` (the ``_lib`` handle type) and
    ``_destroy_name`` (the C destroy function, by name for error messages and the default
    :meth:`_destroyer`); their constructors call :meth:`_adopt` right after the C create call
    succeeded.

    Attributes
    ----------
    _refs : list
        Strong references this object keeps alive (handles, buffers, parent descriptors).
    """

    _c_type: ClassVar[type[ctypes.c_void_p]] = ctypes.c_void_p
    _destroy_name: ClassVar[str] = ""
    _counter: ClassVar[_LiveCounter]
    # host-only C structs: the OS reclaims them at exit, so no finalizer runs at exit
    _atexit: ClassVar[bool] = False

    __slots__ = ("__weakref__", "_as_parameter_", "_finalizer", "_owned", "_ptr", "_refs")

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._counter = _COUNTERS.setdefault(cls.__qualname__, _LiveCounter())

    # -- construction ----------------------------------------------------------------------------
    def _adopt(self, handle: ctypes.c_void_p, *, owned: bool = True, owner: Any = None) -> None:
        """Take *handle* (a ``_c_type`` instance just filled by ``cudnnCreate*``) and arm the
        finalizer. Must run before anything that can raise."""
        ptr = handle.value or 0
        self._ptr = ptr
        self._as_parameter_ = handle
        self._refs: list[Any] = [] if owner is None else [owner]
        self._owned = owned
        if owned:
            destroy = self._destroyer()
            self._finalizer = weakref.finalize(self, _release, destroy, ptr, self._counter)
            self._finalizer.atexit = self._atexit
            self._counter.add(1)
        else:
            self._finalizer = None

    def _destroyer(self) -> Callable[[int], Any]:
        """The callable that destroys the C object, given its address; returns a status.

        By default the early-bound raw ``_lib`` function named by ``_destroy_name``. A subclass
        may return another callable (the ``Handle``'s makes its device current first); it is
        stored in the finalizer, so it must hold values only, never ``self``, and not raise.
        """
        return getattr(_lib, self._destroy_name)

    @classmethod
    def _new_handle(cls) -> ctypes.c_void_p:
        """An empty handle of this class's C type, to pass by reference to ``cudnnCreate*``."""
        return cls._c_type()

    @classmethod
    def from_ptr(cls, ptr: int, *, owner: Any = None) -> Self:
        """Wrap the C object at *ptr*, made elsewhere, without taking ownership.

        The wrapper never destroys it; *owner* (any object) is kept alive as long as the wrapper.
        Properties read back through cuDNN, so they describe the object as it really is.

        Raises
        ------
        TypeError
            *ptr* is not an int.
        ValueError
            *ptr* is 0 (NULL).
        """
        if isinstance(ptr, bool) or not isinstance(ptr, int):
            raise TypeError(f"ptr must be an int address, got {type(ptr).__name__}")
        if ptr <= 0 or ptr >= 1 << 64:
            raise ValueError(f"ptr={ptr!r} is not a valid (non-NULL, 64-bit) address")
        self = cls.__new__(cls)
        self._adopt(cls._c_type(ptr), owned=False, owner=owner)
        self._init_from_ptr()
        return self

    def _init_from_ptr(self) -> None:
        """Hook for subclasses that cache Python-side state (set it to "unknown")."""

    # -- state -----------------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        """True after :meth:`close` or :meth:`detach`."""
        return self._ptr == 0

    @property
    def owned(self) -> bool:
        """True when this wrapper destroys the C object (False for ``from_ptr`` wrappers)."""
        return self._owned and self._ptr != 0

    @property
    def ptr(self) -> int:
        """The C object's address.

        Raises
        ------
        ValueError
            The object is closed.
        """
        if not self._ptr:
            self._raise_closed()
        return self._ptr

    def _raise_closed(self) -> None:
        raise ValueError(f"{type(self).__name__} is closed")

    def _h(self) -> ctypes.c_void_p:
        """The typed handle for a C call; raises ``ValueError`` when closed (no C call made).

        Keep the returned handle in a local for the duration of the C call: holding it is what
        makes a concurrent :meth:`close` defer the destroy.
        """
        h = self._as_parameter_  # read first: a close() after this sees our reference
        if h.__class__ is _Dead:
            self._raise_closed()
        if not self._owned and self._refs:
            # a borrowed wrapper dies with an owner that was closed explicitly (no dangling use)
            owner = self._refs[0]
            if isinstance(owner, Resource) and not owner._ptr:
                self._mark_closed()
                self._raise_closed()
        return h

    @classmethod
    def live_count(cls) -> int:
        """How many C objects of exactly this class are owned and not yet released."""
        _sweep()
        return cls._counter.value

    # -- release ---------------------------------------------------------------------------------
    def close(self) -> None:
        """Destroy the C object now (if owned). Idempotent; never skipped at shutdown.

        Safe against a use of the same object from another thread: the object is marked closed
        first (a use that starts later raises ``ValueError``), and if a C call in flight (or a
        backend descriptor that has it as an attribute) still holds its typed handle, the destroy
        is deferred until that holder lets go; the C object is never freed while in use.

        Raises
        ------
        CudnnError
            cuDNN's destroy function failed (the object counts as closed regardless).
        """
        if _graveyard:
            _sweep()
        h = self._as_parameter_
        ptr = self._ptr
        if not ptr:
            return
        self._mark_closed()
        fin = self._finalizer
        self._finalizer = None
        if fin is None:
            return
        info = fin.detach()
        if info is None:  # already run by the GC (cannot happen while self is alive)
            return
        _obj, _func, (destroy, _ptr, counter), _kw = info
        if _DEFER and not _alone(h):
            # held by a call in flight or a parent descriptor: destroyed once they let go
            _bury(h, destroy, ptr, counter)
            return
        del h
        counter.add(-1)
        errors.check(destroy(ptr), self._destroy_name)

    def detach(self) -> int:
        """Give up ownership: disarm the finalizer and return the address.

        The caller must destroy the C object. Afterwards this wrapper is closed.
        """
        ptr = self.ptr
        fin = self._finalizer
        self._finalizer = None
        if fin is not None and fin.detach() is not None:
            self._counter.add(-1)
        self._mark_closed()
        return ptr

    def _mark_closed(self) -> None:
        self._ptr = 0
        self._as_parameter_ = _Dead(type(self).__name__)
        self._refs = []

    def __enter__(self) -> Self:
        if not self._ptr:
            self._raise_closed()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- repr ------------------------------------------------------------------------------------
    def _repr_fields(self) -> str:
        return f"ptr={self._ptr:#x}"

    def __repr__(self) -> str:
        name = type(self).__name__
        if not self._ptr:
            return f"<{name} (closed)>"
        try:
            fields = self._repr_fields()
        except Exception as exc:  # repr must not raise (e.g. unset descriptor)
            fields = f"ptr={self._ptr:#x}, <unreadable: {type(exc).__name__}>"
        tail = "" if self._owned else ", borrowed"
        return f"{name}({fields}{tail})"
