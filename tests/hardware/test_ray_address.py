"""Which Ray cluster a run connects to, decided before Ray's own connection (autotune.hardware.ray_address): real
sockets and Ray's real address file in a temporary RAY_TMPDIR; no Ray needed (a run's and the doctor's use of
it on a real cluster: tests/cluster/test_ray_cluster.py)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from autotune.hardware.ray_address import (
    Connection,
    NoClusterAnswers,
    address_file,
    connection,
    token_auth_environment,
)


@pytest.fixture
def ray_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    (tmp_path / "ray").mkdir()
    return tmp_path


@pytest.fixture
def listening() -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield f"127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture
def dead() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"  # nothing listens there once the socket is closed


def record(ray_tmp: Path, address: str) -> Path:
    path = ray_tmp / "ray" / "ray_current_cluster"
    path.write_text(address + "\n")
    return path


def test_ray_s_address_file_follows_ray_s_temporary_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RAY_TMPDIR", raising=False)
    monkeypatch.delenv("TMPDIR", raising=False)
    assert address_file() == Path("/tmp/ray/ray_current_cluster")
    monkeypatch.setenv("TMPDIR", str(tmp_path / "t"))
    assert address_file() == tmp_path / "t" / "ray" / "ray_current_cluster"
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path / "r"))
    assert address_file() == tmp_path / "r" / "ray" / "ray_current_cluster"


def test_without_an_address_a_recorded_cluster_that_answers_is_ray_s_to_find(
    ray_tmp: Path, listening: str
) -> None:
    record(ray_tmp, listening)
    assert connection(None) == Connection(None, "auto")
    assert connection(None).note is None


def test_without_an_address_or_a_record_ray_starts_a_local_cluster(ray_tmp: Path) -> None:
    assert connection(None) == Connection(None, "auto")


def test_a_recorded_cluster_where_nothing_answers_is_passed_over_for_a_local_one(
    ray_tmp: Path, dead: str
) -> None:
    """The CI failure: a killed `ray start --block` left Ray's address file, and ray.init() waited on it
    for minutes (autotune doctor's probe timed out after 120 s)."""
    path = record(ray_tmp, dead)
    to = connection(None)
    assert to.init_address == "local" and to.shown == "a new local cluster"
    assert to.passed_over is not None and to.passed_over.startswith(
        f"Ray's address file {path} names {dead}, where nothing answers ("
    )
    assert to.passed_over.endswith("; a cluster that ended without `ray stop`)")
    assert to.note == f"{to.passed_over}: starting a local Ray cluster"


def test_auto_asks_for_a_running_cluster_and_a_dead_record_is_none(ray_tmp: Path, dead: str) -> None:
    record(ray_tmp, dead)
    with pytest.raises(NoClusterAnswers) as raised:
        connection("auto")
    assert raised.value.reason.startswith(f"no Ray cluster answers at auto: Ray's address file {ray_tmp}")
    assert str(raised.value).endswith(
        ": start one (ray start --head) or give its address (--ray-address, RAY_ADDRESS)"
    )


def test_an_address_given_is_checked_and_a_record_is_never_read(
    ray_tmp: Path, dead: str, listening: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    record(ray_tmp, dead)
    assert connection(listening) == Connection(listening, listening)
    with pytest.raises(NoClusterAnswers, match=rf"^no Ray cluster answers at {dead} \("):
        connection(dead)
    monkeypatch.setenv("RAY_ADDRESS", listening)  # Ray reads it itself: nothing to hand ray.init
    assert connection(None) == Connection(None, listening)
    monkeypatch.setenv("RAY_ADDRESS", dead)
    with pytest.raises(NoClusterAnswers, match=rf"^no Ray cluster answers at {dead} \("):
        connection(None)
    assert connection("ray://head:10001") == Connection(
        "ray://head:10001", "ray://head:10001"
    )  # Ray's client


def test_a_client_takes_token_mode_where_ray_start_would(tmp_path: Path) -> None:
    """Ray turns token authentication on for `ray start` wherever a token is found, and off for a client
    unless RAY_AUTH_MODE says otherwise: autotune's client follows `ray start`'s rule."""
    home = {"HOME": str(tmp_path)}
    assert token_auth_environment(home) == {}
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("ab" * 32)
    assert token_auth_environment(home) == {"RAY_AUTH_MODE": "token"}
    assert token_auth_environment({**home, "RAY_AUTH_MODE": "disabled"}) == {}  # the user's word stands
    empty = {"HOME": str(tmp_path / "elsewhere")}
    assert token_auth_environment({**empty, "RAY_AUTH_TOKEN": "cd" * 32}) == {"RAY_AUTH_MODE": "token"}
    token = tmp_path / "token"
    token.write_text("ef" * 32)
    assert token_auth_environment({**empty, "RAY_AUTH_TOKEN_PATH": str(token)}) == {"RAY_AUTH_MODE": "token"}
    assert token_auth_environment({**empty, "RAY_AUTH_TOKEN_PATH": str(tmp_path / "none")}) == {}
