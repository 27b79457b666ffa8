"""Ctrl-C lands only where it is safe: inside allow() at once, elsewhere at the next check()."""

from __future__ import annotations

import os
import signal
import time

import pytest

from autotune.trials.interrupts import InterruptShield


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
