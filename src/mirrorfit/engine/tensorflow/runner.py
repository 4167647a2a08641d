"""The runner: the model, the optimizer, the per-replica step and the compiled loops (with the
XLA check and its fallback), built under the strategy, as Orbit's runner. The controller
(:mod:`mirrorfit.engine.controller`) decides when to call it; the loops come from ``loop.py``
or, under parameter servers, ``parameter_server.py``, behind the same calls.
"""

from __future__ import annotations

import math
import re
import threading
from typing import Callable, Sequence

import keras
import tensorflow as tf

from mirrorfit.data.arrays import check_class_labels, label_classes
from mirrorfit.data.pipeline import eval_dataset, worker_slice
from mirrorfit.engine.backends import COORDINATOR, WORKER_SHARE
from mirrorfit.engine.tensorflow.distribution import Distribution
from mirrorfit.engine.tensorflow.loop import compile_loops
from mirrorfit.engine.tensorflow.step import ReplicaStep
from mirrorfit.engine.backends import BatchShape, split_batch
from mirrorfit.errors import ConfigError
from mirrorfit.models.precision import Precision, as_precision
from mirrorfit.models.remat import rematerialize


def as_distribution(strategy: tf.distribute.Strategy | Distribution) -> Distribution:
    """A :class:`Distribution` for a plain one-process strategy (the Python API takes both)."""
    if isinstance(strategy, Distribution):
        return strategy
    n = strategy.num_replicas_in_sync
    return Distribution(
        strategy=strategy, kind=type(strategy).__name__, replicas=n, local_replicas=n
    )


class TrainInput:
    """A fit's TensorFlow iterator (distributed, or the parameter servers' per-worker one),
    released by :meth:`close`."""

    def __init__(self, tf_iterator, *, lockstep: bool) -> None:
        self.tf_iterator, self.lockstep = tf_iterator, lockstep

    def close(self) -> None:
        held, self.tf_iterator = [self.tf_iterator], None
        if self.lockstep:
            # Deleted here, at the same point on every worker: left to the garbage collector,
            # a multi-worker run stalled after its last epoch
            # (docs/benchmarks.md#figures-behind-the-code).
            held.clear()
        else:
            # Deleted on a thread of its own: that can take seconds, and nothing waits for it.
            threading.Thread(target=held.clear, daemon=True).start()


REPLICATED = "replicated (the TensorFlow engine keeps the whole state on every device)"


def whole_state_bytes(model, optimizer) -> int:
    """Bytes of weights, statistics and optimizer state a device holds: all of them (the
    state is whole on every replica)."""
    return sum(
        math.prod(v.shape) * tf.as_dtype(v.dtype).size
        for v in [*model.variables, *optimizer.variables]
    )


def gpu_peak_bytes() -> int | None:
    """The GPUs' largest peak memory in use so far; None on CPUs."""
    peaks = []
    for device in tf.config.list_logical_devices("GPU"):  # "/device:GPU:0"
        try:
            peaks.append(
                tf.config.experimental.get_memory_info(device.name.split("device:")[-1])["peak"]
            )
        except (ValueError, tf.errors.OpError):  # a GPU that keeps no statistics
            pass
    return max(peaks) if peaks else None


