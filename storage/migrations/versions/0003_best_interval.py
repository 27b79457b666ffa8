"""The winner's throughput interval: the best table keeps the low and high ends of its samples/s and how
many readings they pool (autotune.core.stats), not one number.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("autotune_best") as batch:  # SQLite alters a table by copying it
        batch.add_column(sa.Column("samples_per_sec_low", sa.Float, nullable=True))
        batch.add_column(sa.Column("samples_per_sec_high", sa.Float, nullable=True))
        batch.add_column(sa.Column("readings", sa.Integer, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("autotune_best") as batch:
        batch.drop_column("readings")
        batch.drop_column("samples_per_sec_high")
        batch.drop_column("samples_per_sec_low")
