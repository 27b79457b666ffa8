"""A tuning job: what it asks (``TuneSpec``, with its one serialisation for the jobs table) and what it answers
(``TuneResult``). ``tune_spec`` builds a spec from the strings a user types (the CLI's options, a
notebook's arguments) and validates every one of them before any trial runs."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from autotune.core.batches import MAX_GLOBAL_BATCH, check_global_batch, per_rank
from autotune.core.budget import DEFAULT_HEADROOM, Budget, check_headroom, parse_budget, parse_headroom
from autotune.core.errors import InputError
from autotune.core.names import check_study_name
from autotune.core.paths import cache_dir, default_storage_url
from autotune.core.plans import Backend
from autotune.search import DEFAULT_SEED, DEFAULT_TRIALS, MIN_TRIALS
from autotune.search.records import TrialRecord
from autotune.search.space import micro_batch_sizes, parse_batch_sizes, parse_plan_list
from autotune.storage import BestRow
from autotune.trials.command import TrialCommand
from autotune.trials.settings import TrialSettings

EXECUTORS = ("local", "ray")
VERIFY_SETTLE_STEPS = 250  # at most this many steps past a verification's measured ones (and settle_seconds)


@dataclass(frozen=True)
class TuneSpec:
    """One tuning job. Build it with :func:`tune_spec` or directly; values are validated here."""

    command: TrialCommand
    """The script and its arguments, or a command template with ``{batch_size}``."""
    budget: Budget
    """The memory the winner's measured peak must fit (less ``headroom``)."""
    trials: int = DEFAULT_TRIALS
    """The most trial runs ``autotune run`` starts, of every kind: its probe, the search's trials, their
    re-measurements and the verifications (autotune.search.cost); and the most search trials the study holds
    (over resumed runs and every worker)."""
    batch_sizes: tuple[int, ...] = field(default_factory=lambda: parse_batch_sizes(None))
    """The batch sizes searched (with ``global_batch``: micro-batches dividing it)."""
    plans: tuple[str, ...] | None = None
    """The plans searched; None: derived from the model's repeated classes by the probe."""
    settings: TrialSettings = field(default_factory=TrialSettings)
    """How each trial runs: warm-up and measured steps, time limits, phases after the steps."""
    headroom: float = DEFAULT_HEADROOM
    """The share of the budget the winner's verified peak keeps free."""
    seed: int | None = DEFAULT_SEED
    """The sampler's seed."""
    device: str = "auto"
    """Where trials run: ``auto``, ``cpu``, ``cuda``, ``cuda:N`` or ``cuda:N+M``."""
    cache_dir: Path | None = None
    """The database and trial logs; None: the user cache dir."""
    storage: str | None = None
    """A SQLAlchemy URL (PostgreSQL for workers on several hosts); None: SQLite in the cache dir."""
    study: str | None = None
    """The study's name; None: derived from the script and the search."""
    force: bool = False
    """Forget the stored study (and the workload's probe) and tune again."""
    backend: Backend = Backend.TORCH
    """How plans recompute: torch's checkpointing, or ORT's memory optimizer."""
    exhaustive: bool = False
    """Measure every plan's frontier, then sample until ``trials``: no stopping rule."""
    global_batch: int | None = None
    """Every trial trains this many samples per optimizer step (a micro-batch, accumulated)."""
    grad_accum: int | None = None
    """The script accumulates this many micro-batches per optimizer step on its own."""
    helpers: tuple[str, ...] | None = None
    """Devices that run trials of this job beside ``device``, in this process (workers.Worker threads).
    None: with device "auto", every other visible GPU; () none. Not part of the job: workers bring theirs."""
    gpus_per_trial: int = 1
    """Each trial runs on this many GPUs (a torchrun job's ranks)."""
    host_budget: Budget | None = None
    """The host memory a trial's processes may hold (absolute, or a share of the host's): this host's, not
    part of the job (a worker uses its own host's default). None: what the host has available as the run
    starts, less a margin (autotune.hardware.host.default_host_budget)."""
    sweep: bool | None = None
    """Measure the plans without a reading together, at one batch size, in one trial process
    (autotune.search.sweep); None: on for GPU trials without ``warm`` (start-up dominates them), else off."""
    warm: bool = True
    """One trial process measures configuration after configuration, the script run again in it for each
    (autotune.trials.warm); False: a process per trial."""
    time_limit: float | None = None
    """Wall seconds the run may take to its answer (autotune.search.cost): the search stops proposing while
    a verification still fits; None: the default (autotune.search.cost.default_limit); 0: none."""
    executor: str = "local"
    """Where trials run: ``local`` (this machine, with helpers and workers) or ``ray`` (each trial placed
    on a Ray cluster: autotune.cluster). Not part of the job."""
    ray_address: str | None = None
    """The Ray cluster's address (None: RAY_ADDRESS, a cluster running here, else a new local one)."""
    nodes_per_trial: int = 1
    """Under ``ray``: the nodes each trial spans (a ``torchrun --nnodes N`` template: N)."""
    max_seq_len: int | None = None
    """The job's longest sequence length, where its trials cannot feed it (autotune.worst_case()): every
    peak is read at this length from the per-token memory the trials measured (autotune.search.longest)."""
    function: str | None = None
    """A search inside the user's own process (autotune.finder): the training function's qualified name.
    Its workload is its own (the process holds more than the script's trial would), and no worker takes
    its job: only that process can call the function."""

    def __post_init__(self) -> None:
        if self.trials < MIN_TRIALS:
            raise InputError(
                f"--trials must be at least {MIN_TRIALS} (the probe, then one trial), got {self.trials}"
            )
        if self.time_limit is not None and not self.time_limit >= 0:
            raise InputError(f"--time-limit must be 0 (none) or more seconds, got {self.time_limit:g}")
        check_headroom(self.headroom)
        if self.study is not None:
            check_study_name(self.study)
        if self.gpus_per_trial < 1:
            raise InputError(f"--gpus-per-trial must be a positive integer, got {self.gpus_per_trial}")
        self._check_executor()
        if self.max_seq_len is not None and self.max_seq_len < 1:
            raise InputError(f"--max-seq-len must be a positive integer, got {self.max_seq_len}")
        if self.global_batch is not None:
            check_global_batch(self.global_batch)
            if self.grad_accum is not None:
                raise InputError("give --global-batch or --grad-accum, not both")
            share = per_rank(self.global_batch, self.world_size)  # the ranks share it evenly
            micro_batch_sizes(share, self.batch_sizes)  # some micro-batch lies in the range
        if self.grad_accum is not None and not 1 <= self.grad_accum <= MAX_GLOBAL_BATCH:
            raise InputError(f"--grad-accum must be between 1 and {MAX_GLOBAL_BATCH}, got {self.grad_accum}")
        object.__setattr__(self, "backend", Backend.parse(self.backend))  # "ort" given as a string

    def _check_executor(self) -> None:
        """``--executor``, ``--nodes-per-trial`` and a multi-node torchrun template agree.

        Raises:
            InputError: they do not, in one line."""
        if self.executor not in EXECUTORS:
            raise InputError(f"--executor {self.executor}: expected one of {', '.join(EXECUTORS)}")
        if self.nodes_per_trial < 1:
            raise InputError(f"--nodes-per-trial must be a positive integer, got {self.nodes_per_trial}")
        nodes = self.command.nodes
        if self.executor != "ray":
            if self.nodes_per_trial > 1:
                raise InputError("--nodes-per-trial places a trial on several nodes: it needs --executor ray")
            return
        if nodes != self.nodes_per_trial:
            raise InputError(
                f"--nodes-per-trial {self.nodes_per_trial} and the command's torchrun --nnodes {nodes} differ: "
                "each node of a trial runs one torchrun; give both the same"
                if self.command.launcher
                else f"--nodes-per-trial {self.nodes_per_trial}: a trial on several nodes runs a torchrun "
                "template (-- torchrun --nnodes N --nproc-per-node gpu train.py ...)"
            )
        if nodes > 1:
            self.command.check_placeable()

    @property
    def verify_settings(self) -> TrialSettings:
        """A verification runs the search's measured steps, then on until its peak has stopped growing or
        the limit has room for its rise, up to VERIFY_SETTLE_STEPS more (autotune.trials.settle). Not twice
        the steps, nor SETTLE_WINDOW at least (#41): its speed is pooled with the search's readings, and a
        longer run buys little against the spread between runs (six quiet readings of
        bench/time_to_answer.py's GPT-2 none@7 on the 2-core CPU: 4.8% sd between runs, ±1-3% within one),
        while its ten steps were 24.5 s of a 76 s answer there; the settling waits on where the peak's rise
        could change the verdict."""
        return dataclasses.replace(
            self.settings,
            settle_steps=VERIFY_SETTLE_STEPS,
        )

    @property
    def world_size(self) -> int:
        """The ranks of one trial (torchrun's processes; 1 for a plain script)."""
        return self.command.world_size(self.gpus_per_trial)

    @property
    def storage_url(self) -> str:
        return self.storage or default_storage_url(cache_dir(self.cache_dir))

    def to_json(self) -> dict[str, Any]:
        """The job as the jobs table stores it: what a worker on another host needs (the script's path and
        the working directory made absolute). The device, database and cache are the worker's own."""
        words = list(self.command.words)
        if not self.command.is_template:
            words[0] = str(Path(words[0]).resolve())
        return {
            "command": words,
            "is_template": self.command.is_template,
            "cwd": self.command.cwd or os.getcwd(),
            "budget": self.budget.text,
            "trials": self.trials,
            "batch_sizes": list(self.batch_sizes),
            "plans": list(self.plans) if self.plans is not None else None,
            "settings": {**asdict(self.settings), "phases": list(self.settings.phases)},  # as JSON reads back
            "headroom": self.headroom,
            "seed": self.seed,
            "backend": self.backend.value,
            "exhaustive": self.exhaustive,
            "global_batch": self.global_batch,
            "grad_accum": self.grad_accum,
            "gpus_per_trial": self.gpus_per_trial,
            "max_seq_len": self.max_seq_len,
            "sweep": self.sweep,
            "warm": self.warm,
            "time_limit": self.time_limit,
            "function": self.function,
        }

    @classmethod
    def from_json(
        cls, data: dict[str, Any], *, study: str, device: str, storage: str, cache: Path | None
    ) -> TuneSpec:
        """The spec a worker runs a stored job with, on its own ``device``, database and cache dir."""
        command = TrialCommand(
            tuple(data["command"]),
            bool(data["is_template"]),
            data["cwd"] if Path(data["cwd"]).is_dir() else None,
        )
        return cls(
            command=command,
            budget=parse_budget(data["budget"]),
            trials=int(data["trials"]),
            batch_sizes=tuple(data["batch_sizes"]),
            plans=tuple(data["plans"]) if data["plans"] is not None else None,
            settings=TrialSettings(**data["settings"]),
            headroom=float(data["headroom"]),
            seed=data["seed"],
            device=device,
            cache_dir=cache,
            storage=storage,
            study=study,
            backend=Backend.parse(data["backend"]),
            exhaustive=bool(data.get("exhaustive", False)),  # jobs stored before the stopping rule: False
            global_batch=data.get("global_batch"),
            grad_accum=data.get("grad_accum"),
            gpus_per_trial=int(data.get("gpus_per_trial", 1)),
            max_seq_len=data.get("max_seq_len"),
            sweep=data.get("sweep"),
            warm=bool(data.get("warm", True)),
            time_limit=data.get("time_limit"),
            function=data.get("function"),
        )


