"""Shared fixtures: a per-test cache dir, and running trials of the synthetic script through the real launcher."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
import pytest
import torch

from autotune.core.plans import Plan
from autotune.hardware.devices import cpu_device
from autotune.hardware.meters import RssMeter
from autotune.storage.database import creation_lock, parse_url
from autotune.trials.command import TrialCommand
from autotune.trials.measurement import run_trial
from autotune.trials.result import TrialResult
from autotune.trials.settings import TrialSettings

ROOT = Path(__file__).parent.parent
SCRIPTS = Path(__file__).parent / "scripts"
SYNTHETIC = SCRIPTS / "synthetic.py"
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))


def torchrun(script: Path | str, *args: str, ranks: int = 2) -> list[str]:
    """The command that runs ``script`` with ``args`` on ``ranks`` local ranks (torchrun --standalone)."""
    return [TORCHRUN, "--standalone", "--nproc-per-node", str(ranks), str(script), *args]


EXAMPLES = ROOT / "examples"
MiB = 2**20
AUTOTUNE = str(Path(sys.executable).with_name("autotune"))

# glibc keeps freed blocks in its heap by default, so a CPU trial's peak RSS carries up to a few hundred MiB of
# retained heap that varies from run to run (differences of two peaks here: 128 to 202 MiB for the same
# plans). A fixed mmap threshold returns every large block on free: peaks repeat to 0.2 MiB, and the
# comparison measures the activations the probe predicts rather than the allocator's heap policy.
DETERMINISTIC_CPU_ALLOCATOR = {"MALLOC_MMAP_THRESHOLD_": "65536"}


@pytest.fixture(autouse=True)
def no_time_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs without a wall-clock limit unless a test gives one (--time-limit wins over the environment).

    The default limit (3 minutes, or 10x the probe) is a clock: on CI's busy 2-core machine a run of a
    test that asserts its sequence of trials once reached it, and the leader was answered unverified. Like
    the load below, the clock is an input here; the limit's own rules are tested with --time-limit given
    (tests/search/test_cost.py)."""
    monkeypatch.setenv("AUTOTUNE_TIME_LIMIT", "0")


@pytest.fixture(autouse=True)
def quiet_machine(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """The machine's CPU pressure, as the tuner reads it in this process, pinned at none.

    The search reads the kernel's CPU pressure over each trial and measures again what a busy machine read
    (autotune.search.noise). Tests run two at a time on two cores, so the real pressure would decide, run to
    run, whether a test's exact sequence of trials has a re-measurement in it. The load is an input here like
    a clock: tests that assert sequences get a quiet machine; the load's own rules are tested on records that
    carry the load (tests/search/test_robustness.py), and reading it on counters (tests/hardware/test_load.py).
    Tuners started as processes read the same file (AUTOTUNE_CPU_PRESSURE_PATH)."""
    path = tmp_path_factory.getbasetemp() / "cpu-pressure"
    path.write_text(
        "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
    )
    monkeypatch.setenv(
        "AUTOTUNE_CPU_PRESSURE_PATH", str(path)
    )  # read by this process and every tuner it starts


TEST_JOB_KEY = "0123456789abcdef" * 4  # what every test's submitters and workers share, unless a test says


@pytest.fixture(autouse=True)
def job_key(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test holds the same job key (autotune.workers.signing), as a deployment's submitters and
    workers do; the user's own config dir (where ``autotune keygen`` writes) is out of reach."""
    monkeypatch.setenv("AUTOTUNE_JOB_KEY", TEST_JOB_KEY)
    monkeypatch.delenv("AUTOTUNE_JOB_KEY_FILE", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.getbasetemp() / "config"))
    return TEST_JOB_KEY


def measure_example(
    cache: Path, plan: str, env: dict[str, str] | None = None, batch: int = 32, model: tuple[str, ...] = ()
) -> dict:
    """`autotune measure --json` of examples/gpt.py (its defaults unless ``model`` gives arguments)."""
    argv = [
        AUTOTUNE,
        "measure",
        "-b",
        str(batch),
        "--plan",
        plan,
        "--device",
        "cpu",
        "--json",
        "--steps",
        "4",
    ]
    argv += ["--cache-dir", str(cache), str(EXAMPLES / "gpt.py"), *(("--", *model) if model else ())]
    proc = subprocess.run(
        argv, capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})}
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="session")
def example_peaks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """examples/gpt.py at batch 32 with the plans `none` and `all`, each measured once with the
    deterministic allocator, for the tests that compare the two peaks."""
    cache = tmp_path_factory.mktemp("example-peaks")
    return {plan: measure_example(cache, plan, DETERMINISTIC_CPU_ALLOCATOR) for plan in ("none", "all")}


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    path = tmp_path / "cache"
    path.mkdir()
    return path


