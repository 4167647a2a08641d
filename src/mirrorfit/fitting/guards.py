"""What stops a ``mirrorfit.fit`` between two calls of steps: SIGTERM/SIGINT (a checkpoint,
then :class:`~mirrorfit.job.preemption.Preempted`) and numbers that are no longer finite
(:class:`~mirrorfit.errors.DivergedError`, unless ``allow_nan``). The CLI's guarantees, the
same for a Keras script. (why: docs/keras-script.md#preemption-and-divergence)
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from mirrorfit._io import is_disk_full
from mirrorfit.errors import DivergedError
from mirrorfit.job.preemption import Preempted


class Signals:
    """While entered (in the main thread; elsewhere Python delivers no signal), SIGTERM and
    SIGINT set :attr:`name` instead of ending the process; a second Ctrl-C ends it at once.
    The handlers before are put back on exit, and a signal fit did not stop for (after its
    last epoch) is raised again for them."""

    def __init__(self) -> None:
        self.name: str | None = None
        self._previous: dict = {}

    def __enter__(self) -> "Signals":
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, self._on_signal)
        return self

    def __exit__(self, kind, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        if self.name is not None and kind is None and self._previous:
            # It came after the last epoch's end, where fit returns: not dropped, but given to
            # the handler before (a script's, mirrorfit train's; Python's default ends it)
            signal.raise_signal(getattr(signal, self.name))

    def _on_signal(self, signum, frame) -> None:
        if self.name is None:
            self.name = signal.Signals(signum).name
            # os.write: print() from a handler can re-enter a half-done write to stderr.
            os.write(
                2,
                f"mirrorfit: {self.name}: finishing the steps in flight, then saving a "
                "checkpoint if checkpoints are kept; Ctrl-C again stops at once\n".encode(),
            )
        signal.signal(signal.SIGINT, signal.SIG_DFL)


def preempted(name: str, path: Path | None, epoch: int, step: int) -> Preempted:
    """The exception ``fit`` raises after a signal: where it stopped, and what was saved."""
    error = Preempted(name, path, epoch, step)
    where = f"epoch {epoch + 1}, step {step}"
    error.args = (
        f"{name}: saved {path} at {where}; rerun with the same checkpoint_dir to resume"
        if path is not None
        else f"{name} at {where}: nothing saved (no checkpoint_dir), so a rerun starts over; "
        "give a checkpoint_dir to make the run resumable",
    )
    return error


def out_of_memory(error: BaseException) -> bool:
    """TensorFlow's ResourceExhaustedError, or JAX's RESOURCE_EXHAUSTED (its JaxRuntimeError,
    XlaRuntimeError before JAX 0.5); TensorFlow reports a full disk with the same error."""
    tf = sys.modules.get("tensorflow")
    if tf is not None and isinstance(error, tf.errors.ResourceExhaustedError):
        return True
    jax_errors = getattr(sys.modules.get("jax"), "errors", None)
    runtime = getattr(jax_errors, "JaxRuntimeError", None)
    jax_error = (runtime is not None and isinstance(error, runtime)) or type(
        error
    ).__name__ == "XlaRuntimeError"
    return jax_error and "RESOURCE_EXHAUSTED" in str(error)


@contextlib.contextmanager
def memory_noted(batch_size: int, backend: str) -> Iterator[None]:
    """The framework's out-of-memory error raised as it is (a script may catch its type), with
    a note of what to try in this API's words."""
    try:
        yield
    except Exception as e:
        if out_of_memory(e) and not is_disk_full(e):
            from mirrorfit.engine.backends import capabilities

            splits = capabilities(backend).splits_state
            split = ", or setup(shard='optimizer' or 'all') to split the state" * splits
            e.add_note(
                f"mirrorfit.fit: out of memory while training at batch_size={batch_size}; "
                "where the step ran out (not a callback), try a smaller batch_size with "
                "accum_steps=K (K micro-batches a step keep the effective batch), "
                f"setup(precision='bf16'){split}"
            )
        raise


