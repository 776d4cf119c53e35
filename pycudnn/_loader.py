"""Find and dlopen libcudnn, lazily, once, under a lock.

Nothing here runs at import: ``import pycudnn`` must work on a machine without cuDNN, and must not
load a second cuDNN into a process that already has one (torch's, say). The search order is

1. ``PYCUDNN_LIBRARY=/path/to/libcudnn.so.9`` - an explicit override; if it is set and cannot be
   loaded that is an error (falling back would silently load a different cuDNN);
2. ``cuda.pathfinder.load_nvidia_dynamic_lib("cudnn")`` - a copy already loaded in this process,
   the ``nvidia-cudnn-cu12``/``-cu13`` wheels, conda, ``CUDNN_PATH``, then the system;
3. the OS loader (``libcudnn.so.9``: ``LD_LIBRARY_PATH``, ldconfig).

The result is a frozen :class:`LoadedLibrary` with the absolute path and how it was found.

**The version gate.** :func:`load` -- what every entry point goes through first (``pycudnn.lib``
binds its functions with it, ``pycudnn.api``/descriptors/handles/the high level call those) --
checks the file once before handing it out: a file that does not export ``cudnnGetVersion`` is not
cuDNN (``LibraryNotFoundError``, always), and a cuDNN of another major version than the headers
the bindings were generated from raises ``VersionMismatchError`` (every call, until fixed) unless
``PYCUDNN_SKIP_VERSION_CHECK=1``. Diagnostics that must describe a bad library
(``runtime_version``, ``pycudnn.version(raises=False)``, ``python -m pycudnn``) use
:func:`load_unchecked`. The sub-library checks stay in ``pycudnn.version()``: they load every
sub-library, which first use must not pay for.

This module uses the standard library only (``cuda.pathfinder`` is imported lazily).
"""

from __future__ import annotations

import ctypes
import os
import threading
from dataclasses import dataclass

SONAME = "libcudnn.so.9"
ENV_OVERRIDE = "PYCUDNN_LIBRARY"
INSTALL_HINT = (
    'Install cuDNN 9 with `pip install "nvidia-cudnn-cu12==9.*"` (CUDA 12 and 13 drivers) or '
    '`pip install "nvidia-cudnn-cu13==9.*"` (CUDA 13 drivers), '
    f"or point {ENV_OVERRIDE} at a libcudnn.so.9."
)


class LibraryNotFoundError(ImportError):
    """libcudnn could not be loaded; the message lists every place that was tried."""


class SymbolNotFoundError(AttributeError):
    """The loaded libcudnn lacks a function of the headers the bindings were generated from."""


class VersionMismatchError(RuntimeError):
    """The loaded libcudnn cannot be used with these bindings (different major version, or a
    sub-library that does not match the dispatcher)."""


SKIP_ENV = "PYCUDNN_SKIP_VERSION_CHECK"
#: the cuDNN major version the bindings need (that of the headers they were generated from, as in
#: the soname; a test checks it equals ``pycudnn.lib.CUDNN_MAJOR``)
REQUIRED_MAJOR = int(SONAME.rsplit(".", 1)[1])


@dataclass(frozen=True)
class LoadedLibrary:
    """The libcudnn this process uses."""

    path: str
    """Absolute path of the loaded ``libcudnn.so.9``."""
    found_via: str
    """How it was found: ``PYCUDNN_LIBRARY``, ``cuda.pathfinder (...)`` or ``system loader``."""
    cdll: ctypes.CDLL


_lock = threading.Lock()
_loaded: LoadedLibrary | None = None  # what was found (gate not applied)
_usable: LoadedLibrary | None = None  # the same once the gate passed: load()'s fast path


