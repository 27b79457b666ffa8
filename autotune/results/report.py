"""``autotune report``: one self-contained HTML file about a study, to look at and to pass on.

The page holds the Pareto plot (autotune.results.figures, inline SVG: it opens with no network and no
JavaScript), the answer in each framework's words (autotune.results.formats), every trial, the probe's
predicted savings beside the measured ones, and Optuna's own plots of the study. A few lines of script
check, once the browser has laid the page out, that the plot has its trials and its size, and write what
they found into ``<body data-rendered>``: what the browser test reads.
"""

from __future__ import annotations

import html
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from autotune.core.budget import format_bytes, signed_bytes
from autotune.core.errors import AutotuneError
from autotune.core.paths import location_words
from autotune.results.figures import plotted_text
from autotune.results.listing import FLAG_MEANING, not_run_line
from autotune.search.records import TrialKind, TrialRecord

if TYPE_CHECKING:
    from autotune.results.best import BestAnswer
    from autotune.results.listing import PlanCheck, StudyReport
    from autotune.storage import Store

_CHECK_SCRIPT = """
window.addEventListener("load", () => {
  const plot = document.querySelector("#pareto svg");
  const found = {width: 0, height: 0, trials: 0, winner: false, budget: false};
  if (plot) {
    const box = plot.getBoundingClientRect();
    found.width = Math.round(box.width);
    found.height = Math.round(box.height);
    for (const group of plot.querySelectorAll('g[id^="trials-"]')) {
      for (const mark of group.querySelectorAll("use, path")) {
        const b = mark.getBoundingClientRect();
        if (b.width > 0 && b.height > 0) found.trials += 1;
      }
    }
    const winner = plot.querySelector("#winner");
    found.winner = !!winner && winner.getBoundingClientRect().width > 0;
    found.budget = !!plot.querySelector("#budget");
  }
  document.body.dataset.rendered = JSON.stringify(found);
});
"""

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.8em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 0.88em; } td, th { padding: 3px 9px; text-align: left; }
th { border-bottom: 1px solid #999; } tr:nth-child(even) { background: #f6f6f6; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
pre { background: #f4f4f4; padding: 0.7em; white-space: pre-wrap; font-size: 0.85em; }
.over { color: #b03a2e; } .oom { color: #8e44ad; } .failed { color: #b03a2e; } .dim { color: #888; }
figure { margin: 0; } svg { max-width: 100%; height: auto; } #pareto svg { width: 100%; }
"""


@dataclass(frozen=True)
class Written:
    html: Path
    png: Path | None
    trials: int  # the trials the plot shows
    plotted: str  # how many of the table's trials those are, and why the others are not plotted


def write_report(store: Store, name: str, out: Path, png: Path | None = None) -> Written:
    """Write ``name``'s report to ``out`` (and the Pareto plot to ``png``).

    Raises:
        InputError: no study of that name.
    """
    import matplotlib

    matplotlib.use("Agg")
    from autotune.results import figures
    from autotune.results.listing import show

    report = show(store, name)
    answer = _answer(store, name)
    pareto = figures.pareto_figure(report)
    import optuna

    extra = figures.optuna_figures(optuna.load_study(study_name=name, storage=store.optuna))
    blocks = _answer_blocks(answer, location_words(store.display_url))
    page = _page(
        report, answer, figures.svg(pareto, "pareto"), [(t, figures.svg(f, t)) for t, f in extra], blocks
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page, encoding="utf-8")
    if png is not None:
        figures.png(pareto, str(png))
    plotted = figures.plotted_text(report.records, report.limit_bytes)
    return Written(out, png, len(figures.points(report.records, report.limit_bytes)), plotted)


def _answer(store: Store, name: str) -> BestAnswer | None:
    from autotune.results.best import best

    try:
        return best(store, study=name)
    except AutotuneError:  # nothing fits (yet): the page says so
        return None


def _phases_html(records: list[TrialRecord]) -> str:
    """Which trials peaked in warm-up (compilation, autotuning) rather than in their measured steps: the
    budget is checked against the whole run's peak, what the user's job will see."""
    warm = [r for r in records if r.peak_phase == "warm-up"]
    known = [r for r in records if r.peak_phase is not None]
    jobs = [r for r in known if r.phase_peaks]
    if not known:
        return ""
    out = ""
    if jobs:
        listed = ", ".join(
            f"#{r.number} (steady {format_bytes(r.steady_peak_bytes or 0)}"
            + "".join(
                f", {name} {format_bytes(peak)}" for name, peak in sorted((r.phase_peaks or {}).items())
            )
            + ")"
            for r in jobs
        )
        out += (
            f"<p>Phases of the job measured after the steps (evaluation, checkpoint save): "
            f"{html.escape(listed)}. Their peaks count against the budget like the steps'.</p>"
        )
    if not warm:
        return out + f"<p>No peak was set in warm-up ({len(known)} trials sampled by phase).</p>"
    listed = ", ".join(
        f"#{r.number} ({format_bytes(r.warmup_peak_bytes or 0)} in warm-up, "
        f"{format_bytes(r.steady_peak_bytes or 0)} steady)"
        for r in warm
    )
    return out + (
        f"<p>Peaks set in warm-up (compilation, autotuning, the allocator growing), not in the measured "
        f"steps: {html.escape(listed)}. The budget is checked against the whole run's peak.</p>"
    )


def _page(
    report: StudyReport, answer: BestAnswer | None, pareto: str, extra: list[tuple[str, str]], blocks: str
) -> str:
    row = report.row
    e = html.escape
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>autotune: {e(row.study_name)}</title>",
        f"<style>{_STYLE}</style>",
        f"<script>{_CHECK_SCRIPT}</script>",
        "</head><body>",
        f"<h1>autotune study {e(row.study_name)}</h1>",
        f"<p>{e(row.script)} &middot; budget {e(format_bytes(row.budget_bytes))}, limit "
        f"{e(format_bytes(report.limit_bytes))} (the budget less {row.headroom:.0%} headroom: what a "
        "trial's measured peak must stay under)</p>",
        _answer_head(answer),
        "<h2>Memory against speed</h2>",
        "<p>Every measured trial: one colour per plan. Filled: fits the limit; hollow: completed above it; "
        "a triangle: ran out of memory or was stopped over the budget, so it needs at least that much. The "
        "small bar left or right of a trial is the memory model's prediction for it, dotted to the measured "
        "peak. The star is the verified winner; the grey steps, the fastest that fits at each peak.</p>",
        f'<figure id="pareto">{pareto}<figcaption>{e(plotted_text(report.records, report.limit_bytes))}.'
        "</figcaption></figure>",
        blocks,
        "<h2>Trials</h2>",
        _trials_html(report.records, report.limit_bytes),
        _phases_html(report.records),
    ]
    if report.checks:
        parts += [
            "<h2>Plans: the probe's predicted savings beside the measured ones</h2>",
            _checks_html(report.checks),
        ]
    for title, svg in extra:
        parts += [f"<h2>{e(title)}</h2>", f"<figure>{svg}</figure>"]
    parts.append("</body></html>")
    return "\n".join(parts)


def _answer_head(answer: BestAnswer | None) -> str:
    if answer is None:
        return "<h2>The answer</h2><p>Nothing measured fits the budget yet.</p>"
    e = html.escape
    accum = f", {answer.grad_accum} micro-batches per optimizer step" if answer.grad_accum else ""
    return (
        f"<h2>The answer</h2><p><b>batch {e(str(answer.batch_size))}{e(accum)}, plan {e(answer.plan)}</b>: "
        f"{answer.samples_per_sec:,.1f} samples/s at a peak of {e(format_bytes(answer.peak_bytes))} "
        f"({e(answer.source)}).</p>"
        + (f"<p>How sure: {e(answer.certainty)}.</p>" if answer.certainty else "")
    )


def _answer_blocks(answer: BestAnswer | None, where: list[str]) -> str:
    """The answer in each framework's words, with the command that prints it (``where``: the database's
    options where it is not the default)."""
    from autotune.results.formats import render

    if answer is None:
        return ""
    e = html.escape
    study = shlex.join(["--study", answer.study, *where])  # quoted as the terminal's hints are: safe to paste
    blocks = [
        (
            "Your own command, filled in",
            f"autotune best {study} --format torchrun",
            render(answer, "torchrun"),
        ),
        ("Hugging Face Trainer", f"autotune best {study} --format hf", render(answer, "hf")),
        ("Lightning", f"autotune best {study} --format lightning", render(answer, "lightning")),
        (
            "A script that calls autotune's API",
            f'eval "$(autotune best {study} --env)"',
            render(answer, "env"),
        ),
    ]
    return "<h2>Use the answer</h2>" + "".join(
        f"<h3>{e(title)}</h3><p class=dim><code>{e(cmd)}</code></p><pre>{e(text)}</pre>"
        for title, cmd, text in blocks
    )


def _trials_html(records: list[TrialRecord], limit: int) -> str:
    e = html.escape
    rows = []
    for r in records:
        if r.kind in (TrialKind.SKIPPED, TrialKind.COPY):
            continue
        outcome = r.outcome_text(limit)
        css = {"fits": "", "over limit": "over"}.get(outcome, outcome)
        predicted = format_bytes(r.predicted_peak_bytes) if r.predicted_peak_bytes else ""
        note = r.note_text
        log = f" <span class=dim>log: {e(r.log_dir)}</span>" if r.log_dir and r.error else ""
        batch = f"{r.batch_size}x{r.grad_accum}" if r.grad_accum else str(r.batch_size)
        cells = [
            f"<td class=n>{r.number}</td><td class=n>{e(batch)}</td><td>{e(r.plan or '')}</td>",
            f"<td class={css}>{e(outcome)}</td>",
            f"<td class=n>{e(format_bytes(r.peak_bytes)) if r.peak_bytes is not None else ''}</td>",
            f"<td class=n>{e(predicted)}</td>",
            f"<td class=n>{f'{r.samples_per_sec:,.1f}' if r.samples_per_sec else ''}</td>",
            f"<td>{e(str(note or ''))}{log}</td>",
        ]
        rows.append("<tr>" + "".join(cells) + "</tr>")
    head = "".join(
        f"<th>{h}</th>" for h in ("#", "batch", "plan", "outcome", "peak", "predicted", "samples/s", "note")
    )
    not_run = not_run_line(records)
    tail = f"<p class=dim>{e(not_run)}.</p>" if not_run else ""
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>{tail}"


def _checks_html(checks: list[PlanCheck]) -> str:
    e = html.escape

    def saving(size: float | None) -> str:
        return "not measured" if size is None else signed_bytes(size)

    checked = any(c.measured is not None for c in checks)  # no column of blanks before any plan was measured
    rows = "".join(
        f"<tr><td>{e(c.plan)}</td><td class=n>{e(saving(c.predicted))}</td><td class=n>{e(saving(c.measured))}"
        + (f"</td><td class={'over' if c.flagged else ''}>{e(c.verdict)}" if checked else "")
        + "</td></tr>"
        for c in checks
    )
    legend = (
        f"<p class=dim>Savings are per sample, against plan none. {e(FLAG_MEANING)}</p>"
        if any(c.flagged for c in checks)
        else "<p class=dim>Savings are per sample, against plan none.</p>"
    )
    head = "<tr><th>plan</th><th>predicted saving</th><th>measured saving</th>" + (
        "<th>check</th></tr>" if checked else "</tr>"
    )
    return f"<table>{head}{rows}</table>{legend}"
