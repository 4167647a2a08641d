"""The controller: epochs, metrics, progress, callbacks and resuming around a runner, shared by
every backend. It asks a runner (:class:`mirrorfit.engine.tensorflow.runner.Runner` or
:class:`mirrorfit.engine.jax.runner.Runner`, by the distribution's ``backend``) to "run N steps"
and tracks where training is in one :class:`Position`, which checkpoints save and restore;
checkpoints and preemption hook in through ``hooks`` and ``callbacks``.
(why: docs/architecture.md#the-seams)
"""

from __future__ import annotations

import importlib
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from mirrorfit.artifacts.position import Position
from mirrorfit.engine.backends import ENGINES
from mirrorfit.engine.progress import EpochProgress
from mirrorfit.data.pipeline import check_lengths
from mirrorfit.errors import ConfigError, FitError
from mirrorfit.models.precision import Precision

# A callback is a plain callable: fn(epoch, logs) after each epoch (epoch counts from 1).
Callback = Callable[[int, dict[str, float]], None]
# A hook is a plain callable: fn(trainer) after every compiled execution (checkpoints,
# preemption). It may raise to stop training; the trainer's position is then exact.
Hook = Callable[["Trainer"], None]
# Training data: mirrorfit.train_batches(...) (seeded epochs), a --data source's training
# batches, or (TensorFlow) a tf.data.Dataset of one epoch of global batches.
TrainData = Any


@dataclass
class History:
    """What a ``fit`` did: per-epoch logs and steady-state throughput."""

    epochs: list[dict[str, float]] = field(default_factory=list)
    steps: int = 0
    wall_time_s: float = 0.0
    steady_examples: int = 0
    steady_time_s: float = 0.0
    examples: int = 0  # every execution's, the first one's too
    time_s: float = 0.0
    first_execution_s: float = 0.0  # seconds: tracing, compiling and the first S steps
    validation_s: float = 0.0  # seconds in the epochs' validation

    @property
    def train_examples_per_sec(self) -> float:
        """Examples/s over all executions but the first (which traces and compiles); over all
        of them when there was only one (a resume with few steps left): what the run did,
        never 0 for a run that trained."""
        if self.steady_time_s:
            return self.steady_examples / self.steady_time_s
        return self.examples / self.time_s if self.time_s else 0.0


