"""``autotune report``: a real study, its HTML opened in a real headless Chromium (Debian's, installed by
``make``'s browser target; skipped with the reason where it is absent), its PNG, and optuna-dashboard reading
the same database through its own API."""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
from pathlib import Path
from wsgiref.util import setup_testing_defaults

import optuna
import pytest

from conftest import AUTOTUNE, SYNTHETIC, synthetic_study

# none@8 fits (152 MiB), none@16 passes the 200 MiB budget (the guard stops it: over-budget), A:1 fits at both
# and is slower: a study with a winner, a front and an infeasible trial.
SCRIPT_ARGS = [
    *"--base-mib 40 --per-sample-mib 12 --plan-effects A:1=0.6:0.6".split(),
    *"--step-seconds 0.02 --per-sample-seconds 0.004".split(),
]
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",  # CI runs as root
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",  # a closed network: no calls home at start
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    cache = tmp_path_factory.mktemp("report")
    return cache, synthetic_study(cache, "none;A:1", *SCRIPT_ARGS)


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.skip("no Chromium to render the report in (make installs Debian's chromium when run as root)")
    return found


def render(browser: str, page: Path, profile: Path) -> dict:
    """What the page's own check found once Chromium had laid it out (``<body data-rendered>``)."""
    proc = subprocess.run(
        [browser, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--virtual-time-budget=5000", "--dump-dom",
         page.as_uri()],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    from html.parser import HTMLParser

    found: dict = {}

    class Body(HTMLParser):
        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            if tag == "body":
                found.update(json.loads(dict(attrs).get("data-rendered") or "{}"))

    Body().feed(proc.stdout)
    return found


def test_the_report_renders_its_plot_in_a_headless_browser(study, tmp_path) -> None:
    cache, name = study
    browser = chromium()
    out = tmp_path / "report.html"
    proc = subprocess.run(
        [AUTOTUNE, "report", name, "-o", str(out), "--png", "--cache-dir", str(cache)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    shown = json.loads(
        subprocess.run(
            [AUTOTUNE, "show", name, "--json", "--cache-dir", str(cache)], capture_output=True, timeout=60
        ).stdout
    )
    measured = [t for t in shown["trials"] if t["kind"] == "measured" and t["peak_bytes"] is not None]
    tabled = [t for t in shown["trials"] if t["kind"] not in ("skipped", "copy")]
    verifications = sum(t["kind"] == "verification" for t in tabled)
    assert len(tabled) == len(measured) + verifications  # every other trial of this study has a peak
    assert proc.stdout.splitlines() == [
        f"wrote {out} ({len(measured)} of the {len(tabled)} trials in the table plotted: not plotted, "
        f"{verifications} verification{'s' if verifications > 1 else ''} (the winner's star))",
        f"wrote {out.with_suffix('.png')}",
    ]
    assert {t["outcome"] for t in measured} == {"complete", "over-budget"}
    page = out.read_text()
    # self-contained: nothing for the browser to fetch
    assert "<script src" not in page and "<link" not in page and "url(http" not in page
    rendered = render(browser, out, tmp_path / "profile")
    assert rendered["trials"] == len(measured)  # every measured trial is a mark with a size on the screen
    assert rendered["winner"] is True and rendered["budget"] is True
    assert rendered["width"] >= 600 and rendered["height"] >= 300
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for section in (
        "The answer",
        "Memory against speed",
        "Use the answer",
        "Trials",
        "Optuna: optimization history",
    ):
        assert f">{section}<" in page, section
    # the commands carry the cache dir: the study is not in the default database (issue 27)
    assert f"autotune best --study {name} --cache-dir {cache} --format hf" in page


def test_a_report_without_a_study_is_one_line(tmp_path) -> None:
    proc = subprocess.run(
        [AUTOTUNE, "report", "nope", "--cache-dir", str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"Error: no study named 'nope' in sqlite:///{tmp_path}/autotune.db"
    ]


def dashboard_get(app, path: str) -> dict:
    """One GET through optuna-dashboard's WSGI app, as its own front end asks."""
    environ: dict = {"PATH_INFO": path, "REQUEST_METHOD": "GET", "wsgi.input": io.BytesIO()}
    setup_testing_defaults(environ)
    status: list[str] = []
    body = b"".join(app(environ, lambda s, h, *_: status.append(s)))
    assert status == ["200 OK"], (status, body[:500])
    return json.loads(body)


def test_the_dashboard_lists_over_budget_trials_as_infeasible(study) -> None:
    pytest.importorskip("optuna_dashboard")
    from optuna_dashboard import wsgi

    cache, name = study
    storage = optuna.storages.RDBStorage(f"sqlite:///{cache}/autotune.db")
    app = wsgi(storage)
    (listed,) = [s for s in dashboard_get(app, "/api/studies")["study_summaries"] if s["study_name"] == name]
    detail = dashboard_get(app, f"/api/studies/{listed['study_id']}")
    outcomes = {
        t.number: t.user_attrs.get("outcome")
        for t in optuna.load_study(study_name=name, storage=storage).trials
    }
    seen = {"complete": 0, "over-budget": 0}
    for trial in detail["trials"]:
        if trial["state"] != "Complete":
            continue
        outcome = outcomes[trial["number"]]
        seen[outcome] += 1
        assert len(trial["constraints"]) == 1  # one constraint, as Optuna sees it too
        feasible = all(c <= 0 for c in trial["constraints"])
        assert feasible == (outcome == "complete"), (trial["number"], outcome, trial["constraints"])
    assert seen["over-budget"] >= 1 and seen["complete"] >= 3
    # Optuna counts the constraint once: the same single value under its own key
    for trial in optuna.load_study(study_name=name, storage=storage).trials:
        if trial.state is optuna.trial.TrialState.COMPLETE:
            assert list(trial.constraints) == ["0"]


def test_a_study_where_nothing_fits_still_has_its_report(tmp_path) -> None:
    """A hopeless budget (exit 6 after two over-budget trials): the report says nothing fits, and plots the
    trials as the lower bounds they are, on the axis, drawn whole."""
    browser = chromium()
    argv = ["run", "--device", "cpu", "--budget", "30MiB", "--study", "tiny", "--cache-dir", str(tmp_path)]
    tuned = subprocess.run(
        [AUTOTUNE, *argv, str(SYNTHETIC), "--", "--base-mib", "60"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert tuned.returncode == 6, tuned.stderr
    out = tmp_path / "tiny.html"
    proc = subprocess.run(
        [AUTOTUNE, "report", "tiny", "-o", str(out), "--cache-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    found = re.fullmatch(r"wrote .+ \((\d+) of the (\d+) trials in the table plotted\)", proc.stdout.strip())
    assert found is not None, proc.stdout
    measured = int(found[1])
    assert measured == int(found[2])  # the probe and the over-budget trials: each a lower bound
    assert measured >= 1
    assert "Nothing measured fits the budget yet." in out.read_text()
    rendered = render(browser, out, tmp_path / "profile")
    assert (rendered["trials"], rendered["winner"], rendered["budget"]) == (measured, False, True)


def test_the_legend_lies_beside_the_plot_and_never_over_the_winner_s_star(study) -> None:
    """Issue 29: inside the plot, the legend could cover the winner's star."""
    import matplotlib

    matplotlib.use("Agg")
    from autotune.results.best import open_default
    from autotune.results.figures import pareto_figure
    from autotune.results.listing import show

    cache, name = study
    store = open_default(None, cache)
    fig = pareto_figure(show(store, name))
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.transforms import Bbox

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    (ax,) = fig.axes
    (legend,) = fig.legends
    (star,) = [c for c in ax.collections if c.get_gid() == "winner"]
    box = legend.get_window_extent(renderer)
    assert not box.overlaps(ax.get_window_extent(renderer))  # beside the axes, not inside them
    x, y = ax.transData.transform(star.get_offsets()[0])
    radius = (star.get_sizes()[0] ** 0.5) / 2 * fig.dpi / 72  # the marker's size is in points squared
    assert not box.overlaps(Bbox.from_extents(x - radius, y - radius, x + radius, y + radius))
    assert box.x0 >= ax.get_window_extent(renderer).x1 and box.x1 <= fig.bbox.x1  # whole, on the figure
