"""autotune's own tables, beside Optuna's in the same database.

- ``autotune_workloads``: one row per workload fingerprint (script, arguments, device, versions, backend):
  what the script's model offers (recompute candidates) and its first, discovery trial.
- ``autotune_studies``: which Optuna study answers which workload, budget and search space.
- ``autotune_best``: the verified winner of a study.
- ``autotune_jobs``: tuning jobs (``autotune submit`` / ``run``): the spec a worker needs, and the job's state.
- ``autotune_leases``: who is evaluating which configuration of a study. A lease is taken *before* a trial
  is asked for, and its unique key (study, kind, batch size, plan, attempt) is what keeps two workers from
  measuring the same configuration on any database (Optuna's own queue hands one enqueued trial to several
  workers on SQLite). Workers bump ``beats`` while they hold a lease; a lease whose beats stop is failed,
  and its configuration queued once more as attempt 1.

Changes to these tables go through an Alembic migration in storage/migrations/versions/ and a new
``HEAD_REVISION`` here (a test checks the two agree).
"""

from __future__ import annotations

import sqlalchemy as sa

HEAD_REVISION = "0006"
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
    # the interval of verified_samples_per_sec over ``readings`` readings (None: stored before 0003)
    sa.Column("samples_per_sec_low", sa.Float, nullable=True),
    sa.Column("samples_per_sec_high", sa.Float, nullable=True),
    sa.Column("readings", sa.Integer, nullable=True),
    # how noisy the tuning was, in one line (None: a quiet tuning, or stored before 0005)
    sa.Column("certainty", sa.Text, nullable=True),
)

jobs = sa.Table(
    "autotune_jobs",
    metadata,
    sa.Column("study_name", sa.String(128), primary_key=True),
    sa.Column("script", sa.Text, nullable=False),
    sa.Column("script_sha256", sa.String(64), nullable=True),  # None: a command template with no script
    sa.Column(
        "spec", sa.JSON, nullable=False
    ),  # what a worker needs to run the job (autotune.search.spec.TuneSpec.to_json)
    sa.Column("state", sa.String(16), nullable=False),  # rows.JobState
    sa.Column("error", sa.Text, nullable=True),
    sa.Column("submitted_by", sa.Text, nullable=False),  # host:pid:start of the submitting process
    sa.Column("created_at", sa.DateTime, nullable=False),
    sa.Column("updated_at", sa.DateTime, nullable=False),
    # the sha256 of every script the command names, by path as written (None: stored before 0006)
    sa.Column("scripts", sa.JSON, nullable=True),
    # the submitter's HMAC over the job (autotune.workers.signing); None: unsigned, or stored before 0006
    sa.Column("signature", sa.String(128), nullable=True),
)

leases = sa.Table(
    "autotune_leases",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("study_name", sa.String(128), nullable=False),
    sa.Column("kind", sa.String(16), nullable=False),  # rows.LeaseKind
    sa.Column("batch_size", sa.Integer, nullable=False),
    sa.Column("plan", sa.Text, nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False),  # 0, or 1 for the one retry after a dead worker
    sa.Column("state", sa.String(16), nullable=False),  # rows.LeaseState
    sa.Column("worker", sa.Text, nullable=True),  # host:pid:start; None while queued
    sa.Column("device", sa.Text, nullable=True),
    sa.Column("trial_number", sa.Integer, nullable=True),  # the Optuna trial, once asked
    sa.Column("beats", sa.Integer, nullable=False),
    sa.Column("note", sa.Text, nullable=True),
    sa.Column("updated_at", sa.DateTime, nullable=False),
    sa.UniqueConstraint(
        "study_name", "kind", "batch_size", "plan", "attempt", name="uq_autotune_leases_config"
    ),
    sa.Index("ix_autotune_leases_study_state", "study_name", "state"),
)