class Trainer:
    """Data-parallel training of a Keras model on TensorFlow or JAX (docs/training.md#python-api).
    ``strategy``: the engine's ``build_distribution`` (or a one-process TF strategy); ``model``: a
    zero-argument function (built here, with ``precision``, ``remat``) or a model built under
    ``strategy.scope()``; ``loss``: Keras's or per-example; ``global_batch``: examples per step, all
    replicas, ``accum_steps`` micro-batches each; ``jit_compile``: TF's XLA per replica (a model it
    cannot compile: a line to ``on_notice``; JAX compiles the whole step).
    """

    def __init__(
        self,
        *,
        strategy,
        model,
        optimizer,
        loss,
        global_batch: int,
        metrics: Sequence = ("accuracy",),
        steps_per_execution: int = 1,
        accum_steps: int = 1,
        precision: Precision | str = "fp32",
        jit_compile: bool = False,
        remat: bool = False,
        on_notice: Callable[[str], None] = print,
    ) -> None:
        backend = getattr(strategy, "backend", "tensorflow")  # a plain tf.distribute.Strategy
        runner = importlib.import_module(ENGINES[backend]).Runner
        self.runner = runner(
            distribution=strategy,
            model=model,
            optimizer=optimizer,
            loss=loss,
            global_batch=global_batch,
            metrics=metrics,
            accum_steps=accum_steps,
            precision=precision,
            jit_compile=jit_compile,
            remat=remat,
            on_notice=on_notice,
        )
        self.distribution = self.runner.distribution
        self.steps_per_execution = steps_per_execution
        self.position = Position()  # what checkpoints save and restore

    # -- the runner's parts, for callers that need them -------------------------------------
    backend = property(lambda self: self.runner.backend)
    strategy = property(lambda self: getattr(self.distribution, "strategy", None))
    model = property(lambda self: self.runner.model)  # up to date (the JAX state is synced)
    optimizer = property(lambda self: self.runner.optimizer)
    precision = property(lambda self: self.runner.precision)
    global_batch = property(lambda self: self.runner.global_batch)
    accum_steps = property(lambda self: self.runner.accum_steps)
    replicas = property(lambda self: self.runner.replicas)
    micro_batch = property(lambda self: self.runner.micro_batch)
    jit_compile = property(lambda self: self.runner.jit_compile)
    replica_step = property(lambda self: getattr(self.runner, "step", None))  # TensorFlow's
    epoch = property(lambda self: self.position.epoch)
    step_in_epoch = property(lambda self: self.position.step_in_epoch)
    step = property(lambda self: self.position.step)

    def run_steps(self, iterator, num_steps: int) -> None:
        """Run ``num_steps`` compiled steps from ``iterator`` (the runner's train input, as
        ``runner.train_iterator`` gives it), without moving the
        trainer's position or progress (for profiling; ``fit`` is the way to train)."""
        self.runner.run(iterator, num_steps)

    def loss_scale(self) -> float | None:
        """fp16's current dynamic loss scale; None without loss scaling."""
        return self.runner.loss_scale()

    def skipped_steps(self) -> int:
        """Optimizer steps skipped for non-finite gradients (fp16), over the trainer's life."""
        if not self.runner.loss_scaling:
            return 0
        return self.step - self.runner.applied_steps()

    def learning_rate(self) -> float:
        """The learning rate the next step uses (schedules evaluated at the current step)."""
        return self.runner.learning_rate()

    def resume(
        self,
        checkpointer,
        *,
        steps_per_epoch: int,
        fresh: bool = False,
        say: Callable[[str], None] = print,
    ):
        """Restore the newest checkpoint of ``checkpointer`` (a
        :class:`~mirrorfit.artifacts.checkpoint.Checkpointer` of this trainer), or with
        ``fresh`` set the existing ones aside and start over; ``say`` gets one line saying
        from where (``steps_per_epoch``: of the training data). Every worker calls it (its
        barrier and check are collectives). Returns the checkpoint's ``Restored``, or None."""
        return resume(checkpointer, self.distribution, steps_per_epoch, fresh=fresh, say=say)

    def fit(
        self,
        train: TrainData,
        *,
        epochs: int,
        steps_per_epoch: int | None = None,
        validation: Any = None,
        callbacks: Sequence[Callback] = (),
        hooks: Sequence[Hook] = (),
        progress: EpochProgress | None = None,
    ) -> History:
        """Train up to ``epochs`` epochs in all; return per-epoch logs and throughput. ``train``:
        :func:`~mirrorfit.data.pipeline.train_batches` or a ``tf.data.Dataset`` of one epoch of
        global batches. From ``position``: mid-epoch, the batches not seen yet; at an epoch's last
        step saved before that epoch's end (validation, callbacks) completed, that end first.
        """
        history = History()
        self._check_data(train, validation)
        if self.epoch >= epochs:  # e.g. restored from the last checkpoint of a finished run
            return history
        progress = progress or EpochProgress(enabled=False)
        steps = steps_per_epoch or self.runner.steps_per_epoch(train)
        if self.step_in_epoch > steps:  # e.g. restored from a checkpoint of other data
            raise ConfigError(
                f"the trainer is at step {self.step_in_epoch} of an epoch of only "
                f"{steps} steps; was it restored from a run with other data?"
            )
        if steps and self.step_in_epoch == steps and self.position.ended:
            # Restored from a format < 4 checkpoint at an epoch's last step: as before, that
            # epoch counts as reported (it cannot tell). Otherwise a position at an epoch's last
            # step means a hook or callback stopped the run before the epoch's end: the loop
            # below runs that end (validation, callbacks), and no step.
            self.position = self.position.epoch_done(self.epoch + 1)
            if self.epoch >= epochs:
                return history
        first, skip = self.epoch, self.step_in_epoch
        if steps and self.epoch + 1 == epochs and skip == steps:
            iterator = None  # only the last epoch's end is left: no input to set up
        else:
            iterator = self.runner.train_iterator(
                train,
                start_epoch=first,
                epochs=epochs,
                skip=skip,
                steps_per_execution=self.steps_per_execution,
            )
        start = time.perf_counter()
        with progress:
            for epoch in range(self.epoch + 1, epochs + 1):
                logs = self._run_epoch(iterator, epoch, epochs, steps, progress, history, hooks)
                if validation is not None:
                    t0 = time.perf_counter()
                    logs.update(
                        {
                            f"val_{k}": v
                            for k, v in self.evaluate(validation).items()
                            if k != "examples"
                        }
                    )
                    history.validation_s += time.perf_counter() - t0
                self.position = self.position.epoch_done(epoch)
                history.epochs.append(logs)
                for callback in callbacks:
                    callback(epoch, logs)
        history.wall_time_s = time.perf_counter() - start
        if iterator is not None:
            iterator.close()  # at the same point on every worker
        return history

    def _check_data(self, train, validation) -> None:
        """FitError (a ValueError) for data that would train or validate something else than
        asked: batches of another size than the trainer's global batch (the loss is scaled by
        it), or validation arrays of unequal lengths."""
        batch = getattr(train, "global_batch", None)
        if batch is None and hasattr(train, "element_spec"):  # a tf.data.Dataset
            batch = _static_batch(train.element_spec)
        if batch is not None and batch != self.global_batch:
            raise FitError(
                f"the training data has batches of {batch} examples, the trainer a "
                f"global batch of {self.global_batch}; its loss is scaled by the "
                "global batch, so give both the same size"
            )
        if isinstance(validation, tuple):
            x, y = validation
            check_lengths(x, y, "the validation data")

    def _run_epoch(
        self, iterator, epoch, epochs, steps, progress, history, hooks
    ) -> dict[str, float]:
        self.runner.reset_train_metrics()
        progress.start_epoch(epoch, epochs, steps)
        resumed_at_end = bool(steps) and self.step_in_epoch == steps
        epoch_examples, epoch_time, last_draw = 0, 0.0, 0.0
        all_examples, all_time = 0, 0.0  # the run's first execution's too
        while self.step_in_epoch < steps:
            n = min(self.steps_per_execution, steps - self.step_in_epoch)
            t0 = time.perf_counter()
            self.runner.run(iterator, n)
            elapsed = time.perf_counter() - t0
            self.position = self.position.advanced(n)
            if not history.steps:
                history.first_execution_s = elapsed
            if history.steps:  # the very first execution traces and compiles: not steady
                history.steady_examples += n * self.global_batch
                history.steady_time_s += elapsed
                epoch_examples += n * self.global_batch
                epoch_time += elapsed
            history.steps += n
            all_examples += n * self.global_batch
            all_time += elapsed
            history.examples += n * self.global_batch
            history.time_s += elapsed
            now = time.perf_counter()
            # Reading metrics is a collective across workers: with several, every execution
            # (the same points on every worker), else at most every 0.1 s for a bar drawn, and
            # at the epoch's end (each read costs the JAX engine a few small computations).
            if (
                self.runner.lockstep
                or self.step_in_epoch == steps
                or (progress.shown and now - last_draw > 0.1)
            ):
                last_draw = now
                logs = self.train_logs()
                # Steady executions' rate; the compiling one's where the epoch had no other
                # (a resume with few steps left): what the run did, not 0.
                rate = (epoch_examples, epoch_time) if epoch_time else (all_examples, all_time)
                if self.step_in_epoch == steps:  # before the hooks: a checkpoint saves them
                    self.position = self.position.at_epoch_end(self._end_logs(logs, *rate))
                if epoch_time:
                    logs["examples/s"] = epoch_examples / epoch_time
                progress.update(self.step_in_epoch, logs)
            for hook in hooks:
                hook(self)
        if self.position.epoch_logs is not None:  # the last step's, or a checkpoint's
            logs = dict(self.position.epoch_logs)
        else:  # no step: an empty epoch, or a resume from a checkpoint without them
            logs = self._end_logs(
                self.train_logs(),
                *((epoch_examples, epoch_time) if epoch_time else (all_examples, all_time)),
            )
            if resumed_at_end:  # not the zeros of no step: NaN, never a measured value
                logs.update({k: math.nan for k in self.runner.train_logs()})
        if resumed_at_end:
            progress.update(steps, logs)
        return logs

    def _end_logs(
        self, logs: Mapping[str, float], examples: int, seconds: float
    ) -> dict[str, float]:
        """An epoch's logs: its training metrics, the learning rate and examples/s."""
        return {
            **logs,
            "learning_rate": self.learning_rate(),
            "examples_per_sec": examples / seconds if seconds else 0.0,
        }

    def evaluate(self, data, batch_size: int | None = None) -> dict[str, float]:
        """Loss, metrics and the example count over every example of ``data`` exactly once
        (over all workers).

        ``data`` is (x, y) arrays (batched here by ``batch_size``, default the global batch)
        or a dataset of global batches.
        """
        if isinstance(data, tuple):
            x, y = data
            check_lengths(x, y, "evaluate")
        return self.runner.evaluate(data, batch_size or self.global_batch)

    def train_logs(self) -> dict[str, float]:
        """Training metrics of the current epoch so far (and fp16 loss scale, skipped steps)."""
        logs = self.runner.train_logs()
        if self.runner.loss_scaling:
            logs["loss_scale"] = self.loss_scale()
            logs["skipped_steps"] = float(self.skipped_steps())
        return logs

    def train_loss(self) -> float:
        """The current epoch's mean training loss so far: the loss alone, cheaper than
        :meth:`train_logs` (several workers: a collective, read at the same points)."""
        return self.runner.train_loss()

    def tracing_count(self) -> int:
        """How often the multi-step train function was traced (1 once running)."""
        return self.runner.tracing_count()


