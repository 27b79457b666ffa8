"""Terminal output that fits: `show`, `studies` and a run's trial lines at 80, 100 and 160 columns, never
cutting a column that carries meaning; and `best --format` in each framework's words."""

from __future__ import annotations

import io
import json
import os
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from autotune import api
from autotune.cli import cli
from autotune.cli.console import console, trial_line
from autotune.cli.fit import PlanNames
from autotune.cli.render_trial import probed
from autotune.core.protocol import Outcome
from autotune.results import formats
from autotune.results.best import BestAnswer
from autotune.results.formats import render
from autotune.search.records import TrialKind, TrialRecord

from conftest import SYNTHETIC, synthetic_study

COLUMNS = ("#", "batch", "plan", "outcome", "peak", "pred.", "samples/s", "note")


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    cache = tmp_path_factory.mktemp("widths")
    script = "--base-mib 40 --per-sample-mib 12 --step-seconds 0.02 --per-sample-seconds 0.004".split()
    return cache, synthetic_study(cache, "none;Block:1/save=attention+matmul", *script)


@pytest.mark.parametrize("width", [80, 100, 160])
def test_show_fits_the_terminal_and_keeps_every_column(study, width: int) -> None:
    cache, name = study
    result = CliRunner().invoke(cli, ["show", name, "--cache-dir", str(cache)], env={"COLUMNS": str(width)})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    too_long = [line for line in lines if len(line) > width and " " in line.strip()]
    assert too_long == []
    header = next(line for line in lines if line.strip().startswith("#"))
    assert header.split() == list(COLUMNS if width == 160 else COLUMNS[:-1])
    trials = json.loads(CliRunner().invoke(cli, ["show", name, "--json", "--cache-dir", str(cache)]).output)[
        "trials"
    ]
    shown = [t for t in trials if t["kind"] not in ("skipped", "copy")]
    rows = [line for line in lines if re.match(r"\s*\d+\s+\d+\s", line)]
    assert [int(r.split()[0]) for r in rows] == [t["number"] for t in shown]  # one line per trial
    # the long plan is shortened the same way in every row, and the legend says how
    plans = {r.split()[2] for r in rows}
    if width == 80:
        assert plans == {"none", "B:1/save=attn+mm"}
        assert "plans shortened: B = Block, attn = attention, mm = matmul" in result.output
    elif width == 100:
        assert plans == {"none", "Block:1/save=attn+mm"}
        assert "plans shortened: attn = attention, mm = matmul" in result.output
    else:
        assert plans == {"none", "Block:1/save=attention+matmul"}
    if width < 160:  # notes go under the table, by trial number, when the table leaves them too little room
        assert header.split()[-1] == "samples/s"
        assert re.search(r"^trial \d+: (verifies|re-measures) trial \d+", result.output, re.M)
    assert "every trial ran on " in result.output  # one worker: said once, not a column of repeats


@pytest.mark.parametrize("width", [80, 100])
def test_studies_fits_the_terminal(study, width: int) -> None:
    cache, name = study
    result = CliRunner().invoke(cli, ["studies", "--cache-dir", str(cache)], env={"COLUMNS": str(width)})
    assert result.exit_code == 0
    assert max(len(line) for line in result.output.splitlines()) <= width
    (row,) = [line for line in result.output.splitlines() if name in line]
    cells = re.split(r"\s{2,}", row.strip())
    assert cells[1:3] == ["200.00 MiB", "4"] and cells[4] == "done"
    command = "python synthetic.py --base-mib 40 --per-sample-mib 12"  # the script by its name, its args
    assert command.startswith(cells[5].rstrip("…")) and len(cells[5]) >= 10, cells[5]


