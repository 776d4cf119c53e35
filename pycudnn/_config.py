"""``pycudnn.config``: the process-wide flags of the high-level layer (Theano's ``dnn.*`` flags).

Design decisions
----------------
* One object, :data:`config`, with one validated attribute per flag. Assigning a bad value
  raises a ``ValueError`` that names the flag and lists what it accepts; assigning an unknown
  name raises ``AttributeError``. Nothing is checked later, at call time.
* ``PYCUDNN_FLAGS`` (``"algo_fwd=time_once,allow_tf32=1,workspace_limit=256MiB"``) is parsed at
  the first read of any flag, not at import, so ``import pycudnn`` stays free of side effects. A
  malformed variable raises ``ValueError`` naming ``PYCUDNN_FLAGS``, the item and the allowed
  values, on every read until it is fixed (or :meth:`Config.reset` is called after fixing it).
* Assignments are global (every thread sees them). :meth:`Config.override` is *thread-local*: it
  changes what the calling thread reads, for the duration of the ``with`` block, and nothing that
  other threads read. Overrides nest. This makes ``override`` safe to use from several threads at
  once; a global assignment made *inside* an override is visible after the block ends only where
  the override did not also set that flag.
* :attr:`Config.version` is a global counter bumped by every assignment and by every override's
  enter and exit, in any thread. It only grows, so a cache that stores the version it was built
  under can tell when to look again. For a cache *key*, use :meth:`Config.snapshot`: an immutable,
  hashable :class:`Flags` of the values the calling thread sees (cached per thread, so calling it
  on every operation costs a thread-local lookup and an integer comparison).
"""

from __future__ import annotations

import math
import operator
import os
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

__all__ = [
    "ALGO_BWD_DATA_CHOICES",
    "ALGO_BWD_FILTER_CHOICES",
    "ALGO_FWD_CHOICES",
    "ENV_VAR",
    "PRECISION_CHOICES",
    "Config",
    "Flags",
    "config",
    "parse_bool",
]

ENV_VAR = "PYCUDNN_FLAGS"

#: Algorithm names that choose among all engines and cache the choice (any direction).
_META_ALGOS = ("guess_once", "guess_on_shape_change", "time_once", "time_on_shape_change")
#: Theano's ``dnn.conv.algo_fwd`` names.
ALGO_FWD_CHOICES: tuple[str, ...] = (
    "small",
    "none",
    "large",
    "fft",
    "fft_tiling",
    "winograd",
    "winograd_non_fused",
    "deterministic",
    *_META_ALGOS,
)
#: Theano's ``dnn.conv.algo_bwd_data`` names (cuDNN has no 'small'/'large' backward-data algorithm).
ALGO_BWD_DATA_CHOICES: tuple[str, ...] = (
    "none",
    "deterministic",
    "fft",
    "fft_tiling",
    "winograd",
    "winograd_non_fused",
    *_META_ALGOS,
)
#: Theano's ``dnn.conv.algo_bwd_filter`` names.
ALGO_BWD_FILTER_CHOICES: tuple[str, ...] = (
    "none",
    "deterministic",
    "fft",
    "small",
    "winograd_non_fused",
    "fft_tiling",
    *_META_ALGOS,
)
#: ``precision``: the compute type of a convolution; ``as_input_f32`` computes float16 and
#: bfloat16 data in float32 and everything else in its own type.
PRECISION_CHOICES: tuple[str, ...] = ("as_input_f32", "as_input", "float16", "float32", "float64")

_TRUE = {"1", "true", "yes", "on", "y", "t"}
_FALSE = {"0", "false", "no", "off", "n", "f", ""}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
_SIZE_UNIT = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


class Flags(NamedTuple):
    """An immutable, hashable snapshot of every flag (what :meth:`Config.snapshot` returns)."""

    algo_fwd: str
    algo_bwd_data: str
    algo_bwd_filter: str
    precision: str
    allow_tf32: bool
    deterministic: bool
    workspace_limit: int | None
    verbose: int
    check_indices: bool = False


_DEFAULTS = Flags(
    algo_fwd="guess_once",
    algo_bwd_data="guess_once",
    algo_bwd_filter="guess_once",
    precision="as_input_f32",
    allow_tf32=False,
    deterministic=False,
    workspace_limit=None,
    verbose=0,
    check_indices=False,
)
_NAMES: tuple[str, ...] = Flags._fields


