"""The tuning loop on real trials of the synthetic script: memory (real, measured) and speed are known
functions of batch size and plan, so the winner is known exactly.

Fixed memory ≈ 35 MiB (interpreter + 20 MiB base), 8 MiB per sample; limit = 290 MiB x 0.95 = 275.5 MiB.
  none (no saving)                     fits up to 24 (32 -> 291 MiB)   0.05+24*0.0005        -> ~387 samples/s
  A:1  (saves 50%, +25% time)          fits up to 48 (64 -> 291 MiB)   0.05+48*0.0005*1.25   -> ~600 samples/s
  B:1  (saves 75%, +400% time)         fits up to 96 (128 -> 291 MiB)  0.05+96*0.0005*5      -> ~331 samples/s
"""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import optuna
import pytest
from click.testing import CliRunner

from autotune.cli import cli
from autotune.storage.schema import HEAD_REVISION

from conftest import SYNTHETIC, MiB, cli_in_a_fresh_interpreter

ARGS = [
    "--",
    *"--base-mib 20 --per-sample-mib 8 --step-seconds 0.05 --per-sample-seconds 0.0005".split(),
    "--plan-effects",
    "A=0.5:0.25,B=0.75:4",
]
OPTIONS = "--plans none;A;B --batch-sizes 1-128 --steps 3 --warmup-steps 1 --device cpu".split()


def run(cache: Path, *extra: str, budget: str = "290MiB", trials: int = 10, args: list[str] = ARGS):
    result = CliRunner().invoke(
        cli,
        [
            "run",
            "--budget",
            budget,
            "--trials",
            str(trials),
            "--cache-dir",
            str(cache),
            *OPTIONS,
            *extra,
            str(SYNTHETIC),
            *args,
        ],
    )
    return result


def study_trials(cache: Path, name: str) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name=name, storage=f"sqlite:///{cache / 'autotune.db'}").get_trials()


def measured(cache: Path, study: str) -> list[tuple[int, str]]:
    """The configurations measured, in order, each once: a re-measurement (a busy machine's reading read
    again, autotune.search.noise) is not a configuration tried; it must be of one measured before it."""
    trials = [t for t in study_trials(cache, study) if t.user_attrs["kind"] == "measured"]
    first: list[tuple[int, str]] = []
    for t in trials:
        config = (t.params["batch_size"], t.params["plan"])
        if t.user_attrs["proposed_by"] == "re-measure":
            assert config in first, f"{config} was read again before it was measured"
        else:
            first.append(config)
    assert len(first) == len(set(first)), first
    return first


def test_the_search_finds_the_exact_winner_in_six_trials_and_says_why_it_stopped(tmp_path) -> None:
    """Calibration (the smallest batch, then ~4x), none's frontier, each plan once at that batch (it might
    save enough to reach 128), A:1's frontier once its slope is measured; then B:1 at its frontier (96)
    could reach at most ~none's speed at 96 divided by its measured overhead (1.7x): below A:1@48."""
    result = run(tmp_path, "--json", "--study", "exact")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert (data["batch_size"], data["plan"]) == (48, "A:1")
    limit = data["limit_bytes"]
    assert limit == int(290 * MiB * 0.95)
    assert data["peak_bytes"] <= limit
    assert measured(tmp_path, "exact") == [
        (1, "none"),
        (4, "none"),
        (24, "none"),
        (24, "A:1"),
        (24, "B:1"),
        (48, "A:1"),
    ]
    assert data["stopped"].startswith(
        "stopped after 6 trials: no remaining configuration is predicted to beat A:1@48"
    )
    assert "; the closest, " in data["stopped"]
    trials = study_trials(tmp_path, "exact")
    for t in trials:
        if t.user_attrs.get("kind") == "measured":
            for name in ("outcome", "peak_bytes", "samples_per_sec", "samples_per_sec_low", "log_dir"):
                assert name in t.user_attrs
            assert Path(t.user_attrs["log_dir"], "stderr.log").exists()
            fits = t.user_attrs["peak_bytes"] <= limit
            assert (t.constraints["0"] <= 0) == fits
    verification = [t for t in trials if t.user_attrs["kind"] == "verification"]
    assert [(t.params["batch_size"], t.params["plan"]) for t in verification] == [(48, "A:1")]
    assert verification[0].user_attrs["peak_bytes"] <= limit


