"""examples/slurm/workers.sbatch, run as Slurm runs an array's tasks (no Slurm here: bash with the variables
Slurm sets, SLURM_JOB_ID and SLURM_ARRAY_TASK_ID, two tasks at once): they share a submitted, signed job
through the database and end when it is done, each task's trial logs in a folder of its own."""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

from conftest import AUTOTUNE, ROOT, SYNTHETIC

RECIPE = ROOT / "examples" / "slurm" / "workers.sbatch"


def test_two_array_tasks_share_a_submitted_job_and_end_when_it_is_done(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'autotune.db'}"  # one host here; the recipe asks for PostgreSQL
    submitted = subprocess.run(
        [AUTOTUNE, "submit", "--budget", "300MiB", "--trials", "4", "--exhaustive", "--batch-sizes", "1-8",
         "--plans", "none", "--steps", "2", "--warmup-steps", "1", "--study", "array", "--storage", storage,
         str(SYNTHETIC), "--", "--base-mib", "8", "--step-seconds", "0.2"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    env = {**os.environ, "AUTOTUNE_STORAGE": storage, "SLURM_JOB_ID": "42", "TMPDIR": str(tmp_path),
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}  # fmt: skip
    env.pop("CUDA_VISIBLE_DEVICES", None)
    tasks = [
        subprocess.Popen(
            ["bash", str(RECIPE)],
            env={**env, "SLURM_ARRAY_TASK_ID": str(i)},
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for i in range(2)
    ]
    ends = [task.communicate(timeout=300) for task in tasks]

    assert [task.returncode for task in tasks] == [0, 0], ends
    summaries = [re.fullmatch(r"worker: (\d+) trial\(s\); jobs done: (.*); failed: -; refused: -", err.splitlines()[-1])
                 for _, err in ends]  # fmt: skip
    assert all(summaries), ends
    assert sum(int(m[1]) for m in summaries if m) >= 5  # the probe, four trials, a verification: shared
    assert "array" in {m[2] for m in summaries if m}
    for (_, err), m in zip(ends, summaries, strict=True):  # no GPU here: --devices auto is the CPU
        assert m is not None and (m[1] == "0" or "[cpu] job array: signature verified" in err), err
    with sqlite3.connect(tmp_path / "autotune.db") as conn:
        assert conn.execute("SELECT state FROM autotune_jobs WHERE study_name = 'array'").fetchone() == (
            "done",
        )
    folders = sorted(p.name for p in tmp_path.glob("autotune-42-*"))
    assert folders == ["autotune-42-0", "autotune-42-1"]  # each task's trial logs in its own folder


def test_the_recipe_refuses_to_start_without_a_shared_database(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "AUTOTUNE_STORAGE"}
    done = subprocess.run(["bash", str(RECIPE)], env={**env, "TMPDIR": str(tmp_path)}, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode != 0
    assert (
        "AUTOTUNE_STORAGE: set AUTOTUNE_STORAGE to the PostgreSQL database every node reaches" in done.stderr
    )
