"""autotune on a real PostgreSQL server (started by the test setup): the storage for many workers.

Racing first starts and kill -9/resume run on PostgreSQL too, in test_resume.py (parametrized by storage)."""

from __future__ import annotations

import json
import subprocess

import optuna
import psycopg
import pytest
from sqlalchemy.engine import make_url

from conftest import AUTOTUNE, PG_PASSWORD, SYNTHETIC

pytestmark = pytest.mark.postgres
ARGS = [
    "--",
    *"--base-mib 20 --per-sample-mib 8 --step-seconds 0.05 --per-sample-seconds 0.0005".split(),
    "--plan-effects",
    "A=0.5:0.25,B=0.75:4",
]


def rows(url: str, query: str) -> list[tuple]:
    parsed = make_url(url)
    with psycopg.connect(
        host=parsed.host,
        port=parsed.port,
        user=parsed.username,
        password=parsed.password,
        dbname=parsed.database,
    ) as conn:
        return conn.execute(query).fetchall()


def test_the_search_on_postgresql_finds_the_exact_winner(postgres_url, tmp_path) -> None:
    options = "--budget 290MiB --trials 8 --plans none;A;B --batch-sizes 1-128 --steps 3 --warmup-steps 1 --device cpu"
    argv = [
        AUTOTUNE,
        "run",
        *options.split(),
        "--cache-dir",
        str(tmp_path),
        "--storage",
        postgres_url,
        "--json",
        "--study",
        "exact",
        str(SYNTHETIC),
        *ARGS,
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert (data["batch_size"], data["plan"]) == (48, "A:1")
    trials = optuna.load_study(
        study_name="exact", storage=postgres_url.replace("postgresql://", "postgresql+psycopg://")
    ).trials
    # the stopping rule ends it as on SQLite (tests/search/test_tuning.py): six trials, the stop stored
    assert sum(t.user_attrs.get("kind") == "measured" and "outcome" in t.user_attrs for t in trials) == 6
    assert data["stopped"].startswith("stopped after 6 trials: no remaining configuration is predicted")
    best = subprocess.run(
        [AUTOTUNE, "best", "--storage", postgres_url, "--json"], capture_output=True, text=True
    )
    assert json.loads(best.stdout)["batch_size"] == 48


def test_the_password_works_and_appears_nowhere(postgres_url, tmp_path) -> None:
    assert "%7Bw%7D%40d%25%3Ax" in postgres_url  # {, }, @, %, : percent-encoded in the URL
    argv = [
        AUTOTUNE,
        "run",
        "--budget",
        "290MiB",
        "--trials",
        "3",
        "--plans",
        "none",
        "--steps",
        "2",
        "--device",
        "cpu",
        "--cache-dir",
        str(tmp_path),
        "--storage",
        postgres_url,
        str(SYNTHETIC),
        *ARGS,
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    shown = proc.stdout + proc.stderr
    assert "***" in shown  # the database is named, with its password hidden
    for secret in (PG_PASSWORD, "%7Bw%7D%40d%25%3Ax"):
        assert secret not in shown
        for path in tmp_path.rglob("*"):
            if path.is_file():
                assert secret not in path.read_text(errors="replace"), path
        stored = rows(
            postgres_url,
            "SELECT value_json FROM trial_user_attributes UNION ALL "
            "SELECT value_json FROM trial_system_attributes UNION ALL "
            "SELECT value_json FROM study_user_attributes UNION ALL "
            "SELECT details::text FROM autotune_workloads",
        )
        assert not [value for (value,) in stored if secret in value]
    wrong = postgres_url.replace("%7Bw%7D", "nope")
    bad = subprocess.run(
        [AUTOTUNE, "studies", "--storage", wrong], capture_output=True, text=True, timeout=60
    )
    assert bad.returncode == 5
    warning, _, error = bad.stderr.partition("\n")
    assert warning.startswith("Warning: the password in --storage ")
    assert error.startswith("Error: cannot open the database postgresql+psycopg://autotune:***@127.0.0.1:")
    assert len(error.strip().splitlines()) == 1
    assert "nope" not in bad.stderr