def test_a_failed_trial_is_one_line_with_its_log_path_whole() -> None:
    record = TrialRecord(
        number=7,
        state="FAIL",
        kind=TrialKind.MEASURED,
        batch_size=64,
        plan="LlamaDecoderLayer:0.5/save=attention+matmul",
        outcome=Outcome.FAILED,
        error="Traceback (most recent call last):\n  File x\nRuntimeError: " + "a very long message " * 10,
        log_dir=str(Path.home() / ".cache/autotune/trials/20261124-081500-4242-7"),
    )
    names = PlanNames(16)
    for width in (100, 160):
        line = trial_line(record, width, names)
        assert len(line) <= width and "\n" not in line
        assert line.endswith("log: ~/.cache/autotune/trials/20261124-081500-4242-7")
        assert line.startswith("trial   7     64  LDL:0.5/save=at…")
    assert "failed: RuntimeError: a very long message a very" in line  # 160: the message's start too
    # at 80 columns the path alone leaves no room for the message: the path stays whole, on the one line
    assert trial_line(record, 80, names) == (
        "trial   7     64  LDL:0.5/save=at…  failed  log: ~/.cache/autotune/trials/20261124-081500-4242-7"
    )
    assert names.legend() == "plans shortened: LDL = LlamaDecoderLayer, attn = attention, mm = matmul"


def test_a_trial_line_drops_whole_parts_to_fit_never_a_word() -> None:
    """Issue 29: at 80 columns a trial line ended `1,455.4 sam…`. Its least needed parts go first, whole."""
    record = TrialRecord(
        number=2, state="COMPLETE", kind=TrialKind.MEASURED, batch_size=16, plan="none",
        outcome=Outcome.COMPLETE, peak_bytes=126_177_443, samples_per_sec=1455.4, predicted_peak_bytes=126_300_000,
        startup_seconds=0.2, measured_seconds=0.1,
    )  # fmt: skip
    names = PlanNames(16)
    full = "trial   2     16  none              complete 120.33 MiB (pred +0%)  1,455.4 samples/s  0.2s+0.1s"
    assert trial_line(record, 120, names, "best #2") == full + "  best #2"
    assert trial_line(record, 100, names, "best #2") == full
    assert trial_line(record, 80, names, "best #2") == (
        "trial   2     16  none              complete 120.33 MiB (pred +0%)  1,455.4/s"
    )
    assert (
        trial_line(record, 70, names) == "trial   2     16  none              complete 120.33 MiB  1,455.4/s"
    )


def answer(plan: str, **extra) -> BestAnswer:
    return BestAnswer(
        "gpt-1", "train.py", 8, plan, 2**30, 38.8, 2**31, True, "verified winner of study gpt-1", **extra
    )


@pytest.fixture
def transformers_before_5_24(monkeypatch: pytest.MonkeyPatch) -> None:
    """The vocabulary of a transformers before 5.24 (gradient_checkpointing, no placement kwargs), whatever
    this machine has installed (tests/compat/test_hf_vocabulary.py checks the installed one)."""
    monkeypatch.setattr(formats, "hf_vocabulary", lambda: ("gradient_checkpointing", frozenset()))


@pytest.fixture
def transformers_5_24(monkeypatch: pytest.MonkeyPatch) -> None:
    words = frozenset({"every_n_layers", "offload"})
    monkeypatch.setattr(formats, "hf_vocabulary", lambda: ("activation_checkpointing", words))


def test_best_in_hugging_face_words(transformers_before_5_24: None) -> None:
    every = answer("GPT2Block:1", grad_accum=4, outermost=("GPT2Block",))
    assert render(every, "hf").splitlines()[1:] == [
        "per_device_train_batch_size=8",
        "gradient_accumulation_steps=4",
        "gradient_checkpointing=True",
        "# as command-line flags: --per_device_train_batch_size 8 --gradient_accumulation_steps 4 "
        "--gradient_checkpointing true",
        "# gradient_checkpointing recomputes every GPT2Block: the plan GPT2Block:1",
    ]
    half = render(answer("GPT2Block:0.5/save=matmul", outermost=("GPT2Block",)), "hf").splitlines()
    assert half[1:3] == ["per_device_train_batch_size=8", "gradient_checkpointing=False"]
    assert half[4:] == [
        "# the plan GPT2Block:0.5/save=matmul has no argument here: add one line after the model is built, "
        "before the Trainer",
        "#   model = autotune.prepare(model)",
        "# and train with these in the environment (autotune.prepare reads them):",
        "export AUTOTUNE_PLAN=GPT2Block:0.5/save=matmul",
    ]
    # a nested class is not what the framework's switch checkpoints
    assert "gradient_checkpointing=False" in render(answer("MLP:1", outermost=("GPT2Block",)), "hf")


