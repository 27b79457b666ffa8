"""Running tuning jobs: ``tune()`` (the job run by the process that asks, with its other GPUs helping),
``submit()`` and the ``Worker`` daemon (jobs run by any number of workers sharing one database), and the
jobs table's rows."""
