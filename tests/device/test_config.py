"""pycudnn.config: validated flags, PYCUDNN_FLAGS parsing, thread-local overrides, version."""

from __future__ import annotations

import pickle
import threading

import pytest

import pycudnn
from pycudnn import _config
from pycudnn._config import Config, Flags, parse_flags, parse_size


@pytest.fixture
def cfg(monkeypatch):
    """A fresh Config with no PYCUDNN_FLAGS in the environment."""
    monkeypatch.delenv("PYCUDNN_FLAGS", raising=False)
    return Config()


def test_public_object_is_the_module_singleton():
    assert pycudnn.config is _config.config
    assert isinstance(pycudnn.config, Config)


def test_defaults(cfg):
    assert cfg.algo_fwd == "guess_once"
    assert cfg.algo_bwd_data == "guess_once"
    assert cfg.algo_bwd_filter == "guess_once"
    assert cfg.precision == "as_input_f32"
    assert cfg.allow_tf32 is False
    assert cfg.deterministic is False
    assert cfg.workspace_limit is None
    assert cfg.verbose == 0


@pytest.mark.parametrize(
    ("name", "choices"),
    [
        ("algo_fwd", _config.ALGO_FWD_CHOICES),
        ("algo_bwd_data", _config.ALGO_BWD_DATA_CHOICES),
        ("algo_bwd_filter", _config.ALGO_BWD_FILTER_CHOICES),
        ("precision", _config.PRECISION_CHOICES),
    ],
)
def test_choice_flags_accept_their_names_and_reject_others(cfg, name, choices):
    for value in choices:
        setattr(cfg, name, value)
        assert getattr(cfg, name) == value
    setattr(cfg, name, choices[0].upper())  # case-insensitive, stored canonical
    assert getattr(cfg, name) == choices[0]
    with pytest.raises(ValueError, match=rf"pycudnn\.config\.{name}='bogus'") as info:
        setattr(cfg, name, "bogus")
    for value in choices:
        assert repr(value) in str(info.value)
    assert getattr(cfg, name) == choices[0]  # unchanged by the failed assignment


def test_algo_sets_follow_theano():
    every = {
        "small",
        "none",
        "large",
        "fft",
        "fft_tiling",
        "winograd",
        "winograd_non_fused",
        "deterministic",
        "guess_once",
        "guess_on_shape_change",
        "time_once",
        "time_on_shape_change",
    }
    assert set(_config.ALGO_FWD_CHOICES) == every
    assert set(_config.ALGO_BWD_DATA_CHOICES) < every
    assert set(_config.ALGO_BWD_FILTER_CHOICES) < every
    assert "small" not in _config.ALGO_BWD_DATA_CHOICES
    assert "small" in _config.ALGO_BWD_FILTER_CHOICES


@pytest.mark.parametrize("name", ["allow_tf32", "deterministic"])
@pytest.mark.parametrize(
    ("value", "expected"),
    [(True, True), (False, False), (1, True), (0, False), ("yes", True), ("OFF", False)],
)
def test_bool_flags(cfg, name, value, expected):
    setattr(cfg, name, value)
    assert getattr(cfg, name) is expected


@pytest.mark.parametrize("value", [2, "maybe", None, 1.5])
def test_bool_flags_reject(cfg, value):
    with pytest.raises(ValueError, match=r"allow_tf32.*expected a boolean"):
        cfg.allow_tf32 = value


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        (0, 0),
        (1 << 20, 1 << 20),
        ("none", None),
        ("1024", 1024),
        ("256MiB", 256 << 20),
        ("2G", 2 << 30),
        ("1.5k", 1536),
        ("64 mb", 64 << 20),
    ],
)
def test_workspace_limit(cfg, value, expected):
    cfg.workspace_limit = value
    assert cfg.workspace_limit == expected
    assert parse_size(value) == expected


@pytest.mark.parametrize("value", [-1, "lots", True, 0.5, "1.3b"])
def test_workspace_limit_rejects(cfg, value):
    with pytest.raises(ValueError, match="workspace_limit"):
        cfg.workspace_limit = value


def test_verbose(cfg):
    cfg.verbose = 2
    assert cfg.verbose == 2
    cfg.verbose = True
    assert cfg.verbose == 1
    with pytest.raises(ValueError, match="verbose"):
        cfg.verbose = -1


def test_unknown_flag_is_an_attribute_error(cfg):
    with pytest.raises(AttributeError, match=r"no flag 'algo_fw'.*algo_fwd"):
        cfg.algo_fw = "none"


