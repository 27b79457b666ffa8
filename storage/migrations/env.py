"""Alembic environment for autotune's own tables. Run only through autotune.storage (never the alembic CLI):
it passes an open connection in ``config.attributes["connection"]``."""

from __future__ import annotations

from alembic import context

from autotune.storage.schema import VERSION_TABLE, metadata

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=metadata, version_table=VERSION_TABLE)
with context.begin_transaction():
    context.run_migrations()