@pytest.fixture
def synthetic(cache: Path) -> Callable[..., TrialResult]:
    """Run one real trial of tests/scripts/synthetic.py on the CPU meter: synthetic(batch, *flags, **settings)."""

    def run(batch_size: int = 1, *flags: str, **settings: float) -> TrialResult:
        settings = {"warmup_steps": 1, "measured_steps": 3, "startup_timeout": 30, "timeout": 60, **settings}
        command = TrialCommand.parse([str(SYNTHETIC), *flags])
        return run_trial(
            command,
            batch_size,
            Plan.none(),
            cpu_device(),
            RssMeter(),
            TrialSettings(**settings),  # type: ignore[arg-type]
            cache,
            dict(os.environ),
        )

    return run


def in_a_fresh_interpreter(code: str, not_imported: tuple[str, ...] = (), timeout: float = 120) -> str:
    """Run ``code`` in a new Python process; its stdout. Fails if the process fails or imported any module
    of ``not_imported``: what the CLI's lazy imports keep out of commands that need no trial."""
    check = (
        f"\nimport sys\n_heavy = set({not_imported!r}) & set(sys.modules)\n"
        "assert not _heavy, f'imported {sorted(_heavy)}'\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code + check], capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def cli_in_a_fresh_interpreter(argv: list[str], not_imported: tuple[str, ...], timeout: float = 120) -> str:
    """``autotune ARGV`` through autotune.cli.main in a new process (exit 0 required); see in_a_fresh_interpreter."""
    code = f"from autotune.cli import cli\ntry:\n    cli({argv!r})\nexcept SystemExit as e:\n    assert e.code == 0, e.code\n"
    return in_a_fresh_interpreter(code, not_imported, timeout)


# the proposed_by of a configuration read again on purpose: a second opinion, not a trial of --trials' own
# (autotune.search.records.TrialRecord.remeasured)
def finder_options(cache: Path, options: dict[str, Any]) -> dict[str, Any]:
    """A finder test's options (tests/finder, tests/compat/test_finder_callbacks.py) with its defaults: the
    cache dir, short trials of a fixed length, and as many trial runs as the test asserts (the probe, one
    reading per configuration, the winner's verification). The search's own rules (a busy machine's
    disagreeing readings measured again) are tested on the CLI's trials."""
    return {
        "cache_dir": str(cache),
        "settings": {"warmup_steps": 1, "measured_steps": 3, "tight": 0},
        "trials": 2 + len(options["batch_sizes"].split(",")),
        **options,
    }


SECOND_OPINIONS = ("re-measure", "fresh")


def trial_summary(trials: list[optuna.trial.FrozenTrial]) -> list[tuple[int, str, str | None, str | None]]:
    """(number, state, kind, worker) of each trial: what a failed assertion about a study shows."""
    return [(t.number, t.state.name, t.user_attrs.get("kind"), t.user_attrs.get("worker")) for t in trials]


def alive(pid: int) -> bool:
    """True while /proc has a non-zombie process ``pid`` (kill -0 would count zombies as alive)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def python() -> str:
    return sys.executable


# A real PostgreSQL server for the storage tests, started here on loopback (Debian's postgresql package:
# .ci/run installs it where missing). Its password holds the characters that break naive URL handling.
PG_PASSWORD = "p{w}@d%:x"


def _pg_binary(name: str) -> str | None:
    import glob
    import shutil

    return shutil.which(name) or next(
        iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None
    )


@pytest.fixture(scope="session")
def postgres_server():
    """(host, port, user, password) of a PostgreSQL server running for this test session."""
    import shutil
    import socket
    import subprocess
    import tempfile

    initdb, pg_ctl = _pg_binary("initdb"), _pg_binary("pg_ctl")
    if initdb is None or pg_ctl is None:
        if os.environ.get("CI"):
            pytest.fail("PostgreSQL's initdb is missing: .ci/run installs Debian's postgresql package")
        pytest.skip("no PostgreSQL server binaries (apt-get install postgresql)")
    root = Path(tempfile.mkdtemp(prefix="autotune-pg-"))
    root.chmod(0o755)  # the server runs as the postgres user when the tests run as root
    (root / "pw").write_text(PG_PASSWORD)
    as_server = []
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
        shutil.chown(root / "pw", "postgres")
        as_server = ["runuser", "-u", "postgres", "--"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    subprocess.run(
        [
            *as_server,
            initdb,
            "-D",
            str(root / "data"),
            "-U",
            "autotune",
            "--pwfile",
            str(root / "pw"),
            "--auth",
            "scram-sha-256",
            "-E",
            "UTF8",
        ],
        check=True,
        capture_output=True,
    )
    options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c max_connections=200"
    subprocess.run(
        [*as_server, pg_ctl, "-D", str(root / "data"), "-l", str(root / "log"), "-o", options, "-w", "start"],
        check=True,
        capture_output=True,
    )
    try:
        yield ("127.0.0.1", port, "autotune", PG_PASSWORD)
    finally:
        subprocess.run(
            [*as_server, pg_ctl, "-D", str(root / "data"), "-m", "immediate", "stop"], capture_output=True
        )
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def postgres_url(postgres_server) -> str:
    """A fresh, empty database on the session's server, as a URL with the password percent-encoded."""
    import uuid
    from urllib.parse import quote

    import psycopg

    host, port, user, password = postgres_server
    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(
        host=host, port=port, user=user, password=password, dbname="postgres", autocommit=True
    ) as c:
        c.execute(f"CREATE DATABASE {name}")
    return f"postgresql://{user}:{quote(password, safe='')}@{host}:{port}/{name}"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def storage(request, tmp_path) -> str:
    """The same test on each storage: SQLite in the cache dir, and a real PostgreSQL server."""
    if request.param == "postgres":
        return request.getfixturevalue("postgres_url")
    return f"sqlite:///{tmp_path / 'autotune.db'}"


def wait_for(condition: Callable[[], object], timeout: float = 120.0) -> None:
    """Poll ``condition`` every 0.1 s until it holds; fail the test after ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, "timed out waiting"
        time.sleep(0.1)


def stored_trials(storage: str, study: str) -> list[optuna.trial.FrozenTrial]:
    """The trials of ``study`` as Optuna itself reads them (none before the study exists). Optuna creates
    its tables when it finds none, so this takes autotune's creation lock: polled while a tuner creates a
    fresh database, a bare ``load_study`` raced it to stamp Optuna's alembic_version (CI, stop 37)."""
    url = storage.replace("postgresql://", "postgresql+psycopg://")
    try:
        with creation_lock(parse_url(url)):
            return optuna.load_study(study_name=study, storage=url).get_trials()
    except KeyError:
        return []


def trial_pids(cache: Path, started_by: int | None = None) -> list[int]:
    """Live trial processes whose request lies under ``cache`` (from /proc, not kill -0); with
    ``started_by``, only those of that tuner or worker (trial folders are named <time>-<pid>-<n>)."""
    pattern = rb"AUTOTUNE_TRIAL_REQUEST=" + re.escape(str(cache).encode()) + rb"/trials/"
    if started_by is not None:
        pattern += rb"[^/]*-%d-" % started_by
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                environ = Path(f"/proc/{entry}/environ").read_bytes()
            except OSError:
                continue
            if re.search(pattern, environ) and alive(int(entry)):
                pids.append(int(entry))
    return pids


def trials_started(cache: Path, started_by: int | None = None) -> set[str]:
    """The trials under ``cache`` that have started: each live trial process, and each configuration a warm
    process was sent (its ``next-K.json``, autotune.trials.warm; the message that ends it is none)."""
    started = {f"pid {pid}" for pid in trial_pids(cache, started_by)}
    folders = "*" if started_by is None else f"*-{started_by}-*"
    for message in cache.glob(f"trials/{folders}/next-*.json"):
        with contextlib.suppress(OSError, ValueError):
            if json.loads(message.read_text())["request"]:
                started.add(str(message))
    return started


def signal_as_a_trial_starts(
    proc: subprocess.Popen, sig: int, cache: Path, started_by: int | None = None
) -> None:
    """Send ``sig`` to ``proc`` as soon as a new trial starts (a trial process not alive when this is called,
    or a warm process's next configuration): the signal lands in the trial's first ~0.1 s, never as it ends.
    Which trial it hit is then read from the database, not guessed before the signal (a trial seen RUNNING
    may have finished by then)."""
    before = trials_started(cache, started_by)
    wait_for(lambda: trials_started(cache, started_by) - before)
    proc.send_signal(sig)


def synthetic_study(cache: Path, plans: str, *script_args: str) -> str:
    """A real study of the synthetic script for the report and rendering tests: every configuration of batch
    sizes 8 and 16 x ``plans`` under 200 MiB, measured (``--exhaustive``); returns its name."""
    proc = subprocess.run(
        [
            AUTOTUNE, "run", "--json", "--exhaustive", "--device", "cpu", "--budget", "200MiB",
            "--batch-sizes", "8,16", "--plans", plans, "--cache-dir", str(cache),
            "--", "python", str(SYNTHETIC), *script_args,
        ],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)["study"]


class Block(torch.nn.Module):
    """A residual MLP block: the repeated module of the tiny models that plans are applied to in-process."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(16, 64)
        self.out = torch.nn.Linear(64, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.out(torch.relu(self.fc(x)))


class Blocks(torch.nn.Module):
    """Four Blocks and a head: the tiny model plans are applied to and checked on in-process."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block() for _ in range(4))
        self.head = torch.nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)