class Runner(BatchShape):
    """Model, optimizer, step and compiled loops for one :class:`Distribution`. ``model``: a
    zero-argument function returning a Keras model, or one built under ``strategy.scope()``;
    ``optimizer``: a Keras optimizer (copied into the scope if made outside it);
    ``global_batch``: examples per optimizer step over all replicas and micro-batches.
    """

    backend = "tensorflow"

    def __init__(
        self,
        *,
        distribution: Distribution | tf.distribute.Strategy,
        model,
        optimizer,
        loss,
        global_batch: int,
        metrics: Sequence[str | keras.metrics.Metric] = ("accuracy",),
        accum_steps: int = 1,
        precision: Precision | str = "fp32",
        jit_compile: bool = False,
        remat: bool = False,
        on_notice: Callable[[str], None] = print,
    ) -> None:
        distribution = as_distribution(distribution)
        replicas = distribution.replicas
        split_batch(global_batch, replicas, accum_steps)  # ConfigError unless it divides
        self.distribution = distribution
        self.strategy = strategy = distribution.strategy
        self.global_batch, self.accum_steps = global_batch, accum_steps
        self.precision = as_precision(precision)
        self._on_notice = on_notice
        with strategy.scope():
            with self.precision.building():
                self.model = _build_model(model, strategy, self.precision)
            if remat:
                rematerialize(self.model, on_notice)
            self.optimizer = self.precision.wrap_optimizer(_bind_optimizer(optimizer, strategy))
            self.optimizer.build(self.model.trainable_variables)
            self.step = ReplicaStep(
                model=self.model,
                optimizer=self.optimizer,
                loss=loss,
                train_metrics=[_metric(m) for m in metrics],
                eval_metrics=[_metric(m) for m in metrics],
                global_batch=global_batch,
                num_replicas=replicas,
                accum_steps=accum_steps,
                jit_compile=jit_compile,
                metrics_outside=isinstance(
                    strategy, tf.distribute.experimental.CentralStorageStrategy
                ),
            )
        self._labels = label_classes(self.model, loss)  # what labels must index
        self._loops = self._compile()
        self._xla_checked = not jit_compile

    def _compile(self):
        if self.distribution.input_split == COORDINATOR:
            from mirrorfit.engine.tensorflow.parameter_server import coordinated_loops

            return coordinated_loops(
                self.strategy, self.distribution.coordinator, self.step.train, self.step.evaluate
            )
        outside = self.step.metrics_outside
        return compile_loops(
            self.strategy,
            self.step.train,
            self.step.evaluate,
            split=self.distribution.split,
            after_train=self.step.update_train_metrics if outside else None,
            after_eval=self.step.update_eval_metrics if outside else None,
        )

    @property
    def jit_compile(self) -> bool:
        return self.step.jit_compile

    @property
    def lockstep(self) -> bool:
        """Several workers in sync: metric reads and checks are collectives, so every worker
        makes them at the same points."""
        return self.distribution.input_split == WORKER_SHARE

    @property
    def loss_scaling(self) -> bool:
        return self.step.loss_scaling

    def sync(self) -> None:
        """Nothing to do: the Keras variables are the state under TensorFlow."""

    def checkpoint_state(self):
        from mirrorfit.engine.tensorflow.state import CheckpointState

        return CheckpointState(self)

    # -- input -------------------------------------------------------------------------------
    def steps_per_epoch(self, train) -> int:
        """Optimizer steps per epoch of ``train`` (a mirrorfit source, or a tf.data.Dataset
        of one epoch of global batches)."""
        if not isinstance(train, tf.data.Dataset):
            return train.steps_per_epoch
        n = int(train.cardinality())
        if n < 0:
            raise ConfigError(
                "the training dataset has unknown or infinite length; pass steps_per_epoch"
            )
        return n

    def train_iterator(
        self, train, *, start_epoch: int, epochs: int, skip: int, steps_per_execution: int = 1
    ):
        """The iterator a ``fit`` from (``start_epoch``, ``skip``) to ``epochs`` reads: the
        distributed iterator over this worker's share of each global batch (see
        :meth:`Distribution.distribute`), or under parameter servers the workers' own
        streams. One iterator for the whole run: one per epoch costs a set-up and a teardown
        each time. Checks XLA first, on the input's spec."""
        check_class_labels(getattr(train, "y", None), "the training data", *self._labels)
        if self.distribution.input_split == COORDINATOR:
            dataset_fn = _sampled(train)
            if not self._xla_checked:
                self._check_xla(dataset_fn(tf.distribute.InputContext()).element_spec)
            return TrainInput(self._loops.per_worker_dataset(dataset_fn), lockstep=self.lockstep)
        if isinstance(train, tf.data.Dataset):

            def make(worker, workers):
                return _share(train.repeat().skip(skip), worker, workers)
        else:

            def make(worker, workers):
                return train.dataset(
                    start_epoch=start_epoch,
                    epochs=epochs,
                    skip=skip,
                    worker=worker,
                    workers=workers,
                )

        if not self._xla_checked:
            self._check_xla(make(0, 1).element_spec)
        return TrainInput(
            iter(self.distribution.distribute(make, per_replica=self.per_replica_batch)),
            lockstep=self.lockstep,
        )

    # -- what runs on the devices ------------------------------------------------------------
    def run(self, iterator: "TrainInput", num_steps: int) -> None:
        """``num_steps`` optimizer steps from ``iterator``, in one compiled call."""
        self._loops.run_train(iterator.tf_iterator, num_steps)

    def evaluate(self, data, batch: int) -> dict[str, float]:
        """Loss, metrics and the example count over every example of ``data`` once, over all
        workers: (x, y) arrays batched by ``batch`` (global), or a dataset of global
        batches."""
        if isinstance(data, tuple):
            x, y = data
            check_class_labels(y, "the evaluation data", *self._labels)

            def make(worker, workers):
                return eval_dataset(x, y, global_batch=batch, worker=worker, workers=workers)
        else:

            def make(worker, workers):
                return _share(data, worker, workers)

        metrics = [self.step.eval_loss_tracker, *self.step.eval_metrics]
        for metric in metrics:
            metric.reset_state()
        if self.distribution.input_split == COORDINATOR:
            self._loops.evaluate(make(0, 1))
        else:
            per_replica = math.ceil(batch / self.replicas)
            self._loops.evaluate(self.distribution.distribute(make, per_replica=per_replica))
        results = _read(metrics)
        # SyncOnRead: reading in cross-replica context sums the replicas' (and workers') counts.
        results["examples"] = int(self.step.eval_loss_tracker.count.value.read_value())
        return results

    def reset_train_metrics(self) -> None:
        for metric in self._train_metrics():
            metric.reset_state()

    def train_logs(self) -> dict[str, float]:
        return _read(self._train_metrics())

    def train_loss(self) -> float:
        """The current epoch's mean training loss so far (the loss metric alone)."""
        return float(self.step.loss_tracker.result())

    def _train_metrics(self) -> list[keras.metrics.Metric]:
        return [self.step.loss_tracker, *self.step.train_metrics]

    def loss_scale(self) -> float | None:
        """fp16's current dynamic loss scale; None without loss scaling."""
        if not self.step.loss_scaling:
            return None
        return float(self.optimizer.dynamic_scale.numpy())

    def applied_steps(self) -> int:
        """Optimizer updates applied (steps skipped for non-finite gradients excluded)."""
        return int(self.optimizer.iterations.numpy())

    def learning_rate(self) -> float:
        """The learning rate the next step uses (schedules evaluated at the current step)."""
        return float(keras.ops.convert_to_numpy(self.optimizer.learning_rate))

    def tracing_count(self) -> int:
        return self._loops.tracing_count()

    def state_bytes_per_device(self) -> int:
        return whole_state_bytes(self.model, self.optimizer)

    def peak_device_bytes(self) -> int | None:
        return gpu_peak_bytes()

    def describe_sharding(self) -> str:
        return REPLICATED

    def _check_xla(self, element_spec) -> None:
        """Compile one replica's forward/backward with XLA now; fall back, loudly, if it fails."""
        self._xla_checked = True
        problem = xla_problem(self.step, element_spec, self.micro_batch)
        if problem is None:
            return
        self._on_notice(f"XLA cannot compile this model ({problem}); training without --xla")
        with self.strategy.scope():
            step = self.step
            self.step = ReplicaStep(
                model=self.model,
                optimizer=self.optimizer,
                loss=step.loss,
                train_metrics=step.train_metrics,
                eval_metrics=step.eval_metrics,
                global_batch=self.global_batch,
                num_replicas=self.replicas,
                accum_steps=self.accum_steps,
                jit_compile=False,
            )
        self._loops = self._compile()


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