def _path_of(cdll: ctypes.CDLL, symbol: str = "cudnnGetVersion") -> str:
    """Absolute path of the file that defines *symbol*, via ``dladdr``."""

    class DlInfo(ctypes.Structure):
        _fields_ = (
            ("dli_fname", ctypes.c_char_p),
            ("dli_fbase", ctypes.c_void_p),
            ("dli_sname", ctypes.c_char_p),
            ("dli_saddr", ctypes.c_void_p),
        )

    try:
        libdl = ctypes.CDLL(None)
        dladdr = libdl.dladdr
        dladdr.argtypes = (ctypes.c_void_p, ctypes.POINTER(DlInfo))
        info = DlInfo()
        addr = ctypes.cast(getattr(cdll, symbol), ctypes.c_void_p)
        if dladdr(addr, ctypes.byref(info)) and info.dli_fname:
            return os.path.realpath(info.dli_fname.decode())
    except (AttributeError, OSError):
        pass
    return cdll._name


def _try_override(tried: list[str]) -> LoadedLibrary | None:
    path = os.environ.get(ENV_OVERRIDE)
    if not path:
        tried.append(f"{ENV_OVERRIDE}: not set")
        return None
    # Open the real file: libcudnn finds its sub-libraries through RUNPATH $ORIGIN, which glibc
    # takes from the path as given, so a symlink elsewhere would make cuDNN abort the process.
    try:
        cdll = ctypes.CDLL(os.path.realpath(path))
    except OSError as exc:
        raise LibraryNotFoundError(
            f"{ENV_OVERRIDE}={path!r} could not be loaded: {exc}. Fix or unset {ENV_OVERRIDE}."
        ) from exc
    return LoadedLibrary(_path_of(cdll), ENV_OVERRIDE, cdll)


def _try_pathfinder(tried: list[str]) -> LoadedLibrary | None:
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib
    except ImportError as exc:
        tried.append(f"cuda.pathfinder: not importable ({exc})")
        return None
    try:
        dl = load_nvidia_dynamic_lib("cudnn")
    except Exception as exc:  # pathfinder raises several types; each means "not found there"
        text = " ".join(str(exc).split())
        if "cudnn" not in text.lower():
            # pathfinder loads cuDNN's dependencies first: without any CUDA wheel its error is
            # about cuBLAS (libcublasLt), which is not what is missing first
            text = f"no cuDNN found (the search stopped at a library cuDNN needs: {text})"
        tried.append(f"cuda.pathfinder.load_nvidia_dynamic_lib('cudnn'): {text}")
        return None
    via = "already loaded in process" if dl.was_already_loaded_from_elsewhere else None
    via = via or getattr(dl, "found_via", None) or "search"
    cdll = ctypes.CDLL(dl.abs_path) if dl.abs_path else ctypes.CDLL(SONAME)
    return LoadedLibrary(_path_of(cdll), f"cuda.pathfinder ({via})", cdll)


def _try_system(tried: list[str]) -> LoadedLibrary | None:
    try:
        cdll = ctypes.CDLL(SONAME)
    except OSError as exc:
        tried.append(f"system loader ({SONAME}): {exc}")
        return None
    return LoadedLibrary(_path_of(cdll), "system loader", cdll)


def load() -> LoadedLibrary:
    """Load libcudnn on first call (thread-safe), apply the version gate, and return it.

    Raises
    ------
    LibraryNotFoundError
        No libcudnn could be loaded, or the file loaded is not cuDNN.
    VersionMismatchError
        The library is cuDNN of another major version than the bindings' headers (raised on
        every call) and ``PYCUDNN_SKIP_VERSION_CHECK=1`` is not set.
    """
    lib = _usable
    if lib is not None:
        return lib
    return _gate(load_unchecked())


def _gate(lib: LoadedLibrary) -> LoadedLibrary:
    global _usable
    problem = _gate_problem(lib)
    if problem is not None and os.environ.get(SKIP_ENV) != "1":
        raise VersionMismatchError(problem)
    _usable = lib
    return lib


_gate_result: tuple[LoadedLibrary, str | None] | None = None


