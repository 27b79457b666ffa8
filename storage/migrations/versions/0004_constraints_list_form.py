"""Memory constraints in Optuna's list form: trial system attribute ``constraints`` = [MiB], the form
optuna-dashboard reads (it showed out-of-memory trials as feasible), instead of ``constraints:memory``
(Optuna 5's ``Trial.set_constraint``). A data migration of Optuna's own table: one constraint per trial
either way, so Optuna's samplers see the same feasibility before and after.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

TABLE = "trial_system_attributes"  # Optuna's; absent in a database Optuna has not opened yet


def upgrade() -> None:
    if not sa.inspect(op.get_bind()).has_table(TABLE):
        return
    op.execute(
        f"""INSERT INTO {TABLE} (trial_id, key, value_json)
        SELECT a.trial_id, 'constraints', '[' || a.value_json || ']' FROM {TABLE} a
        WHERE a.key = 'constraints:memory' AND NOT EXISTS (
            SELECT 1 FROM {TABLE} b WHERE b.trial_id = a.trial_id AND b.key = 'constraints')"""
    )
    op.execute(f"DELETE FROM {TABLE} WHERE key = 'constraints:memory'")


def downgrade() -> None:
    if not sa.inspect(op.get_bind()).has_table(TABLE):
        return
    op.execute(
        f"""INSERT INTO {TABLE} (trial_id, key, value_json)
        SELECT trial_id, 'constraints:memory', substr(value_json, 2, length(value_json) - 2) FROM {TABLE}
        WHERE key = 'constraints' AND value_json LIKE '[%' AND value_json NOT LIKE '%,%'"""
    )
    op.execute(f"DELETE FROM {TABLE} WHERE key = 'constraints'")
