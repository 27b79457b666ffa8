"""autotune's first tables: workloads, studies, best plans.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "autotune_workloads",
        sa.Column("fingerprint", sa.String(64), primary_key=True),
        sa.Column("script", sa.Text, nullable=False),
        sa.Column("command", sa.Text, nullable=False),
        sa.Column("device", sa.Text, nullable=False),
        sa.Column("details", sa.JSON, nullable=False),
        sa.Column("candidates", sa.JSON, nullable=True),
        sa.Column("discovery", sa.JSON, nullable=True),
        sa.Column("created_at", sa.DateTime, nullable=False),
    )
    op.create_table(
        "autotune_studies",
        sa.Column("study_name", sa.String(128), primary_key=True),
        sa.Column(
            "fingerprint", sa.String(64), sa.ForeignKey("autotune_workloads.fingerprint"), nullable=False
        ),
        sa.Column("study_key", sa.String(64), nullable=False),
        sa.Column("budget_bytes", sa.BigInteger, nullable=False),
        sa.Column("headroom", sa.Float, nullable=False),
        sa.Column("space", sa.JSON, nullable=False),
        sa.Column("created_at", sa.DateTime, nullable=False),
    )
    op.create_index("ix_autotune_studies_study_key", "autotune_studies", ["study_key"])
    op.create_table(
        "autotune_best",
        sa.Column(
            "study_name", sa.String(128), sa.ForeignKey("autotune_studies.study_name"), primary_key=True
        ),
        sa.Column("trial_number", sa.Integer, nullable=False),
        sa.Column("batch_size", sa.Integer, nullable=False),
        sa.Column("plan", sa.Text, nullable=False),
        sa.Column("peak_bytes", sa.BigInteger, nullable=False),
        sa.Column("samples_per_sec", sa.Float, nullable=False),
        sa.Column("verified_peak_bytes", sa.BigInteger, nullable=False),
        sa.Column("verified_samples_per_sec", sa.Float, nullable=False),
        sa.Column("created_at", sa.DateTime, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("autotune_best")
    op.drop_index("ix_autotune_studies_study_key", "autotune_studies")
    op.drop_table("autotune_studies")
    op.drop_table("autotune_workloads")
