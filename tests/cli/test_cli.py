"""The command line, through click's CliRunner and as a real console-script process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

from autotune.cli import cli

from conftest import AUTOTUNE, SYNTHETIC, MiB, cli_in_a_fresh_interpreter


def measure_cli(cache: Path, *args: str) -> Result:
    """``autotune measure ARGS`` through CliRunner, on the CPU, with the test's own cache dir."""
    return CliRunner().invoke(cli, ["measure", "--device", "cpu", "--cache-dir", str(cache), *args])


def test_help_lists_every_command_with_a_description() -> None:
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    for name, command in cli.commands.items():
        assert command.help, f"{name} has no docstring"
        assert name in result.output


def test_help_and_the_console_script_never_import_torch() -> None:
    """--help loads the command group only: no trial machinery, no database, no search."""
    heavy = ("torch", "optuna", "numpy", "sqlalchemy", "rich")
    assert "measure" in cli_in_a_fresh_interpreter(["--help"], not_imported=heavy)
    proc = subprocess.run([AUTOTUNE, "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "measure" in proc.stdout


def test_measure_json_reports_the_trial(tmp_path) -> None:
    result = measure_cli(
        tmp_path,
        str(SYNTHETIC),
        *"-b 3 --steps 2 --warmup-steps 1 --json --budget 2GiB -- --per-sample-mib 20".split(),
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert {"outcome", "batch_size", "plan", "peak_bytes", "samples_per_sec", "device"} <= data.keys()
    assert [data[k] for k in ("outcome", "batch_size", "plan", "device")] == ["complete", 3, "none", "cpu"]
    assert 60 * MiB < data["peak_bytes"] < 2**31
    assert (data["budget_bytes"], data["fits"]) == (2**31, True)
    # --steps 2 measured, and more while the readings' interval is wider than --tight's 3% (a loaded machine:
    # CI's fresh run read 3): the trial measures on by design
    assert len(data["step_seconds"]) >= 2


def test_measure_over_budget_exits_1_and_says_so(tmp_path) -> None:
    result = measure_cli(
        tmp_path, str(SYNTHETIC), *"-b 4 --steps 1 --budget 50MB -- --per-sample-mib 30".split()
    )
    assert result.exit_code == 1
    assert "does not fit" in result.output


def test_a_failing_trial_shows_its_stderr_and_exits_1(tmp_path) -> None:
    result = measure_cli(tmp_path, str(SYNTHETIC), "-b", "1", "--", "--crash-at", "1")
    assert result.exit_code == 1
    assert "outcome      failed" in result.output
    assert "ValueError: synthetic crash at step 1" in result.output
    assert (
        "Traceback" not in result.output.split("\n\n")[0]
    )  # the summary is autotune's, the traceback the script's


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--budget", "40 GB/s"], "Error: invalid budget '40 GB/s': expected a number and a unit"),
        (["--budget", "٤٠GB"], "Error: invalid budget '٤٠GB'"),
        (["--budget", "99TB"], "is more than the device has"),
        (["--plan", "Block:2"], "Error: plan ratio for Block must be in (0, 1], got 2.0"),
        (["--device", "tpu"], "Error: invalid device 'tpu'"),
        (["--steps", "0"], "Invalid value for '--steps'"),
    ],
)
def test_bad_input_is_one_line_and_a_nonzero_exit(tmp_path, args, message) -> None:
    result = measure_cli(tmp_path, str(SYNTHETIC), "-b", "1", "--steps", "1", *args)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output


def test_a_missing_script_and_a_missing_command_are_one_line(tmp_path) -> None:
    result = measure_cli(tmp_path, "nope.py", "-b", "1")
    assert (result.exit_code, result.output.strip()) == (2, "Error: script not found: nope.py")
    result = measure_cli(tmp_path, "-b", "1", "--", "no-such-program-xyz")  # refused before a trial (#20)
    assert (result.exit_code, result.output.strip()) == (
        2,
        "Error: no-such-program-xyz: command not found on the PATH",
    )
    assert not (tmp_path / "trials").exists()


def test_command_template_substitutes_the_batch_size_and_injects_the_harness(tmp_path) -> None:
    out = tmp_path / "argv.txt"
    script = tmp_path / "template.py"
    script.write_text(
        f"import sys, autotune\nopen({str(out)!r}, 'w').write(' '.join(sys.argv[1:]))\n"
        "for _ in range(100):\n    autotune.step()\n"
    )
    template = [sys.executable, "-u", str(script), "--bs", "{batch_size}"]
    result = measure_cli(tmp_path, *"-b 12 --steps 1 --json --".split(), *template)
    assert result.exit_code == 0, result.output
    assert out.read_text() == "--bs 12"
    assert json.loads(result.output)["batch_size"] == 12


def test_a_non_python_command_gets_the_runtime_through_sitecustomize(tmp_path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        "import autotune\nfor _ in range(100):\n    autotune.step(samples=autotune.batch_size())\n"
    )
    wrapper = tmp_path / "train.sh"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} {script} "$@"\n')
    wrapper.chmod(0o755)
    result = measure_cli(tmp_path, "-b", "6", "--steps", "2", "--json", "--", str(wrapper))
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["outcome"] == "complete"


