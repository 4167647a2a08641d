"""job.preemption's guard: a signal fit raised again after its last epoch is taken, not
announced a second time (fit's own handler said it)."""

import os
import signal

from mirrorfit.job.preemption import PreemptionGuard


def test_a_signal_fit_raised_again_is_taken_and_not_said_twice(capfd):
    with PreemptionGuard() as guard:
        guard.fitting()
        os.kill(os.getpid(), signal.SIGTERM)  # as fitting.guards.Signals raises it again
        assert guard.signal_name == "SIGTERM"
    assert capfd.readouterr().err == ""  # before: a second notice, after fit's own


def test_a_signal_before_fit_is_said(capfd):
    with PreemptionGuard() as guard:
        guard.watch(object())  # set up: a signal waits for the next check
        os.kill(os.getpid(), signal.SIGTERM)
        assert guard.signal_name == "SIGTERM"
    assert "mirrorfit: SIGTERM: finishing the steps in flight" in capfd.readouterr().err