def test_exhaustive_measures_every_frontier_then_samples_to_the_trials_asked(tmp_path) -> None:
    """Each plan's largest predicted fit in the space's order, the unmeasured plans starting from none's
    slope (a safe overestimate) and moving up once measured; then the sampler, to what --trials 10 leaves
    it: 8, after the probe and before the verification's 1."""
    result = run(tmp_path, "--json", "--study", "exact", "--exhaustive")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert (data["batch_size"], data["plan"]) == (48, "A:1")
    assert data["stopped"] == (
        "stopped after 8 trials: --trials 10 counts every trial run, the probe's and the verification's: "
        "the 1 left is kept for the verification"
    )
    ran = measured(tmp_path, "exact")
    assert ran[:7] == [
        (1, "none"),
        (4, "none"),
        (24, "none"),
        (24, "A:1"),
        (48, "A:1"),
        (24, "B:1"),
        (96, "B:1"),
    ]
    assert len(ran) == 8


def test_the_same_run_again_makes_no_trial_and_force_retunes(tmp_path) -> None:
    assert run(tmp_path, "--study", "again", trials=7).exit_code == 0
    before = len(study_trials(tmp_path, "again"))
    second = run(tmp_path, "--study", "again", trials=7)
    assert second.exit_code == 0, second.output
    assert "zero trials" in second.output
    assert "0 trial runs (the probe's included) in this run" in " ".join(second.output.split())
    assert len(study_trials(tmp_path, "again")) == before
    forced = run(tmp_path, "--study", "again", "--force", trials=7)
    assert forced.exit_code == 0
    said = " ".join(forced.output.split())  # the summary wraps at the terminal's width
    # --trials 7: the probe's run, 5 search trials, the verification's 1
    assert "5 configurations measured;" in said
    runs = "; 7 trial runs (the probe's included) in this run, each counted toward --trials"
    assert runs in said, forced.output  # the whole output where it is not (pytest shortens a comparison's)


def test_best_answers_from_the_database(tmp_path) -> None:
    assert run(tmp_path, trials=8).exit_code == 0
    answer = CliRunner().invoke(cli, ["best", "--cache-dir", str(tmp_path), "--json"])
    assert answer.exit_code == 0, answer.output
    data = json.loads(answer.stdout)
    assert {"batch_size", "plan", "peak_bytes", "samples_per_sec", "budget_bytes", "study"} <= data.keys()
    assert (data["batch_size"], data["plan"], data["verified"]) == (48, "A:1", True)
    # The winner's throughput is an interval over its readings (its trial and its verification), never one number.
    assert data["samples_per_sec_low"] < data["samples_per_sec"] < data["samples_per_sec_high"]
    assert data["readings"] == 2
    text = CliRunner().invoke(cli, ["best", "--cache-dir", str(tmp_path)]).output
    low, high = f"{data['samples_per_sec_low']:,.1f}", f"{data['samples_per_sec_high']:,.1f}"
    assert f"{data['samples_per_sec']:,.1f} samples/s ({low}-{high} over 2 readings)" in text
    shown = CliRunner().invoke(cli, ["show", data["study"], "--cache-dir", str(tmp_path)]).output
    assert f"best: batch 48, plan A:1: {data['samples_per_sec']:,.1f} samples/s ({low}-{high}" in shown
    by_script = CliRunner().invoke(
        cli,
        [
            "best",
            "--cache-dir",
            str(tmp_path),
            "--budget",
            "290MiB",
            "--device",
            "cpu",
            "--env",
            str(SYNTHETIC),
            *ARGS,
        ],
    )
    assert by_script.exit_code == 0, by_script.output
    assert by_script.output.splitlines() == ["export AUTOTUNE_BATCH_SIZE=48", "export AUTOTUNE_PLAN=A:1"]
    # A verified winner is answered from autotune's tables alone: neither Optuna (importing it and building
    # its storage was 0.5 s of the 0.75 s `best` took) nor torch is imported.
    argv = ["best", "--cache-dir", str(tmp_path), "--budget", "290MiB", "--device", "cpu", "--json"]
    output = cli_in_a_fresh_interpreter(
        [*argv, str(SYNTHETIC), *ARGS], not_imported=("optuna", "torch", "numpy")
    )
    assert json.loads(output) == data
    # A budget with no winner of its own is answered from the measured trials that fit, and says so.
    smaller = CliRunner().invoke(
        cli,
        [
            "best",
            "--cache-dir",
            str(tmp_path),
            "--budget",
            "200MiB",
            "--device",
            "cpu",
            "--json",
            str(SYNTHETIC),
            *ARGS,
        ],
    )
    assert smaller.exit_code == 0, smaller.output
    data = json.loads(smaller.stdout)
    assert data["verified"] is False
    assert data["source"].startswith("not verified")
    assert data["peak_bytes"] <= 200 * MiB * 0.95