def _sampled(train) -> Callable[[tf.distribute.InputContext], tf.data.Dataset]:
    """Under parameter servers each worker samples its own stream (no exact epochs: steps are
    asynchronous): a dataset of global batches is repeated as it is; arrays are reshuffled
    each pass with the run's seed and the worker's index."""
    if isinstance(train, tf.data.Dataset):
        return lambda context: train.repeat()
    return train.sampled


def _share(ds: tf.data.Dataset, worker: int, workers: int) -> tf.data.Dataset:
    """This worker's share of each batch of a dataset of global batches."""
    if workers == 1:
        return ds
    return ds.map(lambda *batch: tuple(worker_slice(t, worker, workers) for t in batch))


def _read(metrics) -> dict[str, float]:
    return {m.name: float(m.result()) for m in metrics}


def _build_model(model, strategy: tf.distribute.Strategy, precision: Precision) -> keras.Model:
    if isinstance(model, keras.Model):
        if model.dtype_policy.name != precision.policy:
            raise ConfigError(
                f"the model was built with dtype policy "
                f"{model.dtype_policy.name!r} but precision {precision.name!r} "
                f"needs {precision.policy!r}; pass a function that builds it"
            )
        variables = model.variables
        if variables and not strategy.extended.variable_created_in_scope(variables[0].value):
            raise ConfigError(
                "the model's variables were not created under this strategy; "
                "pass a function that builds the model, or build it inside "
                "strategy.scope()"
            )
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
        raise ConfigError(
            "the optimizer was already used with another strategy; pass a fresh one (or its config)"
        )
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


__all__ = ["Runner", "as_distribution", "xla_problem"]
