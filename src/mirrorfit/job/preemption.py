"""SIGTERM / SIGINT during training: finish the steps in flight, save, exit 75 ("try again").
Once training is set up, a signal sets a flag that the trainer's hooks and epoch callbacks and
the run's checks (before test evaluation, before each export commits) act on; a second Ctrl-C
stops at once. During set-up the handler raises :class:`Preempted`, and a watchdog ends a main
thread waiting in C++ after ``SETUP_GRACE_S``. (why: docs/architecture.md#preemption)
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

EXIT_PREEMPTED = 75  # sysexits EX_TEMPFAIL: "try again"; rerun the same command to resume
# Seconds a signal before training may take to end the run through Python before the watchdog
# ends the process: enough for the handler's exception to unwind, short next to a launcher's
# --grace-s (10 s).
SETUP_GRACE_S = 4.0


class Preempted(BaseException):
    """Raised by :class:`PreemptionGuard` after a signal, once the trainer's position is exact
    (and saved, with a checkpointer), or at once before training is set up. A BaseException,
    as KeyboardInterrupt: a user function's ``except Exception`` must not swallow it."""

    def __init__(
        self,
        signal_name: str,
        path: Path | None,
        epoch: int | None,
        step: int | None,
        *,
        text: str | None = None,
    ) -> None:
        super().__init__(text or _where(signal_name, path, epoch, step))
        self.signal_name, self.path = signal_name, path


def _where(signal_name: str, path: Path | None, epoch: int | None, step: int | None) -> str:
    """The line of a preemption at ``step`` (None: before training), saved at ``path``."""
    where = f"global step {step} ({epoch} epoch(s) done)"
    if step is None:
        return f"{signal_name} before training started; rerun the same command"
    if path is None:
        return (
            f"{signal_name} at {where}: nothing saved (no --checkpoint-dir), so a rerun "
            "starts over; pass --checkpoint-dir to make runs resumable"
        )
    return f"{signal_name}: saved {path} at {where}; rerun the same command to resume"


class PreemptionGuard:
    """Context manager that turns SIGTERM/SIGINT into :class:`Preempted` at the next safe point.
    ``trainer`` (or later through :meth:`watch`, so the guard covers set-up too); ``checkpointer``
    (optional) saves its position first. Pass ``guard.hook`` in the trainer's hooks (at most
    ``steps_per_execution`` steps run after the signal) and ``guard.epoch_callback`` last in its
    callbacks; call ``guard.check()`` between later phases.
    """

    def __init__(self, trainer=None, checkpointer=None) -> None:
        self.agree = lambda flag: flag
        self.watch(trainer, checkpointer)
        self.signal_name: str | None = None
        self._previous: dict[int, Any] = {}
        self._handed_over = False
        self._fitting = False
        self._fit_workers = 1
        self._trained: str | None = None  # after fit: where its last checkpoint is ("": none)
        self._watchdog = None

    def __enter__(self) -> "PreemptionGuard":
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._on_signal)
        self._watchdog = (
            _Watchdog(self) if threading.current_thread() is threading.main_thread() else None
        )
        return self

    def __exit__(self, *exc) -> None:
        if self._watchdog is not None:
            self._watchdog.close()
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    @property
    def setting_up(self) -> bool:
        """No trainer is watched yet and fit has not returned: nothing to save, so a signal
        stops the run at once (during fit its own handlers save and stop it)."""
        return self.trainer is None and not self._handed_over and self._trained is None

    def fitting(self, *, workers: int = 1) -> None:
        """``mirrorfit.fit`` trains from now on, on ``workers`` processes, and saves on a
        signal itself once the call in flight returns. One process: the watchdog leaves it
        be (a call may take longer than the grace: a CNN's on CPUs did). Several: a signal
        the process cannot act on (its main thread held in a collective of workers that
        stopped answering) still ends it after the grace."""
        self._fitting, self._fit_workers = True, workers

    def trained(self, checkpoint_dir: str | None) -> None:
        """``mirrorfit.fit`` returned, its last checkpoint (if any) in ``checkpoint_dir``: a
        signal from now on stops the run at the next :meth:`check` (the evaluation, the
        files written after it), saying where a rerun resumes."""
        self._trained = checkpoint_dir or ""

    def hand_over(self) -> None:
        """Signals are another part's from now on (a parameter-server task that only serves
        installs its own handlers): no stop at once, no watchdog."""
        self._handed_over = True

    def reclaim(self) -> None:
        """Take SIGTERM/SIGINT back after TensorFlow or user code took them:
        MultiWorkerMirroredStrategy installs TF's own C++ SIGTERM handler (its preemption
        notifier), and a ``--data`` function may set its own (or SIG_IGN); either silently
        replaced this guard's, so a preempted run trained on to the end."""
        if self.signal_name is None:
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, self._on_signal)

    def _on_signal(self, signum, frame) -> None:
        # once fit trains, what reaches this handler is a signal fit raised again after its
        # last epoch, having said it: taken, not said twice
        if self.signal_name is None and not self._fitting:
            self.signal_name = signal.Signals(signum).name
            then = ", then saving a checkpoint" if self.checkpointer else ""
            # os.write: print() from a handler can re-enter a half-done write to stderr.
            os.write(
                2,
                f"mirrorfit: {self.signal_name}: finishing the steps in flight{then}; "
                "Ctrl-C again stops at once\n".encode(),
            )
        self.signal_name = self.signal_name or signal.Signals(signum).name
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # a second Ctrl-C ends the process now
        # the flag may never be read (a --data function that never returns); fit's signal
        # stops at the next check()
        if self.setting_up and not self._fitting:
            raise Preempted(self.signal_name, None, None, None)

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
        if t is None and self._trained is not None:
            raise Preempted(name, None, None, None, text=_after_training(name, self._trained))
        if t is None:
            raise Preempted(name, None, None, None)
        path = None
        if self.checkpointer:
            path = self.checkpointer.save()
            self.checkpointer.wait()  # committed before the process ends
        raise Preempted(name, path, t.epoch, t.step)

    def hook(self, trainer) -> None:
        self.check()

    def epoch_callback(self, epoch: int, logs: dict) -> None:
        self.check()