def test_env_is_read_at_first_use_not_at_construction(monkeypatch):
    monkeypatch.setenv("PYCUDNN_FLAGS", "algo_fwd=time_once, allow_tf32=1,workspace_limit=64MiB")
    cfg = Config()
    assert cfg._env_loaded is False
    assert cfg.algo_fwd == "time_once"
    assert cfg.allow_tf32 is True
    assert cfg.workspace_limit == 64 << 20
    assert cfg.precision == "as_input_f32"  # untouched flags keep their defaults


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("algo_fwd=fastest", r"PYCUDNN_FLAGS: pycudnn\.config\.algo_fwd='fastest'.*'time_once'"),
        ("algo_fwdd=none", r"PYCUDNN_FLAGS: unknown flag 'algo_fwdd'.*known flags: algo_fwd"),
        ("allow_tf32", r"PYCUDNN_FLAGS: item 'allow_tf32' is not of the form name=value"),
        ("allow_tf32=2", r"PYCUDNN_FLAGS: .*allow_tf32"),
    ],
)
def test_env_errors_are_clear_and_persistent(monkeypatch, text, match):
    monkeypatch.setenv("PYCUDNN_FLAGS", text)
    cfg = Config()
    for _ in range(2):  # every read fails until the variable is fixed
        with pytest.raises(ValueError, match=match):
            cfg.algo_fwd  # noqa: B018
    monkeypatch.setenv("PYCUDNN_FLAGS", "")
    cfg.reset()
    assert cfg.algo_fwd == "guess_once"


def test_parse_flags_ignores_blanks():
    assert parse_flags(" , precision=float32 ,, ") == {"precision": "float32"}
    assert parse_flags("") == {}


def test_assignment_wins_over_env(monkeypatch):
    monkeypatch.setenv("PYCUDNN_FLAGS", "precision=float16")
    cfg = Config()
    cfg.precision = "float64"  # loads the environment first, then assigns
    assert cfg.precision == "float64"


def test_override_sets_and_restores(cfg):
    cfg.algo_fwd = "none"
    with cfg.override(algo_fwd="fft", allow_tf32=True) as c:
        assert c is cfg
        assert cfg.algo_fwd == "fft"
        assert cfg.allow_tf32 is True
        with cfg.override(algo_fwd="large"):
            assert cfg.algo_fwd == "large"
            assert cfg.allow_tf32 is True  # nested overrides stack
        assert cfg.algo_fwd == "fft"
    assert cfg.algo_fwd == "none"
    assert cfg.allow_tf32 is False


def test_override_restores_on_error(cfg):
    with pytest.raises(KeyError), cfg.override(deterministic=True):
        raise KeyError
    assert cfg.deterministic is False


def test_override_validates_everything_first(cfg):
    with pytest.raises(ValueError, match="precision"), cfg.override(verbose=1, precision="fp8"):
        pass
    assert cfg.verbose == 0
    with pytest.raises(TypeError, match=r"unknown flag.*'speed'"), cfg.override(speed=1):
        pass


def test_override_is_thread_local(cfg):
    inside = threading.Event()
    release = threading.Event()
    seen: dict[str, object] = {}

    def other():
        inside.wait(5)
        seen["algo"] = cfg.algo_fwd
        seen["snap"] = cfg.snapshot()
        release.set()

    t = threading.Thread(target=other)
    t.start()
    with cfg.override(algo_fwd="winograd"):
        inside.set()
        release.wait(5)
        assert cfg.algo_fwd == "winograd"
    t.join(5)
    assert seen["algo"] == "guess_once"
    assert seen["snap"].algo_fwd == "guess_once"


def test_concurrent_overrides_do_not_interfere(cfg):
    errors: list[str] = []
    names = _config.ALGO_FWD_CHOICES

    def worker(i):
        name = names[i % len(names)]
        for _ in range(200):
            with cfg.override(algo_fwd=name):
                if cfg.algo_fwd != name or cfg.snapshot().algo_fwd != name:
                    errors.append(name)
            if cfg.algo_fwd != "guess_once":
                errors.append("leak")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_version_grows_on_every_change(cfg):
    v0 = cfg.version
    cfg.verbose = 1
    v1 = cfg.version
    assert v1 > v0
    with cfg.override(verbose=2):
        v2 = cfg.version
        assert v2 > v1
    assert cfg.version > v2
    cfg.reset()
    assert cfg.version > v2


def test_snapshot_is_hashable_cached_and_tracks_changes(cfg):
    s1 = cfg.snapshot()
    assert isinstance(s1, Flags)
    assert s1 is cfg.snapshot()  # cached while nothing changes
    assert hash(s1) == hash(Flags(**cfg.as_dict()))
    cfg.allow_tf32 = True
    s2 = cfg.snapshot()
    assert s2 != s1 and s2.allow_tf32 is True
    with cfg.override(precision="float32"):
        assert cfg.snapshot().precision == "float32"
    assert cfg.snapshot() == s2
    assert pickle.loads(pickle.dumps(s2)) == s2


def test_repr_and_dir(cfg):
    text = repr(cfg)
    assert "algo_fwd='guess_once'" in text and "workspace_limit=None" in text
    assert {"algo_fwd", "precision", "override", "snapshot"} <= set(dir(cfg))


def test_repr_shows_a_bad_environment(monkeypatch):
    monkeypatch.setenv("PYCUDNN_FLAGS", "precision=fp8")
    assert "PYCUDNN_FLAGS" in repr(Config())


def test_class_attributes_document_flags():
    assert "algorithm" in Config.algo_fwd.__doc__