class Divergence:
    """The loss after each call of steps and the weights at each epoch's end, checked finite:
    DivergedError naming where and the newest checkpoint (``last()``: its path or None)."""

    # Seconds between two reads of the loss inside an epoch: each read waits for the devices,
    # which cost a small model 10% of its speed when done after every call (measured:
    # benchmarks/keras_fit.py, fit against fit-nan); the epoch's end and every checkpoint
    # read it too.
    INTERVAL_S = 0.5

    def __init__(self, allow: bool, last, *, every_call: bool = False) -> None:
        # every_call: several workers, whose reads are collectives at the same calls (a clock
        # would choose other calls on each)
        self.allow, self._last_checkpoint, self._every_call = allow, last, every_call
        self.finite: tuple[float, str] | None = None  # the last finite loss, and where
        self._pending = None  # (read the loss, epoch, step) of a call, not yet checked
        self._noted_at = -math.inf
        self.steps = 0  # optimizer steps trained by this fit
        self._applied_before: int | None = None  # fp16: the optimizer's applied steps
        self._fp16 = False
        self._resumed = False

    def updates_begin(self, model, *, resumed: bool = False) -> None:
        """Note the steps a loss-scaled (fp16) optimizer has applied, before training;
        ``resumed``: from a checkpoint of steps trained (a rerun after every step was skipped
        has none left to train, and must still fail)."""
        from mirrorfit.fitting.metrics import overrides

        self._applied_before = _applied_steps(model)
        self._fp16 = self._applied_before is not None
        self._resumed = resumed
        if overrides(model, "train_step"):  # its own step may step its own optimizers (GANs)
            self._applied_before = None

    def check_updates(self, model) -> None:
        """DivergedError where fp16's loss scaling skipped every step this fit trained (each
        one's gradients overflowed): the weights are the ones it began with. Even with
        ``allow_nan``: no value is NaN, and nothing trained."""
        if self._applied_before is None:
            return
        applied = _applied_steps(model)
        fix = (
            "the weights never changed; scale the inputs down, train in bf16 or fp32 "
            "(setup(precision=), --precision), or with a lower learning rate"
        )
        if self.steps and applied == self._applied_before:
            raise DivergedError(
                f"every one of the {self.steps} optimizer steps was skipped for non-finite "
                f"fp16 gradients: {fix}"
            )
        if not self.steps and self._resumed and applied == 0:
            raise DivergedError(
                "the checkpoint resumed from was trained without one optimizer step applied "
                f"(each one skipped for non-finite fp16 gradients): {fix}"
            )

    def after_call(self, runner, epoch: int, step: int) -> None:
        """After a call of steps that reached ``step`` was dispatched: the loss noted at an
        earlier call checked (the devices have moved on by now), and this one's noted where
        :data:`INTERVAL_S` has passed (several workers: every call)."""
        self.check_pending()
        now = time.monotonic()
        if not self.allow and (self._every_call or now - self._noted_at >= self.INTERVAL_S):
            self._pending, self._noted_at = (runner.loss_later(), epoch, step), now

    def check_now(self, runner, epoch: int, step: int) -> None:
        """The loss after ``step`` checked now (before a checkpoint, at an epoch's end)."""
        self.check_pending()
        if not self.allow:
            self.check_loss(runner.loss_later()(), epoch, step)

    def check_pending(self) -> None:
        if self._pending is not None:
            read, epoch, step = self._pending
            self._pending = None
            self.check_loss(read(), epoch, step)

    def check_loss(self, loss: float | None, epoch: int, step: int) -> None:
        """DivergedError if the mean training ``loss`` after ``step`` of ``epoch`` is not
        finite (None: no loss is tracked, nothing to check)."""
        if self.allow or loss is None:
            return
        where = f"step {step} of epoch {epoch + 1}"
        if math.isfinite(loss):
            self.finite = (loss, where)
            return
        last = (
            f"last finite: {self.finite[0]:.6g} after {self.finite[1]}"
            if self.finite
            else "not finite at the first check"
        )
        # fp16 holds at most 65504: larger inputs or activations are inf, whatever the rate
        fp16 = "; under fp16, inputs scaled down or bf16 (--precision)" if self._fp16 else ""
        raise DivergedError(
            f"the training loss is {loss} after {where} ({last}); stopped{self._kept()}; "
            f"try a lower learning rate{fp16}, or allow_nan=True (--allow-nan) to train on "
            "as Keras does"
        )

    def check_weights(self, model, epoch: int, loss) -> None:
        if self.allow:
            return
        from mirrorfit.artifacts.finite import first_non_finite

        bad = first_non_finite(model.weights)
        if bad is not None:
            raise DivergedError(
                f"after epoch {epoch + 1} the weights are not finite ({bad}) though the loss "
                f"is {loss}; stopped{self._kept()}; look for NaN or infinite values in the "
                "data, or pass allow_nan=True (--allow-nan) to train on as Keras does"
            )

    def _kept(self) -> str:
        path = self._last_checkpoint()
        return f"; the newest checkpoint is {path}" if path else ""


def _applied_steps(model) -> int | None:
    """The steps a loss-scaled optimizer applied (its inner optimizer's count: a skipped step
    does not count), or None for any other optimizer."""
    optimizer = getattr(model, "optimizer", None)
    inner = getattr(optimizer, "inner_optimizer", None)
    if inner is None:
        return None
    return int(inner.iterations.numpy())
