"""autotune's own tables, beside Optuna's in the same database.

- ``autotune_workloads``: one row per workload fingerprint (script, arguments, device, versions, backend):
  what the script's model offers (recompute candidates) and its first, discovery trial.
- ``autotune_studies``: which Optuna study answers which workload, budget and search space.
- ``autotune_best``: the verified winner of a study.

Changes to these tables go through an Alembic migration in storage/migrations/versions/ and a new
``HEAD_REVISION`` here (a test checks the two agree).
"""

from __future__ import annotations

import sqlalchemy as sa

HEAD_REVISION = "0001"
VERSION_TABLE = "autotune_alembic_version"  # Optuna's own migrations use "alembic_version"

metadata = sa.MetaData()

workloads = sa.Table(
    "autotune_workloads",
    metadata,
    sa.Column("fingerprint", sa.String(64), primary_key=True),
    sa.Column("script", sa.Text, nullable=False),
    sa.Column("command", sa.Text, nullable=False),
    sa.Column("device", sa.Text, nullable=False),
    sa.Column("details", sa.JSON, nullable=False),  # what went into the fingerprint, for humans
    sa.Column("candidates", sa.JSON, nullable=True),  # [{cls, count, outermost}], None until discovered
    sa.Column("discovery", sa.JSON, nullable=True),  # the discovery trial's measurement
    sa.Column("created_at", sa.DateTime, nullable=False),
)

studies = sa.Table(
    "autotune_studies",
    metadata,
    sa.Column("study_name", sa.String(128), primary_key=True),
    sa.Column("fingerprint", sa.String(64), sa.ForeignKey("autotune_workloads.fingerprint"), nullable=False),
    sa.Column("study_key", sa.String(64), nullable=False, index=True),
    sa.Column("budget_bytes", sa.BigInteger, nullable=False),
    sa.Column("headroom", sa.Float, nullable=False),
    sa.Column("space", sa.JSON, nullable=False),
    sa.Column("created_at", sa.DateTime, nullable=False),
)

best = sa.Table(
    "autotune_best",
    metadata,
    sa.Column("study_name", sa.String(128), sa.ForeignKey("autotune_studies.study_name"), primary_key=True),
    sa.Column("trial_number", sa.Integer, nullable=False),
    sa.Column("batch_size", sa.Integer, nullable=False),
    sa.Column("plan", sa.Text, nullable=False),
    sa.Column("peak_bytes", sa.BigInteger, nullable=False),
    sa.Column("samples_per_sec", sa.Float, nullable=False),
    sa.Column("verified_peak_bytes", sa.BigInteger, nullable=False),
    sa.Column("verified_samples_per_sec", sa.Float, nullable=False),
    sa.Column("created_at", sa.DateTime, nullable=False),
)
