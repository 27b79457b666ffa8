"""The tuner's side of one trial: the command it runs, the settings it runs with, the launcher that starts it
through the shim and meters it, the outcome read from its report, and the workload it measures."""