def test_best_in_the_words_of_transformers_5_24_placement_and_offload_included(
    transformers_5_24: None,
) -> None:
    """Issue 29: transformers 5.24 names the switch activation_checkpointing and takes every_n_layers and
    offload; a ratio 1/k of the outermost class is its every_n_layers=k (the same layers: ModuleRule.chosen)."""
    layers = {"GPT2Block": 24}

    def hf(plan: str) -> list[str]:
        return render(answer(plan, outermost=("GPT2Block",), layers=layers), "hf").splitlines()[1:]

    assert hf("GPT2Block:1")[1] == "activation_checkpointing=True"
    assert hf("GPT2Block:0.5") == [
        "per_device_train_batch_size=8",
        "activation_checkpointing=True",
        'activation_checkpointing_kwargs={"every_n_layers": 2}',
        "# as command-line flags: --per_device_train_batch_size 8 --activation_checkpointing true "
        """--activation_checkpointing_kwargs '{"every_n_layers": 2}'""",
        '# activation_checkpointing with {"every_n_layers": 2} checkpoints the layers the plan GPT2Block:0.5 does',
    ]
    assert hf("GPT2Block:0.25/offload")[1:3] == [
        "activation_checkpointing=True",
        'activation_checkpointing_kwargs={"every_n_layers": 4, "offload": True}',
    ]
    assert hf("GPT2Block:1/offload")[2] == 'activation_checkpointing_kwargs={"offload": True}'
    three_quarters = hf("GPT2Block:0.75")  # 18 of 24 layers: no every_n_layers says it
    assert (
        three_quarters[1] == "activation_checkpointing=False"
        and "#   model = autotune.prepare(model)" in three_quarters
    )
    assert hf("GPT2Block:0.5/save=matmul")[1] == "activation_checkpointing=False"  # an operator policy
    assert hf("MLP:1")[1] == "activation_checkpointing=False"  # not the layers HF counts
    own = answer(
        "GPT2Block:0.5",
        outermost=("GPT2Block",),
        layers=layers,
        own_checkpointing="gradient_checkpointing_enable() on the model",
    )
    kept = render(own, "hf").splitlines()  # every trial measured the script's own, on every layer: kept
    assert kept[2] == "activation_checkpointing=True" and not any("_kwargs=" in line for line in kept)


def test_a_compile_plan_is_given_as_torch_s_own_setting_in_every_format(
    transformers_before_5_24: None,
) -> None:
    setting = "torch._functorch.config.activation_memory_budget = 0.3"
    budget = answer("compile:0.3", outermost=("GPT2Block",))
    assert render(budget, "env").splitlines() == [
        "export AUTOTUNE_BATCH_SIZE=8",
        "export AUTOTUNE_PLAN=compile:0.3",
        "# torch.compile's activation memory budget 0.3: without autotune, set it before the first compiled step",
        "# import torch._functorch.config",
        f"# {setting}",
    ]
    hf = render(budget, "hf").splitlines()
    assert hf[1:3] == ["per_device_train_batch_size=8", "gradient_checkpointing=False"]
    assert hf[4:] == [
        "# torch.compile's activation memory budget 0.3: without autotune, set it before the first compiled step",
        "import torch._functorch.config",
        setting,
    ]
    assert setting in render(budget, "lightning") and f"# {setting}" in render(budget, "torchrun")
    # with a module rule too: the prepare line applies both, torch's line the budget alone
    both = render(answer("GPT2Block:1,compile:0.3", outermost=("GPT2Block",)), "hf")
    assert "gradient_checkpointing=False" in both and setting in both
    assert "export AUTOTUNE_PLAN=GPT2Block:1,compile:0.3" in both


