"""The controller: epochs, metrics, progress and callbacks around the compiled loops.

Like Orbit's controller, it knows nothing of what runs on the devices; it asks the compiled
loops to "run N steps" and tracks where it is (epoch, step). Checkpoints and preemption hook in
through ``callbacks`` and ``Trainer.position``.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import keras
import numpy as np
import tensorflow as tf

from mirrorfit.data.pipeline import ShuffledBatches, eval_dataset
from mirrorfit.engine.loop import compile_loops
from mirrorfit.engine.progress import EpochProgress
from mirrorfit.engine.step import ReplicaStep
from mirrorfit.errors import ConfigError
from mirrorfit.precision import Precision, as_precision

# A callback is a plain callable: fn(epoch, logs) after each epoch (epoch counts from 1).
Callback = Callable[[int, dict[str, float]], None]
# A hook is a plain callable: fn(trainer) after every compiled execution (checkpoints,
# preemption). It may raise to stop training; the trainer's position is then exact.
Hook = Callable[["Trainer"], None]
# Training data: mirrorfit.train_batches(...) (seeded epochs), or a tf.data.Dataset of one
# epoch of global batches.
TrainData = tf.data.Dataset | ShuffledBatches


@dataclass
class History:
    """What a ``fit`` did: per-epoch logs and steady-state throughput."""

    epochs: list[dict[str, float]] = field(default_factory=list)
    steps: int = 0
    wall_time_s: float = 0.0
    steady_examples: int = 0
    steady_time_s: float = 0.0

    @property
    def train_examples_per_sec(self) -> float:
        """Examples/s over all executions but the first (which traces and compiles)."""
        return self.steady_examples / self.steady_time_s if self.steady_time_s else 0.0


class Trainer:
    """Data-parallel training of a Keras model with a tf.distribute strategy.

    ``model`` is a zero-argument function returning a Keras model (built here under the
    strategy's scope) or a model already built under ``strategy.scope()``. ``optimizer`` is a
    configured Keras optimizer; if it was made outside the scope, a copy is made inside it from
    its config. ``loss`` is a Keras loss or a function returning per-example losses.
    ``global_batch`` is the examples per optimizer step over all replicas; with
    ``accum_steps`` K each replica runs K micro-batches of ``global_batch / (replicas * K)``
    examples per step and all-reduces once. ``precision`` (``"fp32"``, ``"bf16"``, ``"fp16"`` or a
    :class:`~mirrorfit.precision.Precision`) and ``remat`` apply to a model built here from a
    function. ``jit_compile`` compiles each replica's forward and backward pass with XLA; a model
    XLA cannot compile is reported through ``on_notice`` and trained without it.
    """

    def __init__(self, *, strategy: tf.distribute.Strategy, model, optimizer, loss,
                 global_batch: int, metrics: Sequence[str | keras.metrics.Metric] = ("accuracy",),
                 steps_per_execution: int = 1, accum_steps: int = 1,
                 precision: Precision | str = "fp32", jit_compile: bool = False,
                 remat: bool = False, on_notice: Callable[[str], None] = print) -> None:
        replicas = strategy.num_replicas_in_sync
        if global_batch % (replicas * accum_steps):
            raise ConfigError(f"global batch {global_batch} is not divisible by {replicas} "
                              f"replicas x {accum_steps} accumulation steps")
        self.strategy = strategy
        self.global_batch = global_batch
        self.steps_per_execution = steps_per_execution
        self.accum_steps = accum_steps
        self.precision = as_precision(precision)
        self._on_notice = on_notice
        with strategy.scope():
            with self.precision.building(remat=remat):
                self.model = _build_model(model, strategy, self.precision)
            self.optimizer = self.precision.wrap_optimizer(_bind_optimizer(optimizer, strategy))
            self.optimizer.build(self.model.trainable_variables)
            self._step = ReplicaStep(
                model=self.model, optimizer=self.optimizer, loss=loss,
                train_metrics=[_metric(m) for m in metrics],
                eval_metrics=[_metric(m) for m in metrics], global_batch=global_batch,
                num_replicas=replicas, accum_steps=accum_steps, jit_compile=jit_compile)
        self._loops = compile_loops(strategy, self._step.train, self._step.evaluate)
        self._xla_checked = not jit_compile
        # Where training is (what checkpoints save and restore).
        self.epoch = 0  # epochs completed
        self.step_in_epoch = 0  # steps completed in the current epoch
        self.step = 0  # optimizer steps completed in all

    @property
    def replicas(self) -> int:
        return self.strategy.num_replicas_in_sync

    @property
    def micro_batch(self) -> int:
        """Examples per replica per micro-batch (forward/backward pass)."""
        return self.global_batch // (self.replicas * self.accum_steps)

    @property
    def jit_compile(self) -> bool:
        """Whether replicas run their forward/backward pass XLA-compiled (after the check)."""
        return self._step.jit_compile

    @property
    def replica_step(self) -> ReplicaStep:
        """What each replica runs (for profiling its parts)."""
        return self._step

    def run_steps(self, iterator, num_steps: int) -> None:
        """Run ``num_steps`` compiled steps from a distributed iterator, without moving the
        trainer's position or progress (for profiling; ``fit`` is the way to train)."""
        self._loops.run_train(iterator, num_steps)

    def loss_scale(self) -> float | None:
        """fp16's current dynamic loss scale; None without loss scaling."""
        if not self._step.loss_scaling:
            return None
        return float(self.optimizer.dynamic_scale.numpy())

    def skipped_steps(self) -> int:
        """Optimizer steps skipped for non-finite gradients (fp16), over the trainer's life."""
        if not self._step.loss_scaling:
            return 0
        return self.step - int(self.optimizer.iterations.numpy())

    def learning_rate(self) -> float:
        """The learning rate the next step uses (schedules evaluated at the current step)."""
        return float(keras.ops.convert_to_numpy(self.optimizer.learning_rate))

    def fit(self, train: TrainData, *, epochs: int, steps_per_epoch: int | None = None,
            validation: tuple[np.ndarray, np.ndarray] | tf.data.Dataset | None = None,
            callbacks: Sequence[Callback] = (), hooks: Sequence[Hook] = (),
            progress: EpochProgress | None = None) -> History:
        """Train up to ``epochs`` epochs in all; return per-epoch logs and throughput.

        ``train`` is :func:`~mirrorfit.data.pipeline.train_batches` (seeded epochs) or a
        ``tf.data.Dataset`` of one epoch of global batches (repeated each epoch). Starts from the
        trainer's position (``epoch``, ``step_in_epoch``): a trainer restored from a checkpoint
        continues mid-epoch with the batches it had not seen yet.
        """
        history = History()
        if self.epoch >= epochs:  # e.g. restored from the last checkpoint of a finished run
            return history
        progress = progress or EpochProgress(enabled=False)
        steps = steps_per_epoch or _steps_per_epoch(train)
        if self.step_in_epoch > steps:  # e.g. restored from a checkpoint of other data
            raise ConfigError(f"the trainer is at step {self.step_in_epoch} of an epoch of only "
                              f"{steps} steps; was it restored from a run with other data?")
        if isinstance(train, tf.data.Dataset):
            dataset = train.repeat().skip(self.step_in_epoch)
        else:
            dataset = train.dataset(start_epoch=self.epoch, epochs=epochs, skip=self.step_in_epoch)
        # One iterator for the whole run: one per epoch costs a set-up and a teardown each time.
        if not self._xla_checked:
            self._check_xla(dataset.element_spec)
        iterator = iter(self.strategy.experimental_distribute_dataset(dataset))
        start = time.perf_counter()
        with progress:
            for epoch in range(self.epoch + 1, epochs + 1):
                logs = self._run_epoch(iterator, epoch, epochs, steps, progress, history, hooks)
                if validation is not None:
                    logs.update({f"val_{k}": v for k, v in self.evaluate(validation).items()
                                 if k != "examples"})
                self.epoch, self.step_in_epoch = epoch, 0
                history.epochs.append(logs)
                for callback in callbacks:
                    callback(epoch, logs)
        history.wall_time_s = time.perf_counter() - start
        return history

    def _check_xla(self, element_spec) -> None:
        """Compile one replica's forward/backward with XLA now; fall back, loudly, if it fails."""
        self._xla_checked = True
        problem = xla_problem(self._step, element_spec, self.micro_batch)
        if problem is None:
            return
        self._on_notice(f"XLA cannot compile this model ({problem}); training without --xla")
        with self.strategy.scope():
            step = self._step
            self._step = ReplicaStep(
                model=self.model, optimizer=self.optimizer, loss=step.loss,
                train_metrics=step.train_metrics, eval_metrics=step.eval_metrics,
                global_batch=self.global_batch, num_replicas=self.replicas,
                accum_steps=self.accum_steps, jit_compile=False)
        self._loops = compile_loops(self.strategy, self._step.train, self._step.evaluate)

    def _run_epoch(self, iterator, epoch, epochs, steps, progress, history,
                   hooks) -> dict[str, float]:
        for metric in self._train_metrics():
            metric.reset_state()
        progress.start_epoch(epoch, epochs, steps)
        done, epoch_examples, epoch_time, last_draw = self.step_in_epoch, 0, 0.0, 0.0
        while done < steps:
            n = min(self.steps_per_execution, steps - done)
            t0 = time.perf_counter()
            self._loops.run_train(iterator, n)
            elapsed = time.perf_counter() - t0
            done += n
            self.step += n
            self.step_in_epoch = done
            if history.steps:  # the very first execution traces and compiles: not steady
                history.steady_examples += n * self.global_batch
                history.steady_time_s += elapsed
                epoch_examples += n * self.global_batch
                epoch_time += elapsed
            history.steps += n
            now = time.perf_counter()
            if now - last_draw > 0.1 or done == steps:
                last_draw = now
                logs = self.train_logs()
                if epoch_time:
                    logs["examples/s"] = epoch_examples / epoch_time
                progress.update(done, logs)
            for hook in hooks:
                hook(self)
        logs = self.train_logs()
        logs["learning_rate"] = self.learning_rate()
        logs["examples_per_sec"] = epoch_examples / epoch_time if epoch_time else 0.0
        return logs

    def evaluate(self, data: tuple[np.ndarray, np.ndarray] | tf.data.Dataset,
                 batch_size: int | None = None) -> dict[str, float]:
        """Loss, metrics and the example count over every example of ``data`` exactly once.

        ``data`` is (x, y) arrays (batched here by ``batch_size``, default the global batch)
        or a dataset of global batches.
        """
        if isinstance(data, tuple):
            data = eval_dataset(*data, global_batch=batch_size or self.global_batch)
        metrics = self._eval_metrics()
        for metric in metrics:
            metric.reset_state()
        self._loops.evaluate(self.strategy.experimental_distribute_dataset(data))
        results = self._read(metrics)
        # SyncOnRead: reading in cross-replica context sums the replicas' counts.
        results["examples"] = int(self._step.eval_loss_tracker.count.value.read_value())
        return results

    def _train_metrics(self) -> list[keras.metrics.Metric]:
        return [self._step.loss_tracker, *self._step.train_metrics]

    def _eval_metrics(self) -> list[keras.metrics.Metric]:
        return [self._step.eval_loss_tracker, *self._step.eval_metrics]

    @staticmethod
    def _read(metrics) -> dict[str, float]:
        return {m.name: float(m.result()) for m in metrics}

    def train_logs(self) -> dict[str, float]:
        """Training metrics of the current epoch so far (and fp16 loss scale, skipped steps)."""
        logs = self._read(self._train_metrics())
        if self._step.loss_scaling:
            logs["loss_scale"] = self.loss_scale()
            logs["skipped_steps"] = float(self.skipped_steps())
        return logs

    def tracing_count(self) -> int:
        """How often the multi-step train function was traced (1 once running)."""
        return self._loops.tracing_count()


def xla_problem(step: ReplicaStep, element_spec, micro_batch: int) -> str | None:
    """None if XLA compiles ``step``'s forward/backward for this input, else the first line of
    XLA's complaint. Compiles to HLO only: nothing runs, no state changes."""
    x_spec, y_spec = element_spec
    x = tf.zeros([micro_batch, *x_spec.shape[1:]], x_spec.dtype)
    y = tf.zeros([micro_batch, *y_spec.shape[1:]], y_spec.dtype)
    try:
        step.gradients.experimental_get_compiler_ir(x, y)(stage="hlo")
    except (tf.errors.OpError, ValueError, TypeError) as e:
        text = str(getattr(e, "message", e))
        ops = sorted(set(re.findall(r"(\w+) \(No registered '\w+' OpKernel for XLA", text)))
        if ops:
            return f"unsupported operation(s): {', '.join(ops)}"
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        return lines[0][:300] if lines else type(e).__name__
    return None


def _build_model(model, strategy: tf.distribute.Strategy, precision: Precision) -> keras.Model:
    if isinstance(model, keras.Model):
        if model.dtype_policy.name != precision.policy:
            raise ConfigError(f"the model was built with dtype policy "
                              f"{model.dtype_policy.name!r} but precision {precision.name!r} "
                              f"needs {precision.policy!r}; pass a function that builds it")
        variables = model.variables
        if variables and not strategy.extended.variable_created_in_scope(variables[0].value):
            raise ConfigError("the model's variables were not created under this strategy; "
                              "pass a function that builds the model, or build it inside "
                              "strategy.scope()")
        return model
    if callable(model):
        return model()
    raise ConfigError(f"model must be a keras.Model or a function returning one, got {model!r}")


def _bind_optimizer(optimizer, strategy: tf.distribute.Strategy):
    # Keras's TF optimizer captures the strategy current at construction: one made outside
    # the scope would not all-reduce. Rebuild it inside from its config (keeps schedules).
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise ConfigError(f"optimizer must be a keras.optimizers.Optimizer, got {optimizer!r}")
    if getattr(optimizer, "_distribution_strategy", None) is strategy:
        return optimizer
    if optimizer.built:
        raise ConfigError("the optimizer was already used with another strategy; pass a fresh "
                          "one (or its config)")
    return optimizer.__class__.from_config(optimizer.get_config())


def _metric(spec: str | keras.metrics.Metric) -> keras.metrics.Metric:
    if isinstance(spec, keras.metrics.Metric):
        return spec.__class__.from_config(spec.get_config())  # fresh state, made in scope
    if spec == "accuracy":  # integer labels, as for MNIST
        return keras.metrics.SparseCategoricalAccuracy(name="accuracy")
    try:
        return keras.metrics.get(spec)
    except ValueError:
        raise ConfigError(f"unknown metric {spec!r}; pass a keras.metrics.Metric") from None


def _steps_per_epoch(train) -> int:
    if not isinstance(train, tf.data.Dataset):
        return train.steps_per_epoch
    n = int(train.cardinality())
    if n < 0:
        raise ConfigError("the training dataset has unknown or infinite length; pass "
                          "steps_per_epoch")
    return n


__all__ = ["Trainer", "History", "Callback", "Hook", "xla_problem"]
