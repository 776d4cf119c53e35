"""Which cuDNN this process really runs, whether it fits these bindings, and a report.

The compatibility rule (``check_compatibility``): the runtime's major version must equal the
headers' the bindings were generated from. A runtime older than the headers is allowed (functions
it lacks raise ``SymbolNotFoundError`` when called) and a newer one too (its additions are simply
not bound); both are reported. The sub-library checks (``cudnnGraphVersionCheck``, ...) load each
sub-library and confirm it matches the dispatcher ``libcudnn.so.9``; a sub-library mismatch is as
fatal as a major-version mismatch. ``PYCUDNN_SKIP_VERSION_CHECK=1`` skips the rule.

The major-version rule is also the gate of first use (``pycudnn._loader.load``): every entry point
raises ``VersionMismatchError`` on another major, not only :func:`version`.
"""

from __future__ import annotations

import os
import platform
import sys
import threading
import time
from dataclasses import dataclass, field

from . import _cuda, _loader, _nvrtc, errors
from ._generated import lib as _lib
from ._version import __version__

SKIP_ENV = "PYCUDNN_SKIP_VERSION_CHECK"
SUBLIBRARY_CHECKS = {
    "graph": "cudnnGraphVersionCheck",
    "ops": "cudnnOpsVersionCheck",
    "cnn": "cudnnCnnVersionCheck",
    "adv": "cudnnAdvVersionCheck",
    "subquadratic_ops": "cudnnSubquadraticOpsVersionCheck",
}


def decode_version(v: int) -> tuple[int, int, int]:
    """(major, minor, patch) of a cuDNN version integer, for both encodings.

    cuDNN 9+ encodes ``MAJOR*10000 + MINOR*100 + PATCH`` (92800); cuDNN 8 used
    ``MAJOR*1000 + MINOR*100 + PATCH`` (8907 for 8.9.7).
    """
    v = int(v)
    if v >= 10000:
        return v // 10000, v // 100 % 100, v % 100
    return v // 1000, v // 100 % 10, v % 100


def format_version(v: int) -> str:
    return "{}.{}.{}".format(*decode_version(v))


@dataclass(frozen=True)
class Compatibility:
    """Outcome of comparing the runtime with the headers."""

    ok: bool
    kind: str  # "same", "older", "newer" or "mismatch"
    message: str


def check_compatibility(
    runtime: int, header: int, *, runtime_path: str = "?", bindings_path: str | None = None
) -> Compatibility:
    """Apply the version rule to two version integers (pure: tests inject fake versions)."""
    bindings_path = bindings_path or _lib.__file__
    rt, hd = decode_version(runtime), decode_version(header)
    rts, hds = format_version(runtime), format_version(header)
    if rt[0] != hd[0]:
        return Compatibility(
            False,
            "mismatch",
            f"cuDNN {rts} was loaded from {runtime_path}, but pycudnn's bindings "
            f"({bindings_path}) were generated from cuDNN {hds} headers and need cuDNN "
            f"{hd[0]}.x. Install cuDNN {hd[0]} "
            f'(`pip install "nvidia-cudnn-cu12=={hd[0]}.*"` or `-cu13`), or point '
            f"PYCUDNN_LIBRARY at a libcudnn.so.{hd[0]}; {SKIP_ENV}=1 bypasses this check at your "
            "own risk (wrong prototypes can crash the process).",
        )
    if rt < hd:
        return Compatibility(
            True,
            "older",
            f"cuDNN {rts} ({runtime_path}) is older than the {hds} headers of the bindings: "
            f"functions added after {rts} raise SymbolNotFoundError when called.",
        )
    if rt > hd:
        return Compatibility(
            True,
            "newer",
            f"cuDNN {rts} ({runtime_path}) is newer than the {hds} headers of the bindings: "
            "its newer functions and enum members are not bound (regenerate with "
            "tools/gen_bindings.py).",
        )
    return Compatibility(True, "same", f"cuDNN {rts} matches the bindings' headers.")


_sub_lock = threading.Lock()
_sub_results: dict[str, str] | None = None


