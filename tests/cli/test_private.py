"""Private by default (issue 27, item 5): what autotune writes under its cache dir is its user's alone, whatever
the umask (before: folders 0755, the database, logs and request files 0644, holding every job's command and
whatever the script prints), and the database URL (password included) and the job key are not in a trial's environment
(before: readable by the training script and anything it spawns). A trial's own files keep the user's umask."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

from conftest import AUTOTUNE, SYNTHETIC


def test_the_cache_dir_s_files_are_private_and_a_trial_never_sees_the_storage_url(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    names = tmp_path / "env.txt"
    env = {
        **os.environ,
        "AUTOTUNE_STORAGE": f"sqlite:///{cache / 'autotune.db'}",
        "AUTOTUNE_JOB_KEY_FILE": "/k",
    }
    argv = [AUTOTUNE, "run", "--device", "cpu", "--budget", "200MiB", "--batch-sizes", "4", "--plans", "none",
            "--trials", "2", "--steps", "2", "--warmup-steps", "1", "--cache-dir", str(cache), "--", "python",
            str(SYNTHETIC), "--env-file", str(names)]  # fmt: skip
    run = subprocess.run(["sh", "-c", 'umask 022 && exec "$@"', "sh", *argv], env=env, capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]

    seen = names.read_text().split()
    assert [n for n in ("AUTOTUNE_STORAGE", "AUTOTUNE_JOB_KEY", "AUTOTUNE_JOB_KEY_FILE") if n in seen] == []
    assert "AUTOTUNE_BATCH_SIZE" in names.read_text().split()  # what a trial needs is there
    assert stat.S_IMODE(names.stat().st_mode) == 0o644  # the script's own file: the user's umask
    assert stat.S_IMODE((cache / "autotune.db").stat().st_mode) == 0o600
    folders = [cache / "trials", *(cache / "trials").iterdir()]
    # the probe and the search's trial share one warm process's folder
    assert len(folders) == 2 and all(stat.S_IMODE(f.stat().st_mode) == 0o700 for f in folders)
    written = [
        f for folder in folders[1:] for f in folder.iterdir() if f.name in ("stdout.log", "request.json")
    ]
    assert written and all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in written), written
