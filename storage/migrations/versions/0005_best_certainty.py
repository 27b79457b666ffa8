"""How sure the winner is: the best table keeps one line saying how noisy the tuning was (readings of one
configuration that disagreed between trials, trials run while the machine was busy, how often the answer
was re-measured), so ``autotune best`` says it without reading every trial.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("autotune_best") as batch:  # SQLite alters a table by copying it
        batch.add_column(sa.Column("certainty", sa.Text, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("autotune_best") as batch:
        batch.drop_column("certainty")
