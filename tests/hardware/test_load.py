"""The machine's load over a trial, read from the kernel's counters (files written here, in the kernel's
formats: a busy machine is not something a test can order)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from autotune.core import pressure
from autotune.hardware import load
from autotune.hardware.load import Load, LoadSnapshot


def counters(tmp_path, pressure_us: int, steal: int, idle: int) -> None:
    (tmp_path / "pressure").write_text(
        f"some avg10=0.00 avg60=0.00 avg300=0.00 total={pressure_us}\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
    )
    (tmp_path / "stat").write_text(f"cpu  100 0 50 {idle} 0 0 0 {steal} 0 0\ncpu0 1 2 3\n")


def test_cpu_pressure_and_steal_are_shares_of_the_trial_s_wall_time(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv(pressure.PRESSURE_ENV)
    monkeypatch.setattr(pressure, "PRESSURE_PATH", str(tmp_path / "pressure"))
    monkeypatch.setattr(load, "STAT_PATH", str(tmp_path / "stat"))
    counters(tmp_path, 1_000_000, 10, 840)
    before = LoadSnapshot.now()
    before = LoadSnapshot(
        before.at - 2.0, before.pressure_us, before.steal_ticks, before.total_ticks
    )  # 2 s ago
    counters(tmp_path, 1_800_000, 30, 1020)  # 0.8 s of pressure; 20 of 200 ticks stolen
    seen = before.until(LoadSnapshot.now())
    assert abs((seen.cpu_pressure or 0) - 0.4) < 0.01 and seen.steal == 0.1
    assert Load.from_dict(seen.to_dict()) == seen
    assert str(Load(0.4, 0.1, 1.5, 2)) == "CPU pressure 40%, steal 10%, load 1.5 on 2 cores"


def test_a_kernel_without_pressure_says_nothing_rather_than_quiet(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv(pressure.PRESSURE_ENV)
    monkeypatch.setattr(pressure, "PRESSURE_PATH", str(tmp_path / "absent"))
    monkeypatch.setattr(load, "STAT_PATH", str(tmp_path / "absent"))
    seen = LoadSnapshot.now().until(LoadSnapshot.now())
    assert (seen.cpu_pressure, seen.steal) == (None, None)
    assert Load.from_dict(None) is None and Load.from_dict({"cpu_pressure": "x"}) is None


def test_what_neither_the_trial_nor_the_tuner_used_is_a_neighbour_s(tmp_path, monkeypatch) -> None:
    """Issue 43: CPU pressure a trial's own processes make (a DataLoader's workers beside torch's threads)
    read as a busy machine on an idle one. A trial records what others used: the machine's busy CPU time
    (user, nice, system, irq, softirq) less the tuner's and the trial's, per second of wall time."""
    monkeypatch.setattr(load, "STAT_PATH", str(tmp_path / "stat"))
    monkeypatch.setattr(load, "TICK_SECONDS", 0.01)
    (tmp_path / "stat").write_text("cpu  100 0 50 800 7 5 5 0 0 0\n")  # busy: 160 ticks
    before = dataclasses.replace(LoadSnapshot.now(), own_seconds=10.0)
    before = dataclasses.replace(before, at=before.at - 2.0)  # 2 s ago
    (tmp_path / "stat").write_text("cpu  350 10 80 900 7 10 15 0 0 0\n")  # busy: 465 ticks, 3.05 s more
    later = dataclasses.replace(LoadSnapshot.now(), own_seconds=11.0)  # the tuner, and a reaped trial: 1 s
    seen = before.until(later, trial_seconds=1.55)  # a warm process alive at the end: 1.55 s since its rest
    assert abs((seen.others or 0) - 0.25) < 0.01 and seen.neighbour  # 0.5 CPU-s over 2 s: a neighbour
    assert "others used 0.25 CPU-s per s" in str(seen)
    assert Load.from_dict(seen.to_dict()) == seen
    quiet = before.until(later, trial_seconds=1.95)  # 0.1 CPU-s over 2 s on 2 cores: the machine's own
    assert abs((quiet.others or 0) - 0.05) < 0.01 and not quiet.neighbour
    assert Load(0.12, None, 0.5, 2).neighbour  # unknown: as if one was there, the pressure alone judging


def test_a_trial_s_own_busy_workers_are_its_cpu_time_in_a_process_of_its_own_and_warm(tmp_path) -> None:
    """Real processes: a synthetic trial forks two workers that spin on the CPU while it trains (each
    writing the CPU seconds it used). The CPU time counted as the trial's holds theirs, in a process of
    its own (the tuner's reaped children) and in a warm process's later configurations (the process's own
    count at rest): none of it can be read as a neighbour's."""
    import glob
    import os

    from autotune.core.plans import Backend, parse_plan
    from autotune.hardware.devices import cpu_device
    from autotune.hardware.meters import RssMeter
    from autotune.search.runner import TrialRunner
    from autotune.trials.command import TrialCommand
    from autotune.trials.measurement import run_trial
    from autotune.trials.settings import TrialSettings

    from conftest import SYNTHETIC

    burn = str(tmp_path / "burn")
    words = [str(SYNTHETIC), "--step-seconds", "0.1", "--burn-workers", "2", "--burn-file", burn]
    settings = TrialSettings(1, 4, 120, 300, tight=0)

    def burned() -> float:
        files = glob.glob(burn + ".*")
        total = sum(float(Path(f).read_text() or 0) for f in files)
        for f in files:
            os.remove(f)
        return total

    def counted(result) -> float:
        assert result.load is not None and result.load.cpu_per_wall is not None, result.load
        return result.load.cpu_per_wall * result.wall_seconds

    environ = dict(os.environ)
    alone = run_trial(
        TrialCommand.parse(words),
        1,
        parse_plan("none"),
        cpu_device(),
        RssMeter(),
        settings,
        tmp_path,
        environ,
    )
    used = burned()
    # the workers ran (on a loaded machine they get less of the trial's half-second: 0.07 CPU-s in one CI
    # run beside other tests, about 1 quiet)
    assert used > 0.02 and counted(alone) >= used, (counted(alone), used)
    runner = TrialRunner(
        TrialCommand.parse(words),
        Backend.TORCH,
        cpu_device(),
        RssMeter(),
        settings,
        tmp_path,
        environ,
        warm=True,
    )
    try:
        for batch in (1, 2):
            result = runner(batch, "none")
            used = burned()
            assert result.warm_run == batch and used > 0.02 and counted(result) >= used, (
                counted(result),
                used,
            )
    finally:
        runner.close()
