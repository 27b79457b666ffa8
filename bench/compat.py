"""The compatibility table: for each model family of tests/compat (Hugging Face GPT-2, Llama, BERT built
from configs, a torchvision ResNet-18, the Lightning module of examples/), every plan the probe lists, by
kind: whether the search may use it (or why not), its predicted saving, and its measured peak and
samples/s against no plan at one batch size, on this machine.

    .venv/bin/python bench/compat.py [--repeats 2] [--families gpt2,llama]

Each plan is measured --repeats times interleaved with no plan (peak: median; the speed ratio per round,
so that a load that changes between rounds cancels out). Prints a Markdown table (the README's) and the
details. Operator rows that recompute a single cheap kind are listed by the probe but not searched by
default; they are measured here too.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

from autotune.backends.probe import default_plans, rows
from autotune.backends.probe_report import TorchProbeReport
from autotune.core.budget import format_bytes
from autotune.core.plans import parse_plan
from autotune.hardware.devices import cpu_device
from autotune.hardware.meters import RssMeter
from autotune.trials.command import TrialCommand
from autotune.trials.measurement import run_trial
from autotune.trials.result import TrialResult
from autotune.trials.settings import TrialSettings

ROOT = Path(__file__).resolve().parent.parent
BATCH = {"gpt2": 16, "llama": 16, "bert": 16, "resnet": 16, "lightning": 32}
SETTINGS = TrialSettings(warmup_steps=1, measured_steps=4, startup_timeout=180, timeout=600)
ALLOCATOR = {"MALLOC_MMAP_THRESHOLD_": "65536"}  # glibc returns big blocks at once: peaks repeat


def command(family: str) -> TrialCommand:
    if family == "lightning":
        script = [str(ROOT / "examples" / "lightning_module.py"), "--batch-size", "{batch_size}"]
    else:
        script = [str(ROOT / "tests" / "compat" / "scripts" / "train.py"), "--model", family]
        script += ["--batch-size", "{batch_size}"]
    return TrialCommand.parse([sys.executable, *script])


def trial(family: str, plan: str, root: Path, probe: bool = False) -> TrialResult:
    return run_trial(
        command(family),
        4 if probe else BATCH[family],
        parse_plan(plan),
        cpu_device(),
        RssMeter(),
        SETTINGS,
        root,
        {**os.environ, **ALLOCATOR},
        probe=probe,
    )


def kind(plan: str, outer: set[str]) -> str:
    rule = parse_plan(plan).rules[0]
    if rule.ops is None:
        return "module, outermost" if rule.cls in outer else "module, nested"
    return f"operator, {rule.ops.mode}=" + ("…" if rule.ops.mode == "save" else "+".join(rule.ops.kinds))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--families", default=",".join(BATCH))
    args = parser.parse_args()
    print(
        f"machine: {platform.node()} {platform.processor() or platform.machine()}, {os.cpu_count()} cores, CPU"
    )
    table = ["| model | plan | kind | searched | predicted saving | measured saving | samples/s vs none |"]
    table.append("|---|---|---|---|---|---|---|")
    for family in args.families.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            report = trial(family, "none", root, probe=True).probe
            assert isinstance(report, TorchProbeReport), family
            searched, _ = default_plans(report)
            outer = {c.cls for c in report.candidates if c.outermost}
            listed = rows(report)
            peaks: dict[str, list[int]] = {"none": []}
            ratios: dict[str, list[float]] = {}
            failures: dict[str, str] = {}
            for _ in range(args.repeats):
                base = trial(family, "none", root)
                peaks["none"].append(base.peak_bytes)
                for row in listed:
                    result = trial(family, row.plan, root)
                    if result.samples_per_sec is None or base.samples_per_sec is None:
                        failures[row.plan] = f"{result.outcome.value}: {(result.error or '').splitlines()[0]}"
                        continue
                    peaks.setdefault(row.plan, []).append(result.peak_bytes)
                    ratios.setdefault(row.plan, []).append(result.samples_per_sec / base.samples_per_sec)
            none_peak = statistics.median(peaks["none"])
            print(f"\n{family} (batch {BATCH[family]}): none peaks {format_bytes(none_peak)}", flush=True)
            for row in listed:
                why = "predicted to cost memory" if row.excluded.startswith("predicted") else row.excluded
                offered = "yes" if row.plan in searched else f"no: {why}" if row.excluded else "by name"
                if row.plan in failures:
                    measured, speed = f"failed ({failures[row.plan]})", "-"
                else:
                    saving = none_peak - statistics.median(peaks[row.plan])
                    measured = ("" if saving >= 0 else "−") + format_bytes(abs(saving))
                    r = ratios[row.plan]
                    speed = f"{statistics.median(r):.2f} ({min(r):.2f}-{max(r):.2f})"
                predicted = row.saving_bytes * BATCH[family] / report.batch_size
                sign = "" if predicted >= 0 else "−"
                table.append(
                    f"| {family} | `{row.plan}` | {kind(row.plan, outer)} | {offered} | "
                    f"{sign}{format_bytes(abs(predicted))} | {measured} | {speed} |"
                )
                print(
                    f"  {row.plan}: {offered}; predicted {sign}{format_bytes(abs(predicted))}, measured {measured}, speed {speed}"
                )
    print("\n" + "\n".join(table))


if __name__ == "__main__":
    main()
