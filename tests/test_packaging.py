"""The installable package (what pip install . and the Dockerfile get), not the editable checkout."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).parent.parent


def test_the_wheel_carries_the_shim_the_injection_and_the_migrations(tmp_path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("autotune-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for required in (
        "autotune/trials/_shim.py",
        "autotune/runtime/_inject/sitecustomize.py",
        "autotune/storage/schema.py",
        "autotune/storage/migrations/env.py",
        "autotune/storage/migrations/script.py.mako",
        "autotune/storage/migrations/versions/0001_autotune_tables.py",
    ):
        assert required in names, required
    assert not [n for n in names if n.startswith(("storage/", "tests/", "examples/"))]  # no top-level strays
    metadata = next(n for n in names if n.endswith("METADATA"))
    requires = [
        line
        for line in zipfile.ZipFile(wheel).read(metadata).decode().splitlines()
        if line.startswith("Requires-Dist")
    ]
    assert "Requires-Dist: nvidia-ml-py>=12.535" in requires
    assert not [r for r in requires if r.startswith("Requires-Dist: pynvml")]


def test_the_schema_revision_matches_the_newest_migration() -> None:
    from autotune.storage.migrate import KNOWN_REVISIONS
    from autotune.storage.schema import HEAD_REVISION

    versions = sorted(
        p.name.split("_")[0] for p in (ROOT / "storage" / "migrations" / "versions").glob("*.py")
    )
    assert versions == KNOWN_REVISIONS
    assert KNOWN_REVISIONS[-1] == HEAD_REVISION