def sublibrary_checks() -> dict[str, str]:
    """Run each sub-library version check once; name -> status name (``CUDNN_STATUS_SUCCESS``,
    ``CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH``, ...) or ``"not in this cuDNN"``."""
    global _sub_results
    with _sub_lock:
        if _sub_results is None:
            out = {}
            for sub, fn in SUBLIBRARY_CHECKS.items():
                if not _lib.has(fn):
                    out[sub] = "not in this cuDNN"
                    continue
                status = getattr(_lib, fn)()
                out[sub] = errors.status_name(status)
                if status:
                    errors.last_error_string()  # consume it so it cannot leak into a later error
            _sub_results = out
    return dict(_sub_results)


def _sublibrary_mismatch() -> str | None:
    bad = {k: v for k, v in sublibrary_checks().items() if "VERSION_MISMATCH" in v}
    if not bad:
        return None
    lib = _loader.load()
    files = ", ".join(f for f in _loader.libcudnn_files_in_process() if f != lib.path) or "?"
    return (
        f"cuDNN sub-libraries do not match the dispatcher {lib.path} "
        f"({format_version(_loader.runtime_version())}): "
        + ", ".join(f"{k}: {v}" for k, v in bad.items())
        + f". Files mapped: {files}. Reinstall one consistent cuDNN (all libcudnn_*.so.9 from the "
        "same release, in one directory)."
    )


def version(raises: bool = True) -> int:
    """The runtime cuDNN version (``cudnnGetVersion()``, e.g. 92800), checked against the bindings.

    Parameters
    ----------
    raises : bool
        On an unusable library raise (True) or return -1 (False: never raises, whatever is
        wrong -- no library, not cuDNN, another version).

    Raises
    ------
    LibraryNotFoundError
        If *raises* and no libcudnn can be loaded, or the file loaded is not cuDNN.
    VersionMismatchError
        If *raises* and the major versions differ or a sub-library does not match.
    """
    if not raises:
        try:
            return version(raises=True)
        except Exception:
            return -1
    runtime = _loader.runtime_version()
    if os.environ.get(SKIP_ENV) == "1":
        return runtime
    compat = check_compatibility(runtime, _lib.HEADER_VERSION, runtime_path=_loader.load().path)
    problem = None if compat.ok else compat.message
    problem = problem or _sublibrary_mismatch()
    if problem:
        if raises:
            raise errors.VersionMismatchError(problem)
        return -1
    return runtime


def header_version() -> int:
    """Version of the cuDNN headers the bindings were generated from (e.g. 92800)."""
    return _lib.HEADER_VERSION


def cudart_version() -> int:
    """CUDA runtime version cuDNN was built with (``cudnnGetCudartVersion()``, e.g. 12090)."""
    return int(_lib.cudnnGetCudartVersion())


@dataclass(frozen=True)
class LibraryInfo:
    """Facts about the loaded cuDNN (see :func:`library_info`)."""

    path: str
    found_via: str
    runtime_version: int
    header_version: int
    cudart_version: int
    max_device_version: int
    sublibraries: dict[str, str] = field(default_factory=dict)
    compatibility: str = ""
    other_libcudnn_files: tuple[str, ...] = ()


def library_info() -> LibraryInfo:
    """Load cuDNN (if needed) and describe it; reports the compatibility rule's verdict.

    Raises
    ------
    LibraryNotFoundError, VersionMismatchError
        As every entry point does (the gate of first use): no cuDNN, or another major version.
    """
    lib = _loader.load()
    runtime = _loader.runtime_version()
    compat = check_compatibility(runtime, _lib.HEADER_VERSION, runtime_path=lib.path)
    return LibraryInfo(
        path=lib.path,
        found_via=lib.found_via,
        runtime_version=runtime,
        header_version=_lib.HEADER_VERSION,
        cudart_version=cudart_version(),
        max_device_version=int(_lib.cudnnGetMaxDeviceVersion()),
        sublibraries=sublibrary_checks(),
        compatibility=compat.message,
        other_libcudnn_files=tuple(
            f
            for f in _loader.libcudnn_files_in_process()
            if os.path.basename(f).startswith("libcudnn.so") and f != lib.path
        ),
    )