def test_another_budget_starts_from_the_measured_trials(tmp_path) -> None:
    assert run(tmp_path, "--study", "big", trials=8).exit_code == 0
    result = run(tmp_path, "--study", "small", "--json", budget="200MiB", trials=5)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    # limit 190 MiB: none up to 16, A up to 32 (~0.05+32*0.000625 -> 457/s), B up to 64 (0.05+64*0.0025 -> 305/s)
    assert (data["batch_size"], data["plan"]) == (32, "A:1")
    kinds = [t.user_attrs["kind"] for t in study_trials(tmp_path, "small")]
    assert kinds.count("warm-start") >= 6


def test_a_hopeless_budget_ends_once_every_plan_failed_at_batch_1_with_one_line_and_the_budget_it_needs(
    tmp_path,
) -> None:
    """Batch 1 does not fit 30 MiB without a plan, nor with the plan that may save the most (B:1, the last
    of the space, whose saving nothing predicts), nor with A: exit 6 once each plan was measured not to fit
    (no plan's failure is taken to mean another fails), not a search of ten trials."""
    result = run(tmp_path, "--study", "tiny", budget="30MiB", trials=10)
    assert result.exit_code == 6
    last = result.output.strip().splitlines()[-1]
    assert re.fullmatch(
        r"Error: no configuration fits 28.50 MiB \(budget minus headroom\): the smallest batch, 1, does not fit "
        r"with any plan, not even B:1 \(the one that saves the most\); the smallest peak measured was at least ([\d.]+) MiB "
        r"\(batch 1, plan (none|A:1|B:1), trial [012]\); it needs a budget of at least ([\d.]+) MiB",
        last,
    ), last
    peak, needed = re.findall(r"at least ([\d.]+) MiB", last)
    assert float(needed) == pytest.approx(float(peak) / 0.95, abs=0.01)
    trials = study_trials(tmp_path, "tiny")
    assert [(t.params["batch_size"], t.params["plan"]) for t in trials] == [
        (1, "none"),
        (1, "B:1"),
        (1, "A:1"),
    ]
    assert all(t.user_attrs["outcome"] == "over-budget" for t in trials)  # stopped by the guard at 28.5 MiB


def test_a_script_that_always_fails_shows_its_own_stderr(tmp_path) -> None:
    result = run(tmp_path, args=["--", "--crash-at", "0"])
    assert result.exit_code == 7
    assert "Error: the script's first trial failed" in result.output
    assert "ValueError: synthetic crash at step 0" in result.output
    assert "autotune/tuning.py" not in result.output  # the script's traceback, not autotune's


def test_a_corrupt_database_is_one_line_naming_the_file(tmp_path) -> None:
    (tmp_path / "autotune.db").write_bytes(b"this is not a database" * 100)
    for command in (["best"], ["studies"], ["run", "--budget", "1GB", str(SYNTHETIC)]):
        result = CliRunner().invoke(cli, [*command, "--cache-dir", str(tmp_path)])
        assert result.exit_code == 5, result.output
        assert (
            result.output.strip()
            == f"Error: cannot open the database {tmp_path / 'autotune.db'}: file is not a database"
        )


def test_a_database_written_by_a_newer_autotune_is_refused(tmp_path) -> None:
    assert CliRunner().invoke(cli, ["studies", "--cache-dir", str(tmp_path)]).exit_code == 0
    with sqlite3.connect(tmp_path / "autotune.db") as conn:
        conn.execute("UPDATE autotune_alembic_version SET version_num = '9999'")
    result = CliRunner().invoke(cli, ["studies", "--cache-dir", str(tmp_path)])
    assert result.exit_code == 5
    assert (
        f"revision 9999) is newer than this autotune knows ({HEAD_REVISION}): upgrade autotune"
        in result.output
    )


