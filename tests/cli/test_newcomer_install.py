"""What a newcomer installing autotune meets first (issue 29, item 2): its version, its licence, the API that
`dir()` and `help()` list, `studies --json`, and a Python `tune()` that prints no Optuna log line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

from conftest import AUTOTUNE, ROOT, SYNTHETIC, cli_in_a_fresh_interpreter, in_a_fresh_interpreter


def test_version_is_the_installed_metadata_s_without_importing_torch() -> None:
    from importlib.metadata import version

    heavy = ("torch", "optuna", "numpy", "sqlalchemy")
    assert (
        cli_in_a_fresh_interpreter(["--version"], not_imported=heavy).strip()
        == f"autotune {version('autotune')}"
    )


def test_the_licence_is_in_the_repository_and_the_metadata() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License") and "Version 2.0, January 2004" in text
    assert 'license = "Apache-2.0"' in (ROOT / "pyproject.toml").read_text()
    assert 'license-files = ["LICENSE"]' in (ROOT / "pyproject.toml").read_text()


def test_dir_lists_the_lazily_loaded_api_without_loading_it() -> None:
    code = (
        "import autotune\nnames = dir(autotune)\n"
        "assert {'tune', 'tune_spec', 'measure', 'measure_spec', 'TuneSpec', 'prepare'} <= set(names), names\n"
    )
    in_a_fresh_interpreter(code, not_imported=("torch", "optuna"))


def test_help_documents_the_lazily_loaded_api() -> None:
    code = (
        "import autotune, pydoc\ntext = pydoc.render_doc(autotune, renderer=pydoc.plaintext)\n"
        "missing = [n for n in ('tune(', 'tune_spec(', 'best(', 'measure(', 'batch_size(', 'prepare(') if n not in text]\n"
        "assert not missing, missing\n"
    )
    in_a_fresh_interpreter(code)


def test_studies_json_lists_each_study(tmp_path: Path) -> None:
    argv = [AUTOTUNE, "run", "--json", "--device", "cpu", "--budget", "200MiB", "--batch-sizes", "4,8",
            "--plans", "none", "--exhaustive", "--steps", "2", "--warmup-steps", "1", "--cache-dir",
            str(tmp_path), "--study", "listed", "--", "python", str(SYNTHETIC), "--per-sample-mib", "1"]  # fmt: skip
    assert subprocess.run(argv, capture_output=True, text=True, timeout=300).returncode == 0
    listed = subprocess.run(
        [AUTOTUNE, "studies", "--json", "--cache-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert listed.returncode == 0, listed.stderr
    [study] = json.loads(listed.stdout)
    assert (study["name"], study["state"], study["trials"]) == ("listed", "done", 2)
    assert study["budget_bytes"] == 200 * 2**20 and study["best_samples_per_sec"] > 0

    code = (
        "import autotune\n"
        f"spec = autotune.tune_spec(['python', {str(SYNTHETIC)!r}], '200MiB', batch_sizes='4', plans=['none'],"
        f" device='cpu', cache_dir={str(tmp_path)!r}, study='quiet', trials=2)\n"
        "autotune.tune(spec)\n"
    )
    quiet = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert quiet.returncode == 0, quiet.stderr
    assert "[I " not in quiet.stderr and "A new study created" not in quiet.stderr, quiet.stderr


def test_the_sdist_carries_the_licence_and_no_tests(tmp_path: Path) -> None:
    """Built from a copy of the tracked files (building writes egg-info beside the sources)."""
    source = tmp_path / "source"
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, files.decode().split("\0")):
        if (ROOT / name).is_file() and not (ROOT / name).is_symlink():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            (source / name).write_bytes((ROOT / name).read_bytes())
        elif (ROOT / name).is_symlink():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            (source / name).symlink_to(os.readlink(ROOT / name))
    code = f"from setuptools import build_meta; print(build_meta.build_sdist({str(tmp_path)!r}))"
    built = subprocess.run(
        [sys.executable, "-c", code], cwd=source, capture_output=True, text=True, timeout=300
    )
    assert built.returncode == 0, built.stderr[-2000:]
    with tarfile.open(tmp_path / built.stdout.strip().splitlines()[-1]) as sdist:
        names = [name.split("/", 1)[1] for name in sdist.getnames() if "/" in name]
    assert "LICENSE" in names and "README.md" in names
    assert not [name for name in names if name.startswith("tests")]
    assert any(name.startswith("autotune/search/") for name in names)