def is_available() -> bool:
    """True when libcudnn loads, fits these bindings, and a CUDA GPU is usable. Never raises."""
    try:
        if version(raises=False) < 0:
            return False
    except Exception:
        return False
    gpus, _note = _cuda.devices()
    return bool(gpus)


def _cuda_versions() -> str:
    drv, run = _cuda.driver_versions()
    r = f"{run // 1000}.{run % 1000 // 10}" if run else "?"
    if not drv:
        return f"no NVIDIA driver found; cuda.bindings runtime {r}"
    return f"driver supports CUDA {drv // 1000}.{drv % 1000 // 10}; cuda.bindings runtime {r}"


def nvrtc_line() -> tuple[str | None, str]:
    """``(NVRTC's "major.minor" or None, the report's sentence)``: the runtime compiler that
    ``cuda.bindings`` loads, which pycudnn's own kernels (:mod:`._nvrtc`) compile with. Never
    raises."""
    try:
        major, minor = _nvrtc.nvrtc_version()
    except Exception as exc:
        return None, (
            f"not loadable ({type(exc).__name__}: {exc}); pycudnn's own kernels (the fold "
            "kernel of pycudnn.torch) fall back to torch's operations"
        )
    return f"{major}.{minor}", f"{major}.{minor} (pycudnn's own kernels compile with it)"


#: The extra whose cuda-bindings runs on a driver of this CUDA major (``pycudnn[cu12]``).
EXTRA_FOR_DRIVER = {12: "cu12", 13: "cu13"}
#: Oldest Linux driver branch of each CUDA major (CUDA's minor-version compatibility).
MIN_DRIVER = {12: "R525", 13: "R580"}


def _cuda_str(v: int) -> str:
    return f"{v // 1000}.{v % 1000 // 10}"