def _after_training(name: str, checkpoint_dir: str) -> str:
    if not checkpoint_dir:
        return (
            f"{name} after training ended, before its results were written: nothing saved "
            "(no --checkpoint-dir), so a rerun trains again; pass --checkpoint-dir to make "
            "runs resumable"
        )
    return (
        f"{name} after training ended, before its results were written: the last epoch is "
        f"saved in {checkpoint_dir}; rerun the same command to write them (it resumes there "
        "and trains no more)"
    )


class _Watchdog:
    """Ends the process (exit 75, the preemption line) ``SETUP_GRACE_S`` after a signal that
    arrived before training was set up, if it is still running: the main thread may be waiting
    inside C++ (a dataset whose generator never yields), where no Python signal handler runs.
    Python's C-level handler writes the signal number to a pipe (``signal.set_wakeup_fd``) at
    once, whatever the main thread does; this thread reads it."""

    def __init__(self, guard: PreemptionGuard) -> None:
        self.guard = guard
        self.closed = False  # the guard was left (its run ended): never end the process then
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)  # the C handler must never block on a full pipe
        try:
            self._previous_fd = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        except ValueError:  # not the main thread of the main interpreter
            self._previous_fd = None
        threading.Thread(target=self._run, name="mirrorfit-preemption", daemon=True).start()

    def _run(self) -> None:
        while True:
            try:
                data = os.read(self._read, 64)
            except OSError:
                return
            if not data:  # closed
                os.close(self._read)
                return
            if not {signal.SIGTERM, signal.SIGINT} & set(data) or not self._acts():
                continue
            time.sleep(SETUP_GRACE_S)
            if self._acts() and not self.closed:  # stuck where no handler runs
                name = self.guard.signal_name or signal.Signals(data[0]).name
                said = (
                    f"preempted by {name} before training started; rerun the same command"
                    if not self.guard._fitting  # noqa: SLF001 (its own guard's)
                    else f"{name} while training, the process held inside TensorFlow or JAX "
                    "(a collective, or workers that stopped answering): stopped without a "
                    "new checkpoint; rerun the same command to resume from the newest one"
                )
                os.write(2, f"mirrorfit: {said}\n".encode())
                os._exit(EXIT_PREEMPTED)

    def _acts(self) -> bool:
        """Whether a signal not acted on within the grace ends the process: while setting up,
        and while mirrorfit.fit trains on several workers."""
        guard = self.guard
        fitting = guard._fitting  # noqa: SLF001 (its own guard's)
        return (guard.setting_up and not fitting) or (fitting and guard._fit_workers > 1)  # noqa: SLF001

    def close(self) -> None:
        self.closed = True
        if self._previous_fd is not None:
            signal.set_wakeup_fd(self._previous_fd)
        os.close(self._write)  # the thread's read returns b"": it ends
