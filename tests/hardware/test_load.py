"""The machine's load over a trial, read from the kernel's counters (files written here, in the kernel's
formats: a busy machine is not something a test can order)."""

from __future__ import annotations

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