def driver_mismatch(note: str = "") -> str | None:
    """Why the installed ``cuda-bindings`` cannot use this machine's NVIDIA driver, and what to
    install instead; None when it can, or when no driver is present at all.

    ``cuda.bindings.runtime`` links its CUDA runtime statically: cuda-bindings 13.x needs a CUDA 13
    driver (R580 or newer) and finds no GPU on a CUDA 12 driver (R525-R575). A driver is "too old"
    when its CUDA major is below the runtime's, or when the device probe said
    ``cudaErrorInsufficientDriver`` (*note*, from :func:`pycudnn._cuda.devices`) although a driver
    answered.

    Parameters
    ----------
    note : str
        The reason :func:`pycudnn._cuda.devices` gave for finding no GPU ("" if it found some).

    Returns
    -------
    str or None
        One paragraph naming both versions and the ``pip install`` command that fits the driver.
    """
    drv, run = _cuda.driver_versions()
    if drv <= 0:  # no driver answered: "no GPU", not a mismatch
        return None
    insufficient = "cudaErrorInsufficientDriver" in note
    if run <= 0 or (drv // 1000 >= run // 1000 and not insufficient):
        return None
    dmaj, rmaj = drv // 1000, run // 1000
    head = (
        f"the NVIDIA driver supports CUDA {_cuda_str(drv)}, but cuda-bindings "
        f"{_pkg_version('cuda-bindings')} is installed, whose CUDA {_cuda_str(run)} runtime"
    )
    if dmaj < rmaj and dmaj in EXTRA_FOR_DRIVER:
        extra = EXTRA_FOR_DRIVER[dmaj]
        return (
            f"{head} needs a CUDA {rmaj} driver ({MIN_DRIVER.get(rmaj, 'a new')} or newer): no "
            f"GPU is usable. Install the CUDA {dmaj} build: "
            f'pip install "cuda-bindings=={dmaj}.*" "nvidia-cudnn-cu{dmaj}==9.*" (in pycudnn\'s '
            f'source tree: pip install -e ".[{extra}]"), or update the driver.'
        )
    if dmaj < min(EXTRA_FOR_DRIVER):
        return (
            f"{head} needs a newer driver, and cuDNN 9 with cuda-bindings >= 12.8 needs at least a "
            f"CUDA 12 driver ({MIN_DRIVER[12]} or newer): update the NVIDIA driver."
        )
    return (
        f"{head} needs a newer driver (the device probe reports cudaErrorInsufficientDriver): "
        f"update the NVIDIA driver to one that supports CUDA {_cuda_str(run)}."
    )


def _pkg_version(name: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def torch_cudnn(runtime_path: str = "") -> dict[str, str | bool] | None:
    """What an installed PyTorch means for the cuDNN of a process, or None without torch.

    Read from torch's installed metadata (torch is never imported here): its version and the
    ``nvidia-cudnn-cu*`` wheel it pins. A process that imports torch first has torch's cuDNN
    loaded, and pycudnn then uses that one (``cuda.pathfinder`` finds it already loaded), so its
    version is what pycudnn runs there. ``loaded_by_torch``: this process imported torch and the
    cuDNN in use was already loaded when pycudnn looked for it.
    """
    import re
    from importlib import metadata

    try:
        dist = metadata.distribution("torch")
    except metadata.PackageNotFoundError:
        return None
    pin = ""
    for req in dist.requires or ():
        m = re.match(r"\s*(nvidia-cudnn-cu\d+)\s*==\s*([0-9.]+)", req)
        if m and ("extra ==" not in req):
            pin = f"{m.group(1)}=={m.group(2)}"
            break
    lib = _loader.loaded()
    loaded_by_torch = bool(
        "torch" in sys.modules
        and lib is not None
        and "already loaded" in lib.found_via
        and (not runtime_path or lib.path == runtime_path)
    )
    return {"version": dist.version, "cudnn_pin": pin, "loaded_by_torch": loaded_by_torch}


def _torch_line(info: LibraryInfo) -> list[str]:
    """The report's line on torch's cuDNN (none without torch)."""
    t = torch_cudnn(info.path)
    if t is None:
        return []
    hd = format_version(info.header_version)
    if t["loaded_by_torch"]:
        rt = format_version(info.runtime_version)
        older = (
            f", older than the {hd} headers" if info.runtime_version < info.header_version else ""
        )
        text = (
            f"this process's torch {t['version']} loaded this cuDNN ({rt}{older}); pycudnn uses it"
        )
    elif t["cudnn_pin"]:
        pinned = str(t["cudnn_pin"]).split("==")[1]
        pv = tuple(int(x) for x in pinned.split(".")[:3])
        older = pv < decode_version(info.header_version)
        text = (
            f"torch {t['version']} pins {t['cudnn_pin']}: a process that imports torch first loads "
            f"that cuDNN and pycudnn uses it"
            + (f" ({'.'.join(map(str, pv))}, older than the {hd} headers)" if older else "")
        )
    else:
        text = f"torch {t['version']} (no cuDNN wheel pinned): torch's own cuDNN, if it loads first"
    return _wrap("  torch       ", text)


def facts(self_test: bool = False, device: int | None = None) -> dict:
    """The report as data (``python -m pycudnn --json``): versions, the loaded cuDNN, torch's
    cuDNN, the driver and GPUs, the self-test's verdicts, and ``healthy``. Never raises."""
    healthy = report(self_test=False, device=device)[1]
    out: dict = {
        "pycudnn": __version__,
        "python": platform.python_version(),
        "platform": f"{platform.system()} {platform.machine()}",
        "packages": {
            n: _pkg_version(n) for n in ("numpy", "cuda-bindings", "cuda-pathfinder", "torch")
        },
        "header_version": int(_lib.HEADER_VERSION),
        "cudnn": None,
        "torch": None,
    }
    try:
        info = library_info()
        out["cudnn"] = {
            k: (list(v) if isinstance(v, tuple) else v) for k, v in info.__dict__.items()
        }
        out["cudnn"]["compatibility_kind"] = check_compatibility(
            info.runtime_version, info.header_version, runtime_path=info.path
        ).kind
        out["torch"] = torch_cudnn(info.path)
    except Exception as exc:  # reported, as the text report does
        out["cudnn"] = {"error": f"{type(exc).__name__}: {exc}"}
    drv, run = _cuda.driver_versions()
    try:
        gpus, note = _cuda.devices()
    except Exception as exc:  # pragma: no cover - devices() itself never raises
        gpus, note = [], str(exc)
    out["cuda"] = {
        "driver_version": drv or None,
        "bindings_runtime_version": run or None,
        "nvrtc_version": nvrtc_line()[0],
        "gpus": [
            {
                "index": g.index,
                "name": g.name,
                "capability": list(g.capability),
                "memory_bytes": g.memory_bytes,
            }
            for g in gpus
        ],
        "no_gpu_reason": None if gpus else (_cuda.gpu_unavailable_reason() or note),
        "driver_mismatch": None if gpus else driver_mismatch(note),
    }
    tests = []
    if self_test and gpus and out["cudnn"] and "error" not in out["cudnn"]:
        mdv = out["cudnn"]["max_device_version"]
        for g in gpus if device is None else [g for g in gpus if g.index == device]:
            if g.capability[0] * 100 + g.capability[1] * 10 > mdv:
                continue
            for name, verdict, msg in _self_test(g.index):
                healthy &= verdict != "FAIL"
                tests.append({"device": g.index, "case": name, "verdict": verdict, "detail": msg})
    out["self_test"] = tests
    out["healthy"] = bool(healthy)
    return out


def _never_raises(fn):
    """``python -m pycudnn`` prints no traceback: an unexpected failure becomes a report line."""

    def report(self_test: bool = True, device: int | None = None) -> tuple[str, bool]:
        try:
            return fn(self_test, device)
        except Exception as exc:  # the doctor reports, it does not crash
            text = f"pycudnn {__version__}\n  the report failed: {type(exc).__name__}: {exc}"
            return text, False

    report.__doc__ = fn.__doc__
    return report


@_never_raises
def report(self_test: bool = True, device: int | None = None) -> tuple[str, bool]:
    """The diagnostics text and whether everything checked is healthy (never raises).

    Every visible GPU is listed (name, compute capability, memory, whether this cuDNN supports
    it); the self-test runs on each supported GPU, or only on GPU *device* when given (a
    *device* that is not visible makes the report unhealthy)."""
    lines = [
        f"pycudnn {__version__}",
        f"  Python {platform.python_version()} on {platform.system()} {platform.machine()}",
        "  numpy {}, cuda-bindings {}, cuda-pathfinder {}".format(
            _pkg_version("numpy"), _pkg_version("cuda-bindings"), _pkg_version("cuda-pathfinder")
        ),
        "",
        "cuDNN",
    ]
    healthy = True
    try:
        info = library_info()
    except errors.LibraryNotFoundError as exc:
        lines += [f"  NOT FOUND: {exc}"]
        return "\n".join(lines), False
    except errors.VersionMismatchError as exc:  # the gate of first use: report what was found
        lib, rt = _loader.load_unchecked(), _loader.runtime_version()
        lines += [
            f"  library     {lib.path}",
            f"  found via   {lib.found_via}",
            f"  runtime     {format_version(rt)} ({rt})",
            f"  headers     {format_version(_lib.HEADER_VERSION)} ({_lib.HEADER_VERSION})",
            f"  check       MISMATCH: {exc}",
        ]
        return "\n".join(lines), False
    rt, hd = info.runtime_version, info.header_version
    lines += [
        f"  library     {info.path}",
        f"  found via   {info.found_via}",
        f"  runtime     {format_version(rt)} ({rt})",
        f"  headers     {format_version(hd)} ({hd}), the version the bindings were generated from",
    ]
    try:
        version(raises=True)
        verdict = "OK" if os.environ.get(SKIP_ENV) != "1" else f"SKIPPED ({SKIP_ENV}=1)"
        verdict += f": {info.compatibility}"
    except errors.VersionMismatchError as exc:  # its message says it all (once)
        verdict, healthy = f"MISMATCH: {exc}", False
    lines += [f"  check       {verdict}"]
    subs = {k: "OK" if v == "CUDNN_STATUS_SUCCESS" else v for k, v in info.sublibraries.items()}
    lines += ["  sub-libs    " + ", ".join(f"{k} {v}" for k, v in subs.items())]
    if any(v != "OK" and v != "not in this cuDNN" for v in subs.values()):
        healthy = False
    cv = info.cudart_version
    lines += [
        f"  cudart      {cv // 1000}.{cv % 1000 // 10} ({cv}), CUDA runtime cuDNN was built with"
    ]
    mdv = info.max_device_version
    lines += [
        f"  max device  sm_{mdv // 100}{mdv % 100 // 10} (newest compute capability supported)"
    ]
    lines += _torch_line(info)
    if info.other_libcudnn_files:
        healthy = False
        lines += [
            "  WARNING     another libcudnn is also mapped into this process: "
            + ", ".join(info.other_libcudnn_files)
            + " (two cuDNNs in one process; set PYCUDNN_LIBRARY to the one you mean)"
        ]
    lines += ["", "CUDA", f"  {_cuda_versions()}", f"  NVRTC       {nvrtc_line()[1]}"]
    gpus, note = _cuda.devices()
    mismatch = None if gpus else driver_mismatch(note)
    if mismatch:
        lines += [f"  GPUs        none usable ({note})", *_wrap("  DRIVER      ", mismatch)]
        return "\n".join(lines), False
    if not gpus:
        lines += [
            f"  GPUs        none found ({note})",
            "  No GPU was found: everything above works without one, but handles, compute and the",
            "  self-test need a CUDA GPU.",
        ]
        if device is not None:
            lines += [f"  --device {device}: no such GPU (none visible)"]
            healthy = False
        return "\n".join(lines), healthy
    supported = {}
    for g in gpus:
        cc = g.capability[0] * 100 + g.capability[1] * 10
        supported[g.index] = cc <= mdv
        ok = "supported" if cc <= mdv else f"NEWER than this cuDNN supports (sm_{mdv // 10})"
        lines += [
            f"  GPU {g.index}       {g.name}, sm_{g.capability[0]}{g.capability[1]}, "
            f"{g.memory_bytes / 2**30:.0f} GiB: {ok}"
        ]
    if len(gpus) > 1:
        lines += [
            f"  {len(gpus)} GPUs visible (CUDA_VISIBLE_DEVICES="
            f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})"
        ]
    if device is not None and device not in supported:
        visible = ", ".join(str(i) for i in supported)
        lines += [f"  --device {device}: no such GPU (visible: {visible})"]
        return "\n".join(lines), False
    if self_test:
        for index in [device] if device is not None else list(supported):
            if not supported[index]:
                lines += ["", f"Self-test (GPU {index}): skipped, this cuDNN does not support it"]
                continue
            lines += ["", f"Self-test (GPU {index}, against float64 NumPy references)"]
            for name, verdict, msg in _self_test(index):
                healthy &= verdict != "FAIL"
                lines += [f"  {verdict:<4}  {name:<10} {msg}"]
    return "\n".join(lines), healthy