def test_a_sharding_plan_is_given_as_fully_shard_s_own_arguments_in_every_format(
    transformers_before_5_24: None,
) -> None:
    call = "fully_shard(block, reshard_after_forward=False, offload_policy=CPUOffloadPolicy(pin_memory=True))"
    said = "# fsdp:keep+offload: FSDP2's own arguments, in the script's fully_shard call on each block (not the root)"
    sharded = answer("fsdp:keep+offload", outermost=("Block",))
    assert render(sharded, "env").splitlines() == [
        "export AUTOTUNE_BATCH_SIZE=8",
        "export AUTOTUNE_PLAN=fsdp:keep+offload",
        said,
        "# from torch.distributed.fsdp import CPUOffloadPolicy",
        f"# {call}",
    ]
    hf = render(sharded, "hf").splitlines()
    assert hf[1:3] == ["per_device_train_batch_size=8", "gradient_checkpointing=False"]
    assert hf[4:] == [said, "from torch.distributed.fsdp import CPUOffloadPolicy", call]
    assert call in render(sharded, "lightning") and f"# {call}" in render(sharded, "torchrun")
    # with every block recomputed too: no framework switch says both, so the prepare line applies the plan
    both = render(answer("Block:1,fsdp:keep", outermost=("Block",)), "hf").splitlines()
    assert (
        "gradient_checkpointing=False" in both and "fully_shard(block, reshard_after_forward=False)" in both
    )
    assert "export AUTOTUNE_PLAN=Block:1,fsdp:keep" in both


def test_a_zero_plan_is_given_as_deepspeed_s_own_config_in_every_format(
    transformers_before_5_24: None,
) -> None:
    said = "# zero:3+offload: DeepSpeed's own settings, in the config the script passes to deepspeed.initialize (pin_memory on a GPU)"
    section = (
        '"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": true}, '
        '"offload_param": {"device": "cpu", "pin_memory": true}}'
    )
    zero = answer("zero:3+offload", outermost=("Block",))
    assert render(zero, "env").splitlines() == [
        "export AUTOTUNE_BATCH_SIZE=8",
        "export AUTOTUNE_PLAN=zero:3+offload",
        said,
        f"# {section}",
    ]
    assert render(zero, "hf").splitlines()[4:] == [said, section]
    assert section in render(zero, "lightning") and f"# {section}" in render(zero, "torchrun")


def test_best_in_lightning_words_and_as_the_filled_in_command() -> None:
    lines = render(answer("Block:1", grad_accum=2, outermost=("Block",)), "lightning").splitlines()
    assert lines[1:4] == [
        "Trainer(accumulate_grad_batches=2)",
        "DataLoader(..., batch_size=8)  # in train_dataloader(): the batch per device",
        "# with FSDPStrategy, activation_checkpointing_policy={Block} is the same plan",
    ]
    assert "#   self.model = autotune.prepare(self.model)" in lines
    template = answer(
        "Block:1",
        grad_accum=2,
        template=True,
        command=(
            "torchrun",
            "--nproc-per-node",
            "2",
            "train.py",
            "--bs",
            "{batch_size}",
            "--accum",
            "{grad_accum}",
        ),
    )
    assert render(template, "torchrun").splitlines()[1:] == [
        "# the script applies the plan with one line: model = autotune.prepare(model)",
        "AUTOTUNE_PLAN=Block:1 torchrun --nproc-per-node 2 train.py --bs 8 --accum 2",
    ]


def test_the_status_line_tells_the_whole_run_and_fits() -> None:
    from rich.console import Console

    from autotune.cli.console import ConsoleReporter

    reporter = ConsoleReporter(Console(width=160, file=io.StringIO()))
    reporter.searching(3, 10, 2)
    reporter.trial_started(4, 16, "LlamaDecoderLayer:0.5/save=attention+matmul", "frontier")
    reporter.best = TrialRecord(2, "COMPLETE", TrialKind.MEASURED, 8, "none", Outcome.COMPLETE, 2**28, 188.8)
    text = reporter._status_text(7, 3.2)
    assert re.fullmatch(
        r"3 of ≤10 trials, \ds, best 188.8/s, 2 may beat it \| trial 4: 16 x LlamaDecoderLayer:0.5/save=attn\+mm "
        r"\(frontier\), 7 steps, 3s",
        text,
    ), text
    narrow = ConsoleReporter(Console(width=80, file=io.StringIO()))
    narrow.searching(3, 10, None)
    narrow.trial_started(4, 16, "LlamaDecoderLayer:0.5/save=attention+matmul", "frontier")
    text = narrow._status_text(7, 3.2)
    assert len(text) <= 77 and re.match(
        r"3 of ≤10 trials, \ds \| trial 4: 16 x LDL:0.5/save=at… \(frontier\)", text
    )


