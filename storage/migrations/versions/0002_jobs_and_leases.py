"""Jobs (``autotune submit``) and leases (which worker evaluates which configuration).

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "autotune_jobs",
        sa.Column("study_name", sa.String(128), primary_key=True),
        sa.Column("script", sa.Text, nullable=False),
        sa.Column("script_sha256", sa.String(64), nullable=True),
        sa.Column("spec", sa.JSON, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("error", sa.Text, nullable=True),
        sa.Column("submitted_by", sa.Text, nullable=False),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sa.Column("updated_at", sa.DateTime, nullable=False),
    )
    op.create_table(
        "autotune_leases",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("study_name", sa.String(128), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("batch_size", sa.Integer, nullable=False),
        sa.Column("plan", sa.Text, nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("worker", sa.Text, nullable=True),
        sa.Column("device", sa.Text, nullable=True),
        sa.Column("trial_number", sa.Integer, nullable=True),
        sa.Column("beats", sa.Integer, nullable=False),
        sa.Column("note", sa.Text, nullable=True),
        sa.Column("updated_at", sa.DateTime, nullable=False),
        sa.UniqueConstraint(
            "study_name", "kind", "batch_size", "plan", "attempt", name="uq_autotune_leases_config"
        ),
    )
    op.create_index("ix_autotune_leases_study_state", "autotune_leases", ["study_name", "state"])


def downgrade() -> None:
    op.drop_index("ix_autotune_leases_study_state", "autotune_leases")
    op.drop_table("autotune_leases")
    op.drop_table("autotune_jobs")
