"""Signed jobs (issue 27): a job row keeps the sha256 of every script its command names (``scripts``, path as
written to sha256) and the HMAC its submitter signed it with (``signature``: autotune.workers.signing). Rows
stored before have neither: workers treat them as unsigned.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("autotune_jobs") as batch:  # SQLite alters a table by copying it
        batch.add_column(sa.Column("scripts", sa.JSON, nullable=True))
        batch.add_column(sa.Column("signature", sa.String(128), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("autotune_jobs") as batch:
        batch.drop_column("signature")
        batch.drop_column("scripts")
