"""autotune.storage: the persistence layer (installed from storage/ as ``autotune.storage``).

Trials are stored through Optuna's RDB storage (SQLAlchemy); autotune's own tables and their Alembic
migrations live here. Filled by the tuning loop; the trial protocol itself persists nothing.
"""
