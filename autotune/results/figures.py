"""The pictures of a study, drawn with matplotlib (the one plotting library: see pyproject.toml).

``pareto_figure`` is autotune's own: peak memory against samples/s, one colour per plan, the budget and the
limit as lines, the winner marked, out-of-memory and over-budget trials drawn as the lower bounds they are,
and the memory model's prediction beside each measured peak. ``optuna_figures`` are Optuna's own plots of
the same study, where they apply: what Optuna already draws is not drawn again here.

Each artist that stands for trials carries an SVG id (``trials-<n>``, ``winner``, ``budget``...), so the
HTML report, and the test that renders it in a browser, can find them.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from autotune.core.budget import format_bytes
from autotune.core.protocol import Outcome
from autotune.search.noise import overruled
from autotune.search.records import TrialKind, TrialRecord

if TYPE_CHECKING:
    import optuna
    from matplotlib.figure import Figure

    from autotune.results.listing import StudyReport

PLOTTED = (TrialKind.MEASURED, TrialKind.WARM_START)  # a verification is the winner's star


@dataclass(frozen=True)
class Point:
    """One trial on the plot: where it lies and how it ended."""

    number: int
    batch_size: int
    plan: str
    peak_bytes: int
    samples_per_sec: float
    predicted_peak_bytes: int | None
    state: str  # "fits", "over" (complete above the limit), "oom" (a lower bound: out of memory or stopped)


def points(records: Sequence[TrialRecord], limit: int) -> list[Point]:
    """The trials a memory-speed plot can place: every measured one with a peak (failures have none)."""
    found = []
    for r in records:
        if r.kind not in PLOTTED or not r.measured or r.peak_bytes is None or r.batch_size is None:
            continue
        state = "oom" if r.outcome is not Outcome.COMPLETE else ("fits" if r.fits(limit) else "over")
        found.append(
            Point(
                r.number,
                r.batch_size,
                r.plan or "none",
                r.peak_bytes,
                r.samples_per_sec or 0.0,
                r.predicted_peak_bytes,
                state,
            )
        )
    return found


def plotted_text(records: Sequence[TrialRecord], limit: int) -> str:
    """How many of the trials the report's table lists the plot shows, and why the others are not on it
    (the table lists every trial but the skipped and copied ones)."""
    tabled = [r for r in records if r.kind not in (TrialKind.SKIPPED, TrialKind.COPY)]
    shown = {p.number for p in points(records, limit)}
    why: dict[str, int] = {}
    for r in tabled:
        if r.number in shown:
            continue
        reason = "verification" if r.kind is TrialKind.VERIFICATION else f"{r.outcome or r.state.lower()}"
        why[reason] = why.get(reason, 0) + 1
    text = f"{len(shown)} of the {len(tabled)} trials in the table plotted"
    if not why:
        return text
    said = [
        f"{n} verification{'s' if n > 1 else ''} (the winner's star)" if reason == "verification" else
        f"{n} {reason} with no peak"
        for reason, n in why.items()
    ]  # fmt: skip
    return f"{text}: not plotted, {', '.join(said)}"


def pareto_front(found: Sequence[Point]) -> list[Point]:
    """The trials that fit and that no other fitting trial beats on both memory and speed, lightest first."""
    front: list[Point] = []
    for p in sorted(
        (p for p in found if p.state == "fits"), key=lambda p: (p.peak_bytes, -p.samples_per_sec)
    ):
        if not front or p.samples_per_sec > front[-1].samples_per_sec:
            front.append(p)
    return front


def _unit(limit: int) -> tuple[float, str]:
    return (2**30, "GiB") if limit >= 4 * 2**30 else (2**20, "MiB")


def pareto_figure(report: StudyReport) -> Figure:
    """Peak memory (x) against samples/s (y) for every measured trial of ``report``'s study."""
    from matplotlib.figure import Figure  # the object API: no pyplot state, no GUI backend

    limit, budget = report.limit_bytes, report.row.budget_bytes
    found = points(report.records, limit)
    scale, unit = _unit(budget)
    fig = Figure(figsize=(11, 5.4), layout="constrained")
    ax = fig.subplots()
    ax.set_gid("pareto-axes")
    plans = list(dict.fromkeys(p.plan for p in found))
    palette = _palette(len(plans))
    for index, plan in enumerate(plans):
        mine = [p for p in found if p.plan == plan]
        colour = palette[index]
        for state, marker, filled in (("fits", "o", True), ("over", "o", False), ("oom", ">", False)):
            chosen = [p for p in mine if p.state == state]
            if not chosen:
                continue
            art = ax.scatter(
                [p.peak_bytes / scale for p in chosen],
                [p.samples_per_sec for p in chosen],
                s=46,
                marker=marker,
                facecolors=colour if filled else "none",
                edgecolors=colour,
                linewidths=1.6,
                label=plan if state == "fits" or not any(p.state == "fits" for p in mine) else None,
                zorder=3,
                clip_on=False,  # a trial stopped before any speed sits on the axis: drawn whole
            )
            art.set_gid(f"trials-{index}-{state}")
        predicted = [p for p in mine if p.predicted_peak_bytes and p.state != "oom"]
        for p in predicted:
            ax.plot(
                [p.predicted_peak_bytes / scale, p.peak_bytes / scale],  # type: ignore[operator]
                [p.samples_per_sec, p.samples_per_sec],
                color=colour,
                linestyle=":",
                linewidth=1,
                alpha=0.7,
                zorder=2,
            )
        if predicted:
            art = ax.scatter(
                [p.predicted_peak_bytes / scale for p in predicted],  # type: ignore[operator]
                [p.samples_per_sec for p in predicted],
                s=22,
                marker="|",
                color=colour,
                alpha=0.8,
                zorder=2,
            )
            art.set_gid(f"predicted-{index}")
    # no front through a reading that a side-by-side verification of its configuration overruled
    out = overruled(report.records)
    front = pareto_front([p for p in found if p.number not in out])
    if len(front) > 1:
        (line,) = ax.step(
            [p.peak_bytes / scale for p in front],
            [p.samples_per_sec for p in front],
            where="post",
            color="0.55",
            linewidth=1,
            zorder=1,
            label="Pareto front (fits)",
        )
        line.set_gid("front")
    ax.axvline(budget / scale, color="#c0392b", linewidth=1.6, label=f"budget {format_bytes(budget)}")
    ax.lines[-1].set_gid("budget")
    if limit != budget:
        ax.axvline(
            limit / scale,
            color="#c0392b",
            linewidth=1,
            linestyle="--",
            label=f"limit {format_bytes(limit)} (budget less headroom)",
        )
        ax.lines[-1].set_gid("limit")
    best = report.best
    if best is not None:
        star = ax.scatter(
            [best.verified_peak_bytes / scale],
            [best.verified_samples_per_sec],
            s=260,
            marker="*",
            color="#f1c40f",
            edgecolors="black",
            linewidths=0.8,
            zorder=4,
            label=f"winner: batch {best.batch_size}, {best.plan}",
        )
        star.set_gid("winner")
    # the legend's own markers for the outcomes the trials had
    for state, marker, text in (
        ("over", "o", "complete, over the limit"),
        ("oom", ">", "out of memory or stopped: needs more"),
    ):
        if any(p.state == state for p in found):
            ax.scatter([], [], marker=marker, facecolors="none", edgecolors="0.3", label=text)
    if any(p.predicted_peak_bytes for p in found):
        ax.scatter([], [], marker="|", color="0.3", label="predicted peak (dotted to measured)")
    ax.set_xlabel(f"peak memory ({unit}), measured")
    ax.set_ylabel("samples/s")
    tops = [p.samples_per_sec for p in found] + ([best.verified_samples_per_sec] if best is not None else [])
    ax.set_ylim(0, max(tops, default=1.0) * 1.12 or 1.0)  # room above the best for its star
    ax.set_xlim(left=0, right=max([budget / scale * 1.08, *(p.peak_bytes / scale * 1.05 for p in found)]))
    ax.grid(True, alpha=0.3)
    count = f"{len(found)} measured trial{'s' if len(found) != 1 else ''}"
    ax.set_title(f"{report.row.study_name}: {count}", loc="left", fontsize=11)
    # beside the plot, never over it: inside, it covered the winner's star
    legend = fig.legend(loc="outside right upper", fontsize=8, frameon=False)
    legend.set_gid("legend")
    return fig


