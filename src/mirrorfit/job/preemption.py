"""SIGTERM / SIGINT during training: finish the steps in flight, save, exit 75 ("try again").

A signal only sets a flag; the trainer's hooks and epoch callbacks, and the run's own checks
before test evaluation and before each export commits, act on it. So a signal during the last
epoch's validation or checkpoint is not dropped: the run stops before it exports. A second
Ctrl-C stops at once (the default handler is back after the first signal).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

EXIT_PREEMPTED = 75  # sysexits EX_TEMPFAIL: "try again"; rerun the same command to resume


class Preempted(Exception):
    """Raised by :class:`PreemptionGuard` after a signal, once the trainer's position is exact
    (and saved, with a checkpointer)."""

    def __init__(self, signal_name: str, path: Path | None, epoch: int | None,
                 step: int | None) -> None:
        where = f"global step {step} ({epoch} epoch(s) done)"
        if step is None:
            text = f"{signal_name} before training started; rerun the same command"
        elif path is None:
            text = (f"{signal_name} at {where}: nothing saved (no --checkpoint-dir), so a rerun "
                    "starts over; pass --checkpoint-dir to make runs resumable")
        else:
            text = f"{signal_name}: saved {path} at {where}; rerun the same command to resume"
        super().__init__(text)
        self.signal_name, self.path = signal_name, path


class PreemptionGuard:
    """Context manager that turns SIGTERM/SIGINT into :class:`Preempted` at the next safe point.

    ``trainer`` is the :class:`~mirrorfit.engine.controller.Trainer` (or given later with
    :meth:`watch`, so that the guard can cover the set-up too); ``checkpointer`` (optional)
    saves its position first. Pass ``guard.hook`` in the trainer's hooks (after each compiled
    execution: at most ``steps_per_execution`` steps run after the signal) and
    ``guard.epoch_callback`` last in its callbacks; call ``guard.check()`` between later phases.
    """

    def __init__(self, trainer=None, checkpointer=None) -> None:
        self.agree = lambda flag: flag
        self.watch(trainer, checkpointer)
        self.signal_name: str | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> "PreemptionGuard":
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._on_signal)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def reclaim(self) -> None:
        """Take SIGTERM/SIGINT back after TensorFlow took them: MultiWorkerMirroredStrategy
        installs TF's own C++ SIGTERM handler (its preemption notifier), which silently
        replaced this guard's, so a preempted worker trained on to the end."""
        if self.signal_name is None:
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, self._on_signal)

    def _on_signal(self, signum, frame) -> None:
        if self.signal_name is None:
            self.signal_name = signal.Signals(signum).name
            then = ", then saving a checkpoint" if self.checkpointer else ""
            # os.write: print() from a handler can re-enter a half-done write to stderr.
            os.write(2, f"mirrorfit: {self.signal_name}: finishing the steps in flight{then}; "
                        "Ctrl-C again stops at once\n".encode())
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # a second Ctrl-C ends the process now

    def watch(self, trainer, checkpointer=None, *, agree=None) -> None:
        """Guard ``trainer`` (saved through ``checkpointer``, if any) from now on. ``agree``
        (a Distribution's ``agree``) makes every worker of a cluster stop at the same step when
        any of them got a signal; :meth:`check` then runs a collective, so every worker must
        call it at the same points."""
        self.trainer, self.checkpointer = trainer, checkpointer
        if agree is not None:
            self.agree = agree

    def check(self) -> None:
        """Raise :class:`Preempted` (after saving, with a checkpointer) if a signal arrived,
        here or, in a cluster, at any worker."""
        if self.agree(self.signal_name is not None):
            self._stop(self.signal_name or "another worker's signal")

    def check_local(self) -> None:
        """:meth:`check` for this process alone (no collective): for points only the chief
        reaches, such as an export's commit."""
        if self.signal_name:
            self._stop(self.signal_name)

    def _stop(self, name: str) -> None:
        t = self.trainer
        if t is None:
            raise Preempted(name, None, None, None)
        path = self.checkpointer.save() if self.checkpointer else None
        raise Preempted(name, path, t.epoch, t.step)

    def hook(self, trainer) -> None:
        self.check()

    def epoch_callback(self, epoch: int, logs: dict) -> None:
        self.check()