def test_python_dash_c_is_refused(tmp_path) -> None:
    result = measure_cli(tmp_path, "-b", "1", "--", sys.executable, "-c", "pass")
    assert (result.exit_code, result.output.strip()) == (
        2,
        "Error: a 'python -c' command cannot be measured: put the code in a script",
    )


@pytest.mark.slow
@pytest.mark.compat  # example-transformer trials (a session fixture): CI's compatibility phase (core suite time)
def test_checkpointing_all_lowers_the_measured_peak_of_the_example_transformer(example_peaks) -> None:
    none, full = example_peaks["none"], example_peaks["all"]
    assert (none["plan"], full["plan"]) == ("none", "Block:1")
    assert none["peak_bytes"] - full["peak_bytes"] > 40 * MiB, (
        none["peak_bytes"] / MiB,
        full["peak_bytes"] / MiB,
    )


def test_storage_is_only_importable_as_autotune_storage() -> None:
    import importlib.util

    import autotune.storage

    assert autotune.storage.__name__ == "autotune.storage"
    proc = subprocess.run([sys.executable, "-c", "import storage"], capture_output=True, cwd="/", timeout=60)
    assert proc.returncode != 0
    assert importlib.util.find_spec("autotune.storage") is not None


def test_every_command_has_help() -> None:
    for name, command in cli.commands.items():
        assert isinstance(command, click.Command)
        assert CliRunner().invoke(cli, [name, "--help"]).exit_code == 0


def test_debug_shows_the_traceback_instead_of_one_line(tmp_path) -> None:
    from autotune.core.errors import InputError

    plain = CliRunner().invoke(cli, ["measure", "nope.py", "-b", "1", "--cache-dir", str(tmp_path)])
    assert (plain.exit_code, plain.output.strip()) == (2, "Error: script not found: nope.py")
    debug = CliRunner().invoke(
        cli, ["--debug", "measure", "nope.py", "-b", "1", "--cache-dir", str(tmp_path)]
    )
    assert isinstance(debug.exception, InputError)


def test_the_run_timeout_stops_a_trial_that_steps_too_slowly(tmp_path) -> None:
    result = measure_cli(tmp_path, str(SYNTHETIC), *"-b 1 --timeout 1 --json -- --step-seconds 0.4".split())
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert (data["outcome"], data["error"]) == ("timeout", "still running after 1s")


def test_headroom_sets_the_limit_the_winner_must_stay_under(tmp_path) -> None:
    limits = []
    for headroom in ("5%", "0.2"):
        argv = [
            "run",
            "--budget",
            "200MiB",
            "--trials",
            "2",
            "--plans",
            "none",
            "--steps",
            "1",
            "--device",
            "cpu",
            "--headroom",
            headroom,
            "--cache-dir",
            str(tmp_path),
            "--json",
            str(SYNTHETIC),
            "--",
            "--base-mib",
            "20",
        ]
        result = CliRunner().invoke(cli, argv)
        assert result.exit_code == 0, result.output
        limits.append(json.loads(result.stdout)["limit_bytes"])
    assert limits == [int(200 * MiB * 0.95), int(200 * MiB * 0.8)]
    bad = CliRunner().invoke(cli, [*argv[:-4], "--headroom", "lots", str(SYNTHETIC)])
    assert bad.exit_code == 2
    assert bad.output.strip().endswith(
        "invalid headroom 'lots': expected a percentage such as 5% or a fraction such as 0.05"
    )


