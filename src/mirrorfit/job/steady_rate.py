"""Steady training examples/s of a run through ``mirrorfit.fit`` (``mirrorfit train`` with a
compiled ``--model``), as the built-in loop reports it: from the end of the first compiled
call (its compile left out) to the end of training, validation and evaluation left out."""

from __future__ import annotations

import time


def steady_rate(examples_per_epoch: int, global_batch: int):
    """A Keras callback; its ``rate()`` is the steady examples/s (None: no steady call, or a
    dataset of unknown length, ``examples_per_epoch`` 0)."""
    import keras

    class SteadyRate(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.start = self.end = None  # (seconds, examples done) after the first call
            self.epochs_done, self.paused, self.pending = 0, 0.0, 0.0
            self.began, self.tested = time.perf_counter(), 0.0

        def on_train_batch_end(self, batch, logs=None):
            # ``batch``: the call's last step; a partial last batch counts what it holds
            done = min((batch + 1) * global_batch, examples_per_epoch)
            now = (time.perf_counter(), self.epochs_done * examples_per_epoch + done)
            if self.start is not None:  # a validation between two calls is not training
                self.paused += self.pending
            self.start, self.end, self.pending = self.start or now, now, 0.0

        def on_test_begin(self, logs=None):
            self.test_began = time.perf_counter()

        def on_test_end(self, logs=None):
            self.pending += time.perf_counter() - self.test_began
            self.tested += time.perf_counter() - self.test_began

        def on_epoch_end(self, epoch, logs=None):
            self.epochs_done += 1

        def rate(self) -> float | None:
            if not examples_per_epoch or self.start is None or self.end == self.start:
                return None
            seconds = self.end[0] - self.start[0] - self.paused
            return (self.end[1] - self.start[1]) / seconds if seconds > 0 else None

        def phases(self) -> dict[str, float]:
            """Seconds of the fit as the built-in loop's ``timings_s`` split them: the first
            call (its compile), the steady calls after it, the validation passes."""
            if self.start is None:
                return {"validation": round(self.tested, 3)}
            return {
                "first_execution": round(self.start[0] - self.began, 3),
                "steady_steps": round(self.end[0] - self.start[0] - self.paused, 3),
                "validation": round(self.tested, 3),
            }

    return SteadyRate()


__all__ = ["steady_rate"]