# -- validators: value (any Python object, or a string from the environment) -> canonical value --
def _choice(name: str, choices: tuple[str, ...]):
    def validate(value: Any) -> str:
        if isinstance(value, str) and value.strip().lower() in choices:
            return value.strip().lower()
        raise ValueError(
            f"pycudnn.config.{name}={value!r} is not allowed; expected one of "
            f"{', '.join(repr(c) for c in choices)}"
        )

    return validate


def _as_bool(value: Any) -> bool | None:
    """*value* as a boolean when it unambiguously is one (else None): ``True``/``False``, a NumPy
    bool, the ints 0 and 1, or one of the words of ``_TRUE``/``_FALSE`` in any case."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        text = value.strip().lower()
        return text in _TRUE if text in _TRUE | _FALSE else None
    dtype = getattr(value, "dtype", None)
    if (
        dtype is not None
        and getattr(value, "ndim", None) == 0
        and getattr(dtype, "kind", "") == "b"
    ):
        return bool(value)  # numpy.bool_ (0-d only: an array is no flag)
    if isinstance(value, int) or (dtype is not None and getattr(dtype, "kind", "") in "iu"):
        try:
            number = operator.index(value)
        except TypeError:
            return None
        return bool(number) if number in (0, 1) else None
    return None


def parse_bool(value: Any, where: str, argument: str) -> bool:
    """The one strict reading of a boolean argument (the same words as ``pycudnn.config``).

    ``True``/``False`` (and NumPy bools), ``1``/``0``, ``'true'``/``'false'``, ``'yes'``/``'no'``,
    ``'on'``/``'off'`` (any case); anything else raises, naming *where* (the function) and
    *argument*: a string or number that is no boolean ``ValueError``, another type ``TypeError``.
    """
    if value is True or value is False:
        return value
    parsed = _as_bool(value)
    if parsed is not None:
        return parsed
    cls = ValueError if isinstance(value, str | int | float) else TypeError
    text = repr(value)
    raise cls(
        f"{where}: {argument}={text if len(text) <= 60 else text[:57] + '...'} is not a boolean; "
        "expected True/False, 1/0, or 'true'/'false'/'yes'/'no'/'on'/'off'"
    )


def _bool(name: str):
    def validate(value: Any) -> bool:
        parsed = _as_bool(value)
        if parsed is not None:
            return parsed
        raise ValueError(
            f"pycudnn.config.{name}={value!r} is not allowed; expected a boolean "
            "(True/False, 1/0, or 'true'/'false'/'yes'/'no'/'on'/'off')"
        )

    return validate


def parse_size(value: Any, *, name: str = "workspace_limit") -> int | None:
    """Parse a byte count: ``None``/``'none'`` (no limit), an int, or ``'512MiB'``, ``'2G'``, ...

    Units are powers of 1024 (``K``, ``M``, ``G``, ``T``, with or without ``iB``/``B``).
    """
    if value is None:
        return None
    if isinstance(value, bool):
        pass  # True/False are not sizes
    elif isinstance(value, int):
        if value >= 0:
            return int(value)
    elif isinstance(value, float):
        if math.isfinite(value) and value >= 0 and value == int(value):
            return int(value)
    elif isinstance(value, str):
        text = value.strip().lower()
        if text in ("none", "unlimited", ""):
            return None
        m = _SIZE_RE.match(text)
        if m:
            number = float(m.group(1)) * _SIZE_UNIT[m.group(2).lower()]
            if math.isfinite(number) and number == int(number):
                return int(number)
    raise ValueError(
        f"pycudnn.config.{name}={value!r} is not allowed; expected None (no limit) or a "
        "non-negative number of bytes (an int, or a string such as '512MiB', '2G')"
    )


def _verbose(value: Any) -> int:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int) and value >= 0:
        return int(value)
    if isinstance(value, str):
        text = value.strip().lower()
        if text.isdigit():
            return int(text)
        if text in _TRUE | _FALSE:
            return int(text in _TRUE)
    raise ValueError(
        f"pycudnn.config.verbose={value!r} is not allowed; expected a non-negative int "
        "(0 = quiet, 1 = report algorithm choices, 2 = more) or a boolean"
    )


_VALIDATORS = {
    "algo_fwd": _choice("algo_fwd", ALGO_FWD_CHOICES),
    "algo_bwd_data": _choice("algo_bwd_data", ALGO_BWD_DATA_CHOICES),
    "algo_bwd_filter": _choice("algo_bwd_filter", ALGO_BWD_FILTER_CHOICES),
    "precision": _choice("precision", PRECISION_CHOICES),
    "allow_tf32": _bool("allow_tf32"),
    "deterministic": _bool("deterministic"),
    "workspace_limit": parse_size,
    "verbose": _verbose,
    "check_indices": _bool("check_indices"),
}


def parse_flags(text: str, *, source: str = ENV_VAR) -> dict[str, Any]:
    """Parse ``"name=value,name=value"`` into validated values (errors name *source*)."""
    out: dict[str, Any] = {}
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, value = item.partition("=")
        name = name.strip().lower()
        if not sep:
            raise ValueError(f"{source}: item {item!r} is not of the form name=value")
        if name not in _VALIDATORS:
            raise ValueError(
                f"{source}: unknown flag {name!r} in {item!r}; known flags: {', '.join(_NAMES)}"
            )
        try:
            out[name] = _VALIDATORS[name](value.strip())
        except ValueError as exc:
            raise ValueError(f"{source}: {exc}") from None
    return out


class _Flag:
    """Data descriptor of one flag: reads see the thread's overrides first, then global values."""

    def __init__(self, name: str, doc: str):
        self.name = name
        self.__doc__ = doc

    def __get__(self, obj: Config | None, owner: type | None = None) -> Any:
        if obj is None:
            return self
        overrides = getattr(obj._local, "merged", None)
        if overrides and self.name in overrides:
            return overrides[self.name]
        if not obj._env_loaded:
            obj._load_env()
        return obj._values[self.name]

    def __set__(self, obj: Config, value: Any) -> None:
        obj._set(self.name, value)

    def __delete__(self, obj: Config) -> None:
        raise AttributeError(
            f"pycudnn.config.{self.name} cannot be deleted (a flag always has a value): set it, "
            f"or pycudnn.config.reset() to restore every default"
        )