def _wrap(label: str, text: str, width: int = 100) -> list[str]:
    """*text* as report lines: *label* before the first, the rest indented to match; a
    ``pip install ...`` command is never split across lines (it is meant to be copied)."""
    import re
    import textwrap

    nbsp = "\N{NO-BREAK SPACE}"
    text = re.sub(r'pip install[^"]*"[^"]*"', lambda m: m.group(0).replace(" ", nbsp), text)
    lines = textwrap.wrap(text, width, initial_indent=label, subsequent_indent=" " * len(label))
    return [line.replace(nbsp, " ") for line in lines]


def _self_test(device: int = 0) -> list[tuple[str, str, str]]:
    """Run each self-test case with GPU *device* current (its arrays live there, and the calls
    follow them): (name, PASS/FAIL/SKIP, detail); failures are reported."""
    from . import _selftest

    out = []
    for name, case in _selftest.CASES:
        t0 = time.perf_counter()
        try:
            with _cuda.DeviceContext(device):
                msg = case()
            out.append((name, "PASS", f"{msg} ({(time.perf_counter() - t0) * 1e3:.1f} ms)"))
        except _selftest.SelfTestSkip as exc:
            out.append((name, "SKIP", str(exc)))
        except Exception as exc:  # report every failure, keep going
            out.append((name, "FAIL", f"{type(exc).__name__}: {exc}"))
    return out


def show_config(file=None) -> bool:
    """Print the diagnostics report (to *file*, default stdout); return True when healthy."""
    text, healthy = report()
    print(text, file=file or sys.stdout)
    return healthy