def _static_batch(spec) -> int | None:
    """The batch size a dataset's element spec fixes (its first tensor's first dimension), or
    None where it is not static (a partial last batch may follow)."""
    first = spec[0] if isinstance(spec, tuple) else spec
    shape = getattr(first, "shape", None)
    return shape[0] if shape is not None and shape.rank else None


def resume(
    checkpointer,
    distribution,
    steps_per_epoch: int,
    *,
    fresh: bool = False,
    say: Callable[[str], None] = print,
):
    """:meth:`Trainer.resume`'s work: clean what a killed save left, set checkpoints aside
    with ``fresh``, restore the newest one on every worker (each must restore the same step),
    and say from where."""
    checkpointer.clean_partial()  # the chief's; the other workers only read
    if fresh:
        aside = checkpointer.discard()
        if aside:
            say(f"--fresh: moved the existing checkpoints to {aside}")
    distribution.agree(False)  # a barrier: nobody reads before the chief has cleaned up
    restored = checkpointer.restore_latest()
    step = restored.step if restored else 0
    if not distribution.all_equal(step):
        raise ConfigError(
            f"{distribution.task} restored step {step}, another worker a "
            "different one; give every worker the same --checkpoint-dir, on "
            "storage they all see"
        )
    if not restored:
        return None
    steps = steps_per_epoch
    done, at = restored.epoch, restored.step_in_epoch
    if at == steps and not restored.ended:
        # Saved at an epoch's last step before that epoch's end: fit runs that end
        # (validation, callbacks) first, and prints that epoch's line.
        say(
            f"resuming from {restored.path}: {done} epoch(s) done, epoch {done + 1}'s {at} "
            f"steps trained, running its end (validation, callbacks) first (global step "
            f"{restored.step})"
        )
        return restored
    if at == steps:  # a format < 4 checkpoint: that epoch counts as done, as ever
        done, at = done + 1, 0
    say(
        f"resuming from {restored.path}: {done} epoch(s) done, continuing epoch {done + 1} at "
        f"step {at} (global step {restored.step})"
    )
    return restored


__all__ = ["Trainer", "History", "Position", "Callback", "Hook", "resume"]