def test_an_optuna_database_gains_autotune_tables_and_keeps_its_trials(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'autotune.db'}"
    study = optuna.create_study(storage=url, study_name="theirs")
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=3)
    result = CliRunner().invoke(cli, ["studies", "--cache-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert len(optuna.load_study(study_name="theirs", storage=url).trials) == 3
    with sqlite3.connect(tmp_path / "autotune.db") as conn:
        assert conn.execute("SELECT version_num FROM autotune_alembic_version").fetchall() == [
            (HEAD_REVISION,)
        ]


@pytest.mark.parametrize("name", ["a/b", "..", "x" * 129, "tab\there"])
def test_bad_study_names(tmp_path, name) -> None:
    result = run(tmp_path, "--study", name)
    assert result.exit_code == 2
    assert result.output.startswith("Error: ")
    assert len(result.output.strip().splitlines()) == 1


@pytest.mark.slow
@pytest.mark.compat  # 90 s of real trials: CI's compatibility phase
def test_a_real_run_on_the_example_transformer(tmp_path) -> None:
    from conftest import EXAMPLES

    model = ["--", "--n-layer", "4", "--n-embd", "64", "--block-size", "64"]
    # --trials 7: the probe's run, 5 search trials, the verification's 1
    options = f"--budget 700MiB --trials 7 --batch-sizes 2-48 --steps 2 --warmup-steps 1 --device cpu --exhaustive --cache-dir {tmp_path}"
    argv = ["run", *options.split(), "--json", str(EXAMPLES / "gpt.py"), *model]
    result = CliRunner().invoke(cli, argv)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["peak_bytes"] <= data["limit_bytes"] < 700 * MiB
    measured = [t for t in data["trials"] if t["kind"] == "measured"]
    # Calibration on none (2, 8, and 32 if the rise from 2 to 8, ~23 MiB, is within 4x the RSS noise),
    # then the probe's plan space in frontier order: none, Block in full, and the operator-level plan
    # (keep matmul outputs, recompute the rest: the example computes attention with matmuls, so the probe
    # names no attention op).
    calibration = [t for t in measured if t["proposed_by"] == "calibration"]
    assert [t["batch_size"] for t in calibration] in ([2, 8], [2, 8, 32])
    after = [t["plan"] for t in measured if t["proposed_by"] != "calibration"]
    assert after == ["none", "Block:1", "Block:1/save=matmul"][: 5 - len(calibration)]
    # Seeded with the probe's savings, the first trial of each plan lands near its prediction.
    for t in [t for t in measured if t["plan"] != "none"]:
        assert abs(t["predicted_peak_bytes"] - t["peak_bytes"]) < 0.15 * t["peak_bytes"], t
    answer = CliRunner().invoke(cli, ["best", "--cache-dir", str(tmp_path), "--json"])
    assert json.loads(answer.stdout)["batch_size"] == data["batch_size"]
    shown = json.loads(
        CliRunner().invoke(cli, ["show", data["study"], "--cache-dir", str(tmp_path), "--json"]).stdout
    )
    checks = {c["plan"]: c for c in shown["plan_checks"]}
    assert checks["Block:1"]["predicted"] > 0 and checks["Block:1"]["measured"] is not None
    assert "Block:1/save=matmul" in checks
    again = CliRunner().invoke(cli, argv)
    assert json.loads(again.stdout)["new_trials"] == 0


def test_a_script_s_own_checkpointing_turned_off_wins_where_it_is_faster_at_a_smaller_batch(tmp_path) -> None:
    """own:off for a script that checkpoints by itself: 1.5x the memory per sample, half the per-sample
    time. none fits batch 24 (82.8 samples/s), own:off 16 (123): the search must try the plan that keeps
    more memory, which no saving would ever make worth a trial, and answer it."""
    args = ["--", *"--base-mib 20 --per-sample-mib 8 --step-seconds 0.05 --per-sample-seconds 0.01".split()]
    result = CliRunner().invoke(
        cli,
        [
            "run", "--budget", "300MiB", "--trials", "10", "--cache-dir", str(tmp_path), "--json",
            "--plans", "none;own:off", "--batch-sizes", "1-32", "--steps", "3", "--warmup-steps", "1",
            "--device", "cpu", str(SYNTHETIC), *args, "--plan-effects", "own:off=-0.5:-0.5",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert (data["batch_size"], data["plan"]) == (16, "own:off")


def test_a_leader_that_fails_verification_is_searched_past_not_fallen_back_from(tmp_path) -> None:
    """Memory that grows 6 MiB a step for 12 steps: none@24 fits in the search's 4 steps (252 MiB, limit
    275.5) and not once its verification has run on until the peak settled (300). The failure bounds none at 24, and the search goes on to 16, which
    verifies (230); the next fitting configuration measured before (4) was the answer."""
    args = ["--", *"--base-mib 20 --per-sample-mib 8 --step-seconds 0.05 --per-sample-seconds 0.0005".split()]
    result = CliRunner().invoke(
        cli,
        [
            "run", "--budget", "290MiB", "--trials", "10", "--cache-dir", str(tmp_path), "--json",
            "--plans", "none", "--batch-sizes", "1-128", "--steps", "3", "--warmup-steps", "1",
            "--device", "cpu", "--study", "grows", str(SYNTHETIC), *args, "--grow-mib", "6",
            "--grow-steps", "12",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert (data["batch_size"], data["plan"]) == (16, "none")
    verified = [
        (t.params["batch_size"], t.user_attrs["peak_bytes"] <= data["limit_bytes"])
        for t in study_trials(tmp_path, "grows")
        if t.user_attrs.get("kind") == "verification"
    ]
    assert verified[0] == (24, False) and verified[-1] == (16, True)
