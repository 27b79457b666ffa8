"""The search: which configurations to measure, in what order, when to stop, and which one wins.

- the algorithm, pure: ``space`` (batch sizes x plans), ``memory_model``, ``propose``, ``records``;
- the loop over a shared study: ``loop`` (Search), ``recovery``, ``verify``, with the Optuna glue in
  ``study`` and ``optuna_trials``;
- a job against this machine and database: ``spec`` (TuneSpec), ``resolve``, ``probing``, ``naming``,
  ``runner``.
"""

# Read by the CLI at start-up, which must not import the search itself.
DEFAULT_TRIALS = (
    16  # trial runs a run starts (and search trials a study holds) unless --trials says otherwise
)
MIN_TRIALS = 2  # the least --trials a run answers within: its probe and one trial (answered unverified)
DEFAULT_SEED = 0  # the sampler's seed: the same job proposes the same configurations