def _gate_problem(lib: LoadedLibrary) -> str | None:
    """Why *lib* may not be used (another major version), or None; ``LibraryNotFoundError``
    when it is not cuDNN at all. Computed once per library."""
    global _gate_result
    if _gate_result is not None and _gate_result[0] is lib:
        return _gate_result[1]
    runtime = _version_of(lib)
    major = runtime // 10000 if runtime >= 10000 else runtime // 1000  # 9.x: 92800; 8.x: 8907
    problem = None
    if major != REQUIRED_MAJOR:
        v = (
            f"{major}.{runtime // 100 % 100}.{runtime % 100}"
            if runtime >= 10000
            else f"{major}.{runtime // 100 % 10}.{runtime % 100}"
        )
        problem = (
            f"cuDNN {v} was loaded from {lib.path} (found via {lib.found_via}), but pycudnn's "
            f"bindings were generated from cuDNN {REQUIRED_MAJOR}.x headers and need cuDNN "
            f"{REQUIRED_MAJOR}.x. Install cuDNN {REQUIRED_MAJOR} "
            f'(`pip install "nvidia-cudnn-cu12=={REQUIRED_MAJOR}.*"` or `-cu13`), '
            f"or point {ENV_OVERRIDE} at a libcudnn.so.{REQUIRED_MAJOR}; {SKIP_ENV}=1 "
            "bypasses this check at your own risk (wrong prototypes can crash the process)."
        )
    _gate_result = (lib, problem)
    return problem


def _version_of(lib: LoadedLibrary) -> int:
    """``cudnnGetVersion()`` of *lib*; ``LibraryNotFoundError`` when the file is not cuDNN."""
    try:
        fn = lib.cdll.cudnnGetVersion
    except AttributeError:
        raise LibraryNotFoundError(
            f"{lib.path} (found via {lib.found_via}) is not a cuDNN library: it does not export "
            f"cudnnGetVersion. {INSTALL_HINT}"
        ) from None
    fn.restype, fn.argtypes = ctypes.c_size_t, ()
    return int(fn())


def load_unchecked() -> LoadedLibrary:
    """Load libcudnn like :func:`load`, without the version gate (for diagnostics)."""
    global _loaded
    if _loaded is not None:
        return _loaded
    with _lock:
        if _loaded is None:
            tried: list[str] = []
            for attempt in (_try_override, _try_pathfinder, _try_system):
                found = attempt(tried)
                if found is not None:
                    _loaded = found
                    break
            else:
                lines = "\n".join(f"  - {t}" for t in tried)
                raise LibraryNotFoundError(
                    f"cuDNN ({SONAME}) was not found. {INSTALL_HINT}\nTried:\n{lines}"
                )
    return _loaded


def loaded() -> LoadedLibrary | None:
    """The loaded library, or None if nothing has been loaded yet (never loads)."""
    return _loaded


def runtime_version() -> int:
    """``cudnnGetVersion()`` of the loaded library (loads it, without the version gate: this is
    what diagnostics report; ``LibraryNotFoundError`` when the file is not cuDNN)."""
    return _version_of(load_unchecked())


def has_symbol(name: str) -> bool:
    """True when the loaded library (loading it if needed) exports *name*."""
    try:
        getattr(load().cdll, name)
    except AttributeError:
        return False
    return True


def bind(name: str, restype, argtypes):
    """Return the C function *name* with its prototype set.

    A symbol the loaded library lacks yields a callable that raises :class:`SymbolNotFoundError`
    when called, so an older cuDNN 9.x still imports and runs everything it does have.
    """
    lib = load()
    try:
        fn = getattr(lib.cdll, name)
    except AttributeError:
        version = runtime_version()

        def missing(*args, **kwargs):
            raise SymbolNotFoundError(
                f"{name} is not exported by the loaded cuDNN {version} ({lib.path}); "
                "it is newer than that library. Upgrade cuDNN or avoid this function."
            )

        missing.__name__ = name
        missing.missing = True  # type: ignore[attr-defined]
        return missing
    fn.restype = restype
    fn.argtypes = argtypes
    return fn


def libcudnn_files_in_process() -> list[str]:
    """Distinct ``libcudnn.so*`` files mapped into this process (Linux; [] elsewhere)."""
    try:
        with open("/proc/self/maps") as fh:
            paths = {ln.split()[-1] for ln in fh if "/libcudnn.so" in ln}
    except OSError:
        return []
    return sorted(paths)