def test_the_plans_table_has_no_column_of_blanks() -> None:
    """Issue 29: before any plan was measured, the savings table's "check" column was empty."""
    from autotune.cli.tables import checks_table
    from autotune.results.listing import PlanCheck

    def columns(*checks: PlanCheck) -> list[tuple[str, list[str]]]:
        table, _ = checks_table(checks, PlanNames(16))
        return [(str(c.header), [str(cell) for cell in c.cells]) for c in table.columns]

    unmeasured = PlanCheck("Block:1", 2.0 * 2**20, None, False)
    assert [name for name, _ in columns(unmeasured)] == ["plan", "predicted", "measured"]
    measured = PlanCheck("Block:0.5", 2**20, 0.9 * 2**20, False)
    assert columns(unmeasured, measured)[-1] == ("check", ["-", "ok"])


def test_the_probe_fits_the_terminal_and_tells_its_plans_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 44: at 80-100 columns five operator rows all read ``Block:1/reco…`` and every number wrapped onto
    three lines. Now one line per plan, each plan's name its own (shortened as run and show shorten it, the
    legend below), its saving whole on its line. `autotune probe`'s own rendering at each width, of one real
    probe of examples/gpt.py (~45 s here: probed once, drawn twice)."""
    examples = Path(__file__).resolve().parents[2] / "examples"
    result = api.probe(
        (str(examples / "gpt.py"),), device="cpu", timeout=300, cache_dir=tmp_path, environ=os.environ
    )
    assert result.outcome is Outcome.COMPLETE, result.error
    for width in (80, 100):
        monkeypatch.setenv("COLUMNS", str(width))
        out = console()
        out.file = io.StringIO()
        probed(out, result, as_json_flag=False)
        lines = out.file.getvalue().splitlines()
        assert all(len(line) <= width for line in lines), [line for line in lines if len(line) > width]
        header = next(
            i for i, line in enumerate(lines) if line.split()[:2] in (["plan", "freq"], ["level", "plan"])
        )
        rows = []
        for line in lines[header + 2 :]:  # below the header's rule, to the table's blank last line
            if not line.strip():
                break
            rows.append(line)
        assert len(rows) == 10  # 3 modules, 6 operator plans, offload: one line each, nothing wrapped
        plans = [r.split()[1 if width >= 100 else 0] for r in rows]
        assert len(set(plans)) == len(plans) and not any(p.endswith("…") for p in plans), plans
        assert all(
            re.search(r"\s-?\d+(\.\d\d)? ([KMG]i)?B\s+-?\d+(\.\d\d)? ([KMG]i)?B\s+\d+%", r) for r in rows
        ), rows
        prose = " ".join(line.strip() for line in lines[header + 2 + len(rows) :])  # wrapped at words
        assert re.search(r"plans shortened: .*rc= = recompute", prose), prose


def test_studies_of_one_script_run_two_ways_read_apart(tmp_path: Path) -> None:
    """Issue 44: the script form and the command form of one script were two identical rows."""
    common = ["run", "--device", "cpu", "--budget", "200MiB", "--batch-sizes", "8", "--plans", "none",
              "--steps", "2", "--warmup-steps", "1", "--cache-dir", str(tmp_path)]  # fmt: skip
    args = ["--base-mib", "20", "--step-seconds", "0.01"]
    for form in ([str(SYNTHETIC), "--", *args], ["--", "python", str(SYNTHETIC), *args]):
        ran = CliRunner().invoke(cli, [*common, *form])
        assert ran.exit_code == 0, ran.output
    result = CliRunner().invoke(cli, ["studies", "--cache-dir", str(tmp_path)], env={"COLUMNS": "160"})
    commands = sorted(re.split(r"\s{2,}", line.strip())[-1] for line in result.output.splitlines()[2:])
    assert commands == [
        "python synthetic.py --base-mib 20 --step-seconds 0.01",
        "synthetic.py --base-mib 20 --step-seconds 0.01",
    ], result.output