class Config:
    """The high-level layer's flags; the one instance is ``pycudnn.config``.

    Attributes
    ----------
    algo_fwd, algo_bwd_data, algo_bwd_filter : str
        Default convolution algorithm per direction (Theano names; see ``ALGO_*_CHOICES``).
        Default ``'guess_once'``.
    precision : str
        Compute precision of convolutions: ``'as_input_f32'`` (default), ``'as_input'``,
        ``'float16'``, ``'float32'``, ``'float64'``.
    allow_tf32 : bool
        Let float32 convolutions use TF32 tensor cores. Default False (exact float32).
    deterministic : bool
        Only choose deterministic algorithms. Default False.
    workspace_limit : int or None
        Largest workspace, in bytes, an operation may allocate; None (default) means no limit.
    verbose : int
        0 (default) quiet; 1 reports algorithm choices; 2 more.
    check_indices : bool
        Check the index data attention reads on the device before each launch: the page
        tables of :func:`~pycudnn.dnn_sdpa_paged` (every page a sequence's length uses names a
        block of the cache) and the sequence lengths of it and of
        :func:`~pycudnn.dnn_sdpa`/:func:`~pycudnn.dnn_sdpa_grad` (within the cache, or the
        sequence dims). Costs a device-to-host copy and a synchronisation of the stream per
        call; default False (unchecked, as flash-attn and vLLM leave them: an entry out of
        range reads outside the cache). Each call can also pass ``check_indices=``.
    version : int
        Grows on every change (assignment, override enter/exit, reset), in any thread.

    Notes
    -----
    Assignments are global; :meth:`override` is thread-local and nests. ``PYCUDNN_FLAGS`` is read
    at the first read of a flag.
    """

    algo_fwd = _Flag("algo_fwd", "Default forward convolution algorithm (Theano name).")
    algo_bwd_data = _Flag("algo_bwd_data", "Default backward-data algorithm (Theano name).")
    algo_bwd_filter = _Flag("algo_bwd_filter", "Default backward-filter algorithm (Theano name).")
    precision = _Flag("precision", "Convolution compute precision.")
    allow_tf32 = _Flag("allow_tf32", "Allow TF32 tensor-core math for float32 data.")
    deterministic = _Flag("deterministic", "Choose deterministic algorithms only.")
    workspace_limit = _Flag("workspace_limit", "Workspace limit in bytes (None: no limit).")
    verbose = _Flag("verbose", "Verbosity level (0 quiet).")
    check_indices = _Flag(
        "check_indices", "Check attention's page tables and lengths on the host before launch."
    )

    def __init__(self) -> None:
        object.__setattr__(self, "_lock", threading.RLock())
        object.__setattr__(self, "_local", threading.local())
        object.__setattr__(self, "_values", dict(_DEFAULTS._asdict()))
        object.__setattr__(self, "_env_loaded", False)
        object.__setattr__(self, "_version", 0)

    # -- global state ---------------------------------------------------------------------------
    def _load_env(self) -> None:
        with self._lock:
            if self._env_loaded:
                return
            parsed = parse_flags(os.environ.get(ENV_VAR, ""))  # raises: stays unloaded
            self._values.update(parsed)
            object.__setattr__(self, "_env_loaded", True)
            object.__setattr__(self, "_version", self._version + 1)

    def _set(self, name: str, value: Any) -> None:
        canonical = _VALIDATORS[name](value)
        if not self._env_loaded:
            self._load_env()
        with self._lock:
            self._values[name] = canonical
            object.__setattr__(self, "_version", self._version + 1)

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in _VALIDATORS:
            raise AttributeError(f"pycudnn.config has no flag {name!r}; flags: {', '.join(_NAMES)}")
        object.__setattr__(self, name, value)  # goes through the _Flag descriptor

    @property
    def version(self) -> int:
        """A counter that grows on every change of any flag, in any thread."""
        return self._version

    def reset(self) -> None:
        """Restore the defaults, then re-read ``PYCUDNN_FLAGS`` at the next read of a flag."""
        with self._lock:
            self._values.clear()
            self._values.update(_DEFAULTS._asdict())
            object.__setattr__(self, "_env_loaded", False)
            object.__setattr__(self, "_version", self._version + 1)

    # -- reading --------------------------------------------------------------------------------
    def snapshot(self) -> Flags:
        """The values the calling thread sees now, as a hashable :class:`Flags` (a cache key).

        Cached per thread and rebuilt only when :attr:`version` moved.
        """
        if not self._env_loaded:
            self._load_env()
        local = self._local
        cached = getattr(local, "snapshot", None)
        version = self._version
        if cached is not None and cached[0] == version:
            return cached[1]
        flags = Flags(*(getattr(self, name) for name in _NAMES))
        local.snapshot = (version, flags)
        return flags

    def as_dict(self) -> dict[str, Any]:
        """The values the calling thread sees, as a new ``dict``."""
        return self.snapshot()._asdict()

    def __repr__(self) -> str:
        try:
            body = ", ".join(f"{k}={v!r}" for k, v in self.as_dict().items())
        except ValueError as exc:  # a bad PYCUDNN_FLAGS
            body = f"<{exc}>"
        return f"pycudnn.config({body})"

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(_NAMES))

    # -- overrides ------------------------------------------------------------------------------
    @contextmanager
    def override(self, **flags: Any) -> Iterator[Config]:
        """Set flags for the calling thread inside a ``with`` block; restore them on exit.

        Parameters
        ----------
        **flags
            Flag names and values; all are validated before any takes effect.

        Raises
        ------
        TypeError
            For an unknown flag name.
        ValueError
            For a value the flag does not accept.

        Notes
        -----
        Only the calling thread sees the overridden values (other threads keep reading the global
        ones), so concurrent overrides in different threads do not interfere. Overrides nest.

        Examples
        --------
        >>> with pycudnn.config.override(algo_fwd="time_once", allow_tf32=True):
        ...     y = pycudnn.dnn_conv(x, w)
        """
        unknown = [k for k in flags if k not in _VALIDATORS]
        if unknown:
            raise TypeError(
                f"pycudnn.config.override() got unknown flag(s) {', '.join(map(repr, unknown))}; "
                f"flags: {', '.join(_NAMES)}"
            )
        canonical = {k: _VALIDATORS[k](v) for k, v in flags.items()}
        if not self._env_loaded:
            self._load_env()
        local = self._local
        previous = getattr(local, "merged", None)
        merged = dict(previous or {})
        merged.update(canonical)
        local.merged = merged
        self._bump()
        try:
            yield self
        finally:
            local.merged = previous
            self._bump()

    def _bump(self) -> None:
        with self._lock:
            object.__setattr__(self, "_version", self._version + 1)


#: The one flags object (``pycudnn.config``).
config = Config()
