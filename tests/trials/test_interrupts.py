"""Ctrl-C lands only where it is safe: inside allow() at once, elsewhere at the next check()."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from autotune.hardware.meters import RssMeter
from autotune.trials.interrupts import InterruptShield, TrialInterrupted
from autotune.trials.launcher import Launch, run_process


@pytest.fixture(autouse=True)
def python_s_own_ctrl_c_handler():
    """Python's own SIGINT handler, whatever this process inherited: a shell starts background jobs (CI
    under nohup, say) with SIGINT ignored, and Python then keeps it ignored."""
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, inherited)


def sigint() -> None:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.05)  # let the interpreter run the handler


def test_outside_allow_a_ctrl_c_waits_for_the_next_check() -> None:
    with InterruptShield() as shield:
        sigint()  # e.g. between Optuna's ask and the trial's start: nothing may be left half done
        assert shield.pending
        with pytest.raises(KeyboardInterrupt):
            shield.check()
        shield.check()  # raised once


def test_inside_allow_a_ctrl_c_interrupts_at_once_and_a_pending_one_before_it_starts() -> None:
    with InterruptShield() as shield:
        with pytest.raises(KeyboardInterrupt), shield.allow():
            sigint()
            pytest.fail("not interrupted")
        sigint()
        with pytest.raises(KeyboardInterrupt), shield.allow():
            pytest.fail("a pending Ctrl-C must stop the next trial before it starts")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored


def test_a_ctrl_c_still_held_when_the_shield_closes_is_raised_not_lost() -> None:
    with pytest.raises(KeyboardInterrupt), InterruptShield():
        sigint()  # e.g. while a cached answer is read: the command must still stop with 130
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


class CtrlCAsItStarts(RssMeter):
    """A real meter that sends this process a real SIGINT as it starts: the moment between the shim's start
    and the wait for it, where a Ctrl-C once left the trial running after its tuner had gone (CI saw it)."""

    def start(self, processes, ceiling=None, ranks=None, phase=None) -> None:
        self.shim = processes.args[0]  # type: ignore[attr-defined]  # functools.partial(descendants, pid)
        sigint()
        super().start(processes, ceiling, ranks)


def launch(tmp_path: Path) -> Launch:
    return Launch(
        argv=(sys.executable, "-c", "import time; time.sleep(60)"),
        env=dict(os.environ),
        workdir=tmp_path,
        progress_path=tmp_path / "progress",
        startup_timeout=60,
        timeout=60,
        grace=1,
    )


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"  # a zombie has ended


@pytest.mark.parametrize("shielded", [True, False], ids=["shielded", "unshielded"])
def test_a_ctrl_c_as_the_shim_starts_stops_the_trial(tmp_path, shielded: bool) -> None:
    meter = CtrlCAsItStarts()
    started = time.monotonic()
    if shielded:  # the tuner: the held Ctrl-C is raised as the wait begins, the trial stopped
        with pytest.raises(TrialInterrupted), InterruptShield() as shield:
            run_process(launch(tmp_path), meter, interruptible=shield.allow)
    else:  # a bare library call: the KeyboardInterrupt lands in the metering, which now stops the shim too
        with pytest.raises(KeyboardInterrupt):
            run_process(launch(tmp_path), meter)
    assert time.monotonic() - started < 30  # stopped, not waited for (the trial sleeps 60 s)
    assert gone(meter.shim)
