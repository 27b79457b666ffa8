"""Who runs what, across processes and hosts: a worker's identity, whether a lease's worker is alive, and
the heartbeat that keeps this process's leases alive. The leases themselves are rows in the database
(autotune.storage.leases); the search takes them (autotune.search)."""
