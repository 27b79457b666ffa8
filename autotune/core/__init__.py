"""The shared vocabulary every layer speaks, importable without torch, Optuna or a database: errors (one
root, an exit code each), budgets and the limit a peak must fit, plan strings and backends, the trial
protocol (request, report, outcome), and where files go."""