def _palette(count: int) -> list[tuple[float, float, float, float]]:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if count <= 10 else "tab20"]
    return [tuple(cmap(i % cmap.N)) for i in range(count)]  # type: ignore[misc]


def optuna_figures(study: optuna.Study) -> list[tuple[str, Figure]]:
    """Optuna's own plots that apply to an autotune study: the optimization history (infeasible trials
    greyed by Optuna itself, from the memory constraint) and, with two parameters that varied over at least
    two complete trials, their importance for samples/s. Empty when the study has too few trials."""
    import matplotlib
    import optuna
    from matplotlib.figure import Figure

    matplotlib.use("Agg")  # Optuna draws through pyplot: never a GUI backend for a file
    from optuna.visualization import matplotlib as plots

    complete = [t for t in study.get_trials(deepcopy=False) if t.state is optuna.trial.TrialState.COMPLETE]
    if len(complete) < 2:
        return []
    axes = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the matplotlib plots are marked experimental
        axes.append(("Optuna: optimization history", plots.plot_optimization_history(study)))
        varied = [name for name in ("batch_size", "plan") if len({t.params.get(name) for t in complete}) > 1]
        if len(varied) == 2:
            axes.append(("Optuna: parameter importance", plots.plot_param_importances(study)))
    figures = []
    for title, ax in axes:
        fig = ax.get_figure(root=True)
        assert isinstance(fig, Figure)
        fig.set_size_inches(8, 4.2)
        figures.append((title, fig))
    return figures


def svg(fig: Figure, salt: str) -> str:
    """The figure as inline SVG text (no XML prolog), for an HTML page that needs no network. ``salt`` keeps
    the ids matplotlib generates apart from those of the page's other figures."""
    import matplotlib

    buffer = io.StringIO()
    with matplotlib.rc_context({"svg.hashsalt": salt}):
        fig.savefig(buffer, format="svg")
    text = buffer.getvalue()
    return text[text.index("<svg") :]


def png(fig: Figure, path: str, dpi: int = 150) -> None:
    fig.savefig(path, format="png", dpi=dpi)
