"""autotune.storage: the persistence layer (the top-level storage/ folder, imported as ``autotune.storage``).

Trials live in Optuna's tables (RDB storage through SQLAlchemy), so optuna's own API and optuna-dashboard
open the database unchanged. autotune's tables (schema.py, migrated with Alembic under migrations/) map a
workload's fingerprint to its studies and each study to its verified best plan, and hold the jobs and
leases that workers share. The Store is split by table group: studies.py, jobs.py, leases.py.
"""

from autotune.storage.rows import (
    BestRow,
    JobRow,
    JobState,
    Lease,
    LeaseKind,
    LeaseState,
    StudyRow,
    WorkloadRow,
)
from autotune.storage.store import Store, open_store

__all__ = [
    "BestRow",
    "JobRow",
    "JobState",
    "Lease",
    "LeaseKind",
    "LeaseState",
    "Store",
    "StudyRow",
    "WorkloadRow",
    "open_store",
]