def tune_spec(
    command: Sequence[str],
    budget: str | Budget,
    *,
    batch_sizes: str | None = None,
    plans: Sequence[str] = (),
    headroom: str | float = DEFAULT_HEADROOM,
    backend: str | Backend = Backend.TORCH,
    host_budget: str | Budget | None = None,
    **options: Any,
) -> TuneSpec:
    """A TuneSpec from what a user types: ``tune_spec(["train.py"], "40GB", plans=["all"], trials=8)``.

    Args:
        command: SCRIPT [ARGS...] or a command template with ``{batch_size}``.
        budget: ``40GB``, ``40GiB``, ``90%`` of the device, ... (or a parsed Budget).
        batch_sizes: a range (``8-512``) or a list (``8,16,24``); None: the whole ladder.
        plans: plan strings, each possibly ';'-separated; empty: derived from the model.
        headroom: ``5%`` or ``0.05``.
        host_budget: the host memory a trial may hold (``64GiB``, ``80%`` of the host); None: the default.
        options: the other TuneSpec fields as they are (trials, settings, seed, device, cache_dir,
            storage, study, force, exhaustive, helpers, global_batch, grad_accum, gpus_per_trial,
            max_seq_len).

    Raises:
        InputError: a bad command, budget, batch-size list, plan, headroom or option, in one line.
    """
    backend = Backend.parse(backend)
    return TuneSpec(
        command=TrialCommand.parse(command),
        budget=budget if isinstance(budget, Budget) else parse_budget(budget),
        batch_sizes=parse_batch_sizes(batch_sizes),
        plans=parse_plan_list(plans, backend) if plans else None,
        headroom=parse_headroom(headroom) if isinstance(headroom, str) else check_headroom(headroom),
        backend=backend,
        host_budget=parse_budget(host_budget) if isinstance(host_budget, str) else host_budget,
        **options,
    )


@dataclass(frozen=True)
class TuneResult:
    study_name: str
    storage: str  # the database, password hidden
    device_name: str
    budget_bytes: int
    limit_bytes: int  # budget minus headroom: what the winner's verified peak must stay under
    best: BestRow
    records: tuple[TrialRecord, ...]
    cached: bool  # answered from the database with zero trials
    new_trials: int
    stopped: str | None = None  # why the search stopped before ``trials`` (None: it ran them all, or cached)
    global_batch: int | None = None  # the study's fixed global batch, if any
    grad_accum: int | None = None  # the winner's micro-batches per optimizer step (global batch or declared)
    seconds: float | None = None  # this run's wall time, from its start to the answer
    # where that time went, in order: ("probe", s) (resolving the job, its probe included), ("search", s),
    # ("verification", s); empty for an answer from the database
    stages: tuple[tuple[str, float], ...] = ()
    max_seq_len: int | None = None  # --max-seq-len: the peaks are read at this length
