"""autotune.storage: the persistence layer (installed from storage/ as ``autotune.storage``).

Trials live in Optuna's tables (RDB storage through SQLAlchemy), so optuna's own API and optuna-dashboard
open the database unchanged. autotune's tables (schema.py, migrated with Alembic under migrations/) map a
workload's fingerprint to its studies and each study to its verified best plan.
"""

from autotune.storage.store import BestRow, JobRow, Lease, Store, StudyRow, open_store

__all__ = ["BestRow", "JobRow", "Lease", "Store", "StudyRow", "open_store"]
