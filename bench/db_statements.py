"""What one trial costs the database: the SQL statements a tuner sends per trial, reads and writes, counted
at the SQLAlchemy engine (every engine of the process: autotune's tables and Optuna's), and the seconds the
tuner spends inside them. The figure a cluster's driver is sized by (issue 28, item 6: database writes per
trial, and what changes first at 1,000 GPUs).

    .venv/bin/python bench/db_statements.py [TRIALS] [sqlite|postgresql://...]

One `autotune.tune` in this process of TRIALS counted trials of the synthetic script (steps of 10 ms, so
that the trials are short and the database's share shows), on the CPU; the probe and the verification are
counted as trials. Prints statements per trial by kind (SELECT, INSERT, UPDATE, DELETE, other), and the
database's share of the tune's wall time.
"""

from __future__ import annotations

import collections
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sqlalchemy as sa

ROOT = Path(__file__).resolve().parent.parent
SYNTHETIC = ROOT / "tests" / "scripts" / "synthetic.py"

counts: collections.Counter[str] = collections.Counter()
spent = [0.0]


@sa.event.listens_for(sa.Engine, "before_cursor_execute")
def _count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
    counts[statement.lstrip().split(None, 1)[0].upper()] += 1


def _timed(retrying: Callable[..., Any]) -> Callable[..., Any]:
    """Every database call of autotune and Optuna goes through ``retrying`` (storage.database.retried):
    its time, commits and waits for locks included, counted once where calls nest."""
    depth = threading.local()

    def call(*args: Any, **kwargs: Any) -> Any:
        depth.n = getattr(depth, "n", 0) + 1
        started = time.perf_counter()
        try:
            return retrying(*args, **kwargs)
        finally:
            depth.n -= 1
            if depth.n == 0:
                spent[0] += time.perf_counter() - started

    return call


def main() -> None:
    from autotune import api
    from autotune.search.spec import tune_spec
    from autotune.storage import database

    database.retrying = _timed(database.retrying)
    from autotune.trials.settings import TrialSettings

    trials = int(sys.argv[1]) if len(sys.argv) > 1 else 16
    os.environ.setdefault("AUTOTUNE_JOB_KEY", "0" * 64)
    with tempfile.TemporaryDirectory() as tmp:
        storage = sys.argv[2] if len(sys.argv) > 2 else f"sqlite:///{Path(tmp) / 'autotune.db'}"
        spec = tune_spec(
            [str(SYNTHETIC), "--base-mib", "8", "--per-sample-mib", "0.01", "--step-seconds", "0.01"],
            "2GiB",
            batch_sizes="1-64",
            plans=["none;A:1;B:1"],
            trials=trials,
            exhaustive=True,
            device="cpu",
            cache_dir=Path(tmp),
            storage=storage,
            study=f"db-statements-{os.getpid()}",
            settings=TrialSettings(warmup_steps=1, measured_steps=3, tight=0),
        )
        started = time.perf_counter()
        result = api.tune(spec)
        wall = time.perf_counter() - started
    ran = len([r for r in result.records if r.measured]) + 1  # the probe's trial too
    total = sum(counts.values())
    kinds = ", ".join(f"{kind} {n / ran:.1f}" for kind, n in counts.most_common())
    writes = sum(counts[k] for k in ("INSERT", "UPDATE", "DELETE"))
    print(
        f"# {storage.split(':')[0]}; {ran} trials (the probe and verifications included); tune {wall:.1f} s"
    )
    print(f"statements per trial: {total / ran:.1f} ({kinds}); writes per trial {writes / ran:.1f}")
    print(
        f"inside the database: {spent[0]:.2f} s of {wall:.1f} s ({spent[0] / wall:.1%}), {spent[0] / ran * 1000:.0f} ms a trial"
    )


if __name__ == "__main__":
    main()