def test_doctor_reports_what_works_here_without_importing_torch(tmp_path) -> None:
    """Without --backend ort, ORT is looked up, not trained (issue 44: its step took 56-103 s of every call,
    building ORT's C++ extension on a fresh machine); the compatibility phase trains it
    (test_doctor_trains_a_step_with_ort)."""
    started = time.monotonic()
    output = cli_in_a_fresh_interpreter(["doctor", "--json"], not_imported=("torch",), timeout=300)
    assert time.monotonic() - started < 30  # seconds, not the minute ORT's step took (torch's import: ~3 s)
    checks = {c["name"]: c for c in json.loads(output)}
    assert set(checks) == {
        "torch",
        "NVML (GPU memory)",
        "CPU memory (process trees)",
        "SQLite (default storage)",
        "PostgreSQL driver",
        "Ray cluster",
        "ONNX Runtime backend",
    }
    ray = checks["Ray cluster"]  # make test never installs Ray, and starts no cluster (tests/cluster does)
    assert not ray["ok"] and (
        ray["hint"] == "only for --executor ray: pip install 'autotune[ray]'"
        or ray["detail"].startswith(
            ("no Ray cluster at auto: ", "no Ray cluster running here: Ray's address file ")
        )
    ), ray
    assert checks["torch"]["ok"] and checks["torch"]["detail"].startswith("2.13.0")
    assert checks["torch"]["required"]
    assert (
        checks["CPU memory (process trees)"]["detail"] == "Pss from /proc/PID/smaps_rollup: shared pages once"
    )
    ort = checks["ONNX Runtime backend"]
    assert ort == {  # the dev environment has the ort extra
        "name": "ONNX Runtime backend",
        "ok": True,
        "detail": "onnxruntime-training 1.19.2 installed; not trained here: autotune doctor --backend ort "
        "trains a step (a fresh machine first builds its C++ extension, about a minute)",
        "hint": None,
        "required": False,
    }, ort


@pytest.mark.slow  # ORTModule trains a step (the first one in a session builds its extension)
@pytest.mark.compat  # ... on a fresh machine, a minute of CPU: the compatibility phase, where ORT's tests are
def test_doctor_trains_a_step_with_ort() -> None:
    output = cli_in_a_fresh_interpreter(
        ["doctor", "--json", "--backend", "ort"], not_imported=("torch",), timeout=1800
    )
    ort = {c["name"]: c for c in json.loads(output)}["ONNX Runtime backend"]
    # the dev environment has the ort extra: ORTModule really trained a step in the check
    assert ort["ok"] and ort["detail"].startswith("onnxruntime-training 1.19.2, ORTModule trains here"), ort


def test_doctor_fails_when_torch_cannot_be_imported(tmp_path) -> None:
    # Shadows the installed torch for the checked interpreter only: a stand-in for a machine without torch.
    (tmp_path / "torch.py").write_text("raise ImportError('No module named torch (hidden by this test)')\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    proc = subprocess.run([AUTOTUNE, "doctor"], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 1
    assert "no  torch: ImportError: No module named torch (hidden by this test)" in proc.stdout
    assert "-> pip install torch (>= 2.4, for selective checkpointing)" in proc.stdout


def test_a_hopeless_budget_answered_from_other_budgets_trials_names_the_budget_it_needs(tmp_path) -> None:
    """Issue 29: `run --budget 50MB` after the demo made 0 trials (every warm-started reading over it, the
    other plans predicted over it) and said less than a hopeless search that measured: the budget it needs."""

    def run(budget: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [AUTOTUNE, "run", "--device", "cpu", "--budget", budget, "--batch-sizes", "8,16", "--plans", "none;A:1",
             "--cache-dir", str(tmp_path), "--", "python", str(SYNTHETIC), "--base-mib", "40", "--per-sample-mib",
             "4", "--plan-effects", "A:1=0.5:0.5", "--step-seconds", "0.01"],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip

    assert run("200MiB").returncode == 0
    hopeless = run("50MiB")
    assert hopeless.returncode == 6, hopeless.stderr
    error = hopeless.stderr.strip().splitlines()[-1]
    assert error.startswith("Error: no configuration fits 47.50 MiB (budget minus headroom)"), error
    assert "(measured for another budget)" in error and "; it needs a budget of at least " in error
