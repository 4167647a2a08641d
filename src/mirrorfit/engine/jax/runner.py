"""The JAX runner: the model, optimizer and metrics of one run, their state as device arrays
donated to each call (:mod:`mirrorfit.engine.jax.step`), and Keras's variables brought up to
date from them (``sync``, as copies) when something reads them. Over several processes every
array spans all processes' devices, each putting its own pieces.
(why: docs/architecture.md#jax-runner-state)
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

from mirrorfit.engine.jax import processes
from mirrorfit.engine.jax.feed import Feed, plan
from mirrorfit.engine.jax.placement import AXIS, Placement, local_value
from mirrorfit.engine.jax.sharding import (
    build_layout,
    describe_unsplit,
    non_finite_counts,
    peak_device_bytes,
    state_bytes_per_device,
)
from mirrorfit.engine.jax.step import Metrics, State, build_steps, stacked
from mirrorfit.engine.backends import BatchShape, split_batch
from mirrorfit.data.arrays import check_class_labels, label_classes
from mirrorfit.errors import ConfigError
from mirrorfit.models.precision import Precision, as_precision
from mirrorfit.models.remat import rematerialize

EVAL_BLOCK = 32  # batches per evaluation call at most (the last call is padded, never retraced)
# ... and at most this many bytes of inputs per call (at least one batch): a block is allocated
# whole, on the host and the devices, however few examples there are to evaluate.
EVAL_BLOCK_BYTES = 64 << 20


class Runner(BatchShape):
    """Model, optimizer, metrics, state and compiled calls for one :class:`Placement`; the
    arguments are :class:`mirrorfit.engine.tensorflow.runner.Runner`'s (``jit_compile`` is what
    JAX always does: the whole step is compiled).
    """

    backend = "jax"

    def __init__(
        self,
        *,
        distribution: Placement,
        model,
        optimizer,
        loss,
        global_batch: int,
        metrics: Sequence = ("accuracy",),
        accum_steps: int = 1,
        precision: Precision | str = "fp32",
        jit_compile: bool = False,
        remat: bool = False,
        on_notice: Callable[[str], None] = print,
    ) -> None:
        import keras

        replicas = distribution.replicas
        split_batch(global_batch, replicas, accum_steps)  # ConfigError unless it divides
        self.distribution = distribution
        self.global_batch, self.accum_steps = global_batch, accum_steps
        self.precision = as_precision(precision)
        with self.precision.building():
            self._model = model if isinstance(model, keras.Model) else model()
        if not isinstance(self._model, keras.Model):
            raise ConfigError(
                f"model must be a keras.Model or a function returning one, got {self._model!r}"
            )
        if remat:
            rematerialize(self._model, on_notice)
        if not isinstance(optimizer, keras.optimizers.Optimizer):
            raise ConfigError(f"optimizer must be a keras.optimizers.Optimizer, got {optimizer!r}")
        self._optimizer = self.precision.wrap_optimizer(optimizer)
        self._optimizer.build(self._model.trainable_variables)
        self.loss_scaling = isinstance(self._optimizer, keras.optimizers.LossScaleOptimizer)
        self._train_metrics = Metrics(
            (keras.metrics.Mean(name="loss"), *(_metric(m) for m in metrics))
        )
        self._eval_metrics = Metrics(
            (keras.metrics.Mean(name="loss"), *(_metric(m) for m in metrics))
        )
        self._labels = label_classes(self._model, loss)  # what labels must index
        self.layout = build_layout(distribution.shard, self._model, self._optimizer, replicas)
        self._steps = build_steps(
            model=self._model,
            optimizer=self._optimizer,
            loss=loss,
            train_metrics=self._train_metrics,
            eval_metrics=self._eval_metrics,
            mesh=distribution.mesh,
            global_batch=global_batch,
            accum_steps=accum_steps,
            loss_scaling=self.loss_scaling,
            layout=self.layout,
        )
        self._state: State | None = None
        self._synced = True
        self._feeds: list[Feed] = []  # each fit's: their input waits add up
        self._averaged: list = []  # several processes: the statistics, reduced (replicated)
        self._load_state()

    # -- the state ---------------------------------------------------------------------------
    def _shardings(self):
        from jax.sharding import NamedSharding, PartitionSpec as P

        mesh = self.distribution.mesh
        return NamedSharding(mesh, P()), NamedSharding(mesh, P(AXIS))

    def _state_shardings(self) -> tuple[list, list]:
        """(the trainable weights' shardings, the optimizer variables'): replicated, or as
        the layout splits them."""
        replicated, _ = self._shardings()
        layout, d = self.layout, self.distribution
        if layout is None:
            return (
                [replicated] * len(self._model.trainable_variables),
                [replicated] * len(self._optimizer.variables),
            )
        return (
            [d.sharding(*s) for s in layout.trainable_specs()],
            [d.sharding(*s) for s in layout.optimizer_specs()],
        )

    def _load_state(self, trainable=None, optimizer=None) -> None:
        """The Keras variables' values as the devices' state (copies); ``trainable`` and
        ``optimizer``, device arrays already laid out, in place of theirs."""
        _, split = self._shardings()
        n = self.replicas
        put = self.distribution.put
        trainable_sharding, optimizer_sharding = self._state_shardings()
        if trainable is None:
            trainable = put(
                [np.asarray(v.value) for v in self._model.trainable_variables], trainable_sharding
            )
        if optimizer is None:
            optimizer = put(
                [np.asarray(v.value) for v in self._optimizer.variables], optimizer_sharding
            )
        self._state = State(
            trainable=list(trainable),
            non_trainable=put(
                stacked([v.value for v in self._model.non_trainable_variables], n), split
            ),
            optimizer=list(optimizer),
            metrics=put(stacked([v.value for v in self._train_metrics.variables], n), split),
        )
        self._reduce_statistics()

    def _reduce_statistics(self) -> None:
        """Several processes: the per-device statistics reduced now, at a point every worker
        reaches (a collective), for ``sync`` and evaluation to read later."""
        if self.distribution.workers > 1 and self._state.non_trainable:
            self._averaged = self.distribution.averaged(self._state.non_trainable)

    def _statistics(self) -> list:
        """The non-trainable variables' values: per-device statistics as their mean (integers:
        the first device's, they agree)."""
        if self.distribution.workers > 1:
            return self._averaged
        return self.distribution.averaged(self._state.non_trainable)

    def sync(self) -> None:
        """Write the devices' state into the Keras model and optimizer (copies): per-device
        statistics as their mean (integers: the first device's, they agree)."""
        if self._synced:
            return
        trainable, optimizer = self._state.trainable, self._state.optimizer
        if self.layout is not None and self.distribution.workers > 1:
            # split over processes: gathered whole first, a collective (every worker syncs at
            # the same points: checkpoints, the end of fit)
            trainable = self.distribution.replicated(trainable)
            optimizer = self.distribution.replicated(optimizer)
        for var, value in zip(self._model.trainable_variables, trainable):
            var.assign(np.array(value))
        for var, value in zip(self._model.non_trainable_variables, self._statistics()):
            var.assign(np.array(value))
        for var, value in zip(self._optimizer.variables, optimizer):
            var.assign(np.array(value))
        self._synced = True

    def reload(self) -> None:
        """After the Keras variables were changed from outside (a checkpoint restored into
        them): take them as the devices' state again."""
        self._load_state()
        self._synced = True

    # -- checkpoints of the arrays as the devices hold them (sharded runs: Orbax) ------------
    def checkpoint_arrays(self) -> dict[str, list]:
        """The state to checkpoint: trainable weights and optimizer variables as laid out on
        the devices, statistics as one value each."""
        s = self._state
        return {
            "trainable": list(s.trainable),
            "non_trainable": [
                a if hasattr(a, "sharding") else np.asarray(a) for a in self._statistics()
            ],
            "optimizer": list(s.optimizer),
        }

    def checkpoint_targets(self) -> dict[str, list]:
        """What :meth:`checkpoint_arrays` restores into: shapes, dtypes and this run's
        shardings (another device count than the saving run's: re-sharded)."""
        import jax

        replicated, _ = self._shardings()
        s = self._state

        def like(arrays, shardings):
            return [
                jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh)
                for a, sh in zip(arrays, shardings)
            ]

        trainable, optimizer = self._state_shardings()
        statistics = [np.asarray(v.value) for v in self._model.non_trainable_variables]
        return {
            "trainable": like(s.trainable, trainable),
            "non_trainable": like(statistics, [replicated] * len(statistics)),
            "optimizer": like(s.optimizer, optimizer),
        }

    def checkpoint_names(self) -> dict[str, list[str]]:
        """Each checkpointed array's variable path, for messages."""
        return {
            "trainable": [v.path for v in self._model.trainable_variables],
            "non_trainable": [v.path for v in self._model.non_trainable_variables],
            "optimizer": [v.path for v in self._optimizer.variables],
        }

    def adopt(self, arrays: dict[str, list]) -> None:
        """Take restored :meth:`checkpoint_arrays` (laid out as :meth:`checkpoint_targets`)
        as the state; the Keras variables follow at the next ``sync``."""
        for var, value in zip(self._model.non_trainable_variables, arrays["non_trainable"]):
            var.assign(local_value(value))
        self._load_state(trainable=arrays["trainable"], optimizer=arrays["optimizer"])
        self._synced = False

    def first_non_finite(self) -> str | None:
        """The first weight (trainable or statistic) holding a NaN or an infinity, with how
        many of its values, counted where it lives (several processes: a collective)."""
        from mirrorfit.artifacts.finite import first_non_finite

        counts = non_finite_counts(self._state.trainable)
        for var, bad in zip(self._model.trainable_variables, counts):
            if bad:
                return f"{var.path}: {bad} of {int(np.prod(var.shape))} values"
        return first_non_finite(
            [
                _Value(v.path, local_value(a))
                for v, a in zip(self._model.non_trainable_variables, self._statistics())
            ]
        )

    @property
    def model(self):
        self.sync()
        return self._model

    @property
    def optimizer(self):
        self.sync()
        return self._optimizer

    # -- what the controller reads -----------------------------------------------------------
    @property
    def jit_compile(self) -> bool:
        return True  # XLA compiles every step under JAX

    @property
    def lockstep(self) -> bool:
        return self.distribution.lockstep

    def state_bytes_per_device(self) -> int:
        """Bytes of weights, statistics and optimizer state the fullest device holds."""
        s = self._state
        return state_bytes_per_device([*s.trainable, *s.non_trainable, *s.optimizer])

    def peak_device_bytes(self) -> int | None:
        """The devices' peak memory in use so far, where the platform reports it (GPUs)."""
        return peak_device_bytes(self.distribution.mesh.local_devices)

    def describe_sharding(self) -> str:
        """One line: what of the state is split over the devices."""
        if self.layout is None:
            return describe_unsplit(self.distribution.shard, self.replicas)
        return self.layout.describe()

    def tracing_count(self) -> int:
        return len(self._steps.traces)

    def checkpoint_state(self):
        from mirrorfit.engine.jax.state import CheckpointState

        return CheckpointState(self)

    # -- input ---------------------------------------------------------------------------------
    def steps_per_epoch(self, train) -> int:
        """Optimizer steps per epoch of ``train`` (a mirrorfit source)."""
        if not hasattr(train, "steps_per_epoch"):
            raise ConfigError(
                "the JAX engine trains on mirrorfit.train_batches(...) or a "
                "--data source, not on a tf.data.Dataset"
            )
        return train.steps_per_epoch

    def train_iterator(
        self, train, *, start_epoch: int, epochs: int, skip: int, steps_per_execution: int
    ) -> Feed:
        """The blocks of every call a ``fit`` from (``start_epoch``, ``skip``) to ``epochs``
        makes, fed ahead of the steps (see :mod:`mirrorfit.engine.jax.feed`)."""
        from jax.sharding import NamedSharding, PartitionSpec as P

        check_class_labels(getattr(train, "y", None), "the training data", *self._labels)
        calls = plan(
            steps_per_epoch=self.steps_per_epoch(train),
            start_epoch=start_epoch,
            epochs=epochs,
            skip=skip,
            steps_per_execution=steps_per_execution,
        )
        sharding = NamedSharding(self.distribution.mesh, P(None, AXIS))
        d = self.distribution
        # Blocks as long as the longest call, not S: --steps-per-execution beyond an epoch's
        # steps would otherwise allocate (and copy to the devices) S batches of padding.
        block = max((n for _, _, n in calls), default=1)
        feed = Feed(
            train,
            calls,
            block_steps=block,
            batch_sharding=sharding,
            worker=d.worker_index,
            workers=d.workers,
            placement=d if d.workers > 1 else None,
        )
        self._feeds.append(feed)
        return feed

    @property
    def input_wait_s(self) -> float:
        """Seconds the training thread waited for input blocks, over every fit so far."""
        return sum(feed.wait_s for feed in self._feeds)

    # -- what runs on the devices ----------------------------------------------------------
    def run(self, feed: Feed, num_steps: int) -> None:
        """``num_steps`` optimizer steps from ``feed``, in one compiled call."""
        import jax

        xs, ys = feed.next(num_steps)
        with processes.waiting():  # several processes: a peer gone is one line, not a hang
            self._state = self._steps.train(self._state, xs, ys, np.int32(num_steps))
            self._synced = False
            self._reduce_statistics()
            # Returns when the steps are done, as TensorFlow's call does: the controller times
            # it, and the feed has the next block on the devices meanwhile.
            jax.block_until_ready(self._state.optimizer)

    def evaluate(self, data, batch: int) -> dict[str, float]:
        """Loss, metrics and the example count over every example of ``data`` once: (x, y)
        arrays batched by ``batch``, or a dataset of batches (read as NumPy)."""
        import jax
        from jax.sharding import NamedSharding, PartitionSpec as P

        d = self.distribution
        n = self.replicas
        if isinstance(data, tuple):
            check_class_labels(data[1], "the evaluation data", *self._labels)
        batch, padded = _eval_batch(data, batch, n)
        replicated, split = self._shardings()
        sharding = NamedSharding(d.mesh, P(None, AXIS))
        s = self._state
        statistics = self._statistics()
        # Several processes: already on the devices (reduced there); one: host values.
        non_trainable = statistics if d.workers > 1 else jax.device_put(statistics, replicated)
        metrics = d.put(
            stacked([np.zeros(v.shape, v.dtype) for v in self._eval_metrics.variables], n), split
        )
        examples = 0
        with processes.waiting():
            # Every process packs the same blocks and puts its own devices' part of each.
            for xs, ys, ws, count, real in _eval_blocks(data, batch, padded):
                examples += real
                metrics = self._steps.evaluate(
                    s.trainable,
                    non_trainable,
                    metrics,
                    *d.put([xs, ys, ws], sharding),
                    np.int32(count),
                )
            out = _results(self._eval_metrics, metrics, d)
        out["examples"] = examples
        return out

    def reset_train_metrics(self) -> None:
        _, split = self._shardings()
        self._state = self._state._replace(
            metrics=self.distribution.put(
                stacked(
                    [np.zeros(v.shape, v.dtype) for v in self._train_metrics.variables],
                    self.replicas,
                ),
                split,
            )
        )

    def train_logs(self) -> dict[str, float]:
        return _results(self._train_metrics, self._state.metrics, self.distribution)

    def train_loss(self) -> float:
        """The current epoch's mean training loss so far (the loss metric alone: what a check
        after every call reads; several processes: a collective)."""
        n = len(self._train_metrics.objects[0].variables)  # the loss Mean's total and count
        total, count = self.distribution.summed(self._state.metrics[:n])
        return float(total) / float(count) if float(count) else 0.0

    def _optimizer_value(self, variable) -> np.ndarray:
        index = [id(v) for v in self._optimizer.variables].index(id(variable))
        return np.asarray(self._state.optimizer[index])

    def loss_scale(self) -> float | None:
        """fp16's current dynamic loss scale; None without loss scaling."""
        if not self.loss_scaling:
            return None
        return float(self._optimizer_value(self._optimizer.dynamic_scale))

    def applied_steps(self) -> int:
        """Optimizer updates applied (steps skipped for non-finite gradients excluded)."""
        return int(self._optimizer_value(self._optimizer.iterations))

    def learning_rate(self) -> float:
        """The learning rate the next step uses (schedules evaluated at the current step)."""
        from keras.src.backend import StatelessScope

        mapping = list(zip(self._optimizer.variables, self._state.optimizer))
        with StatelessScope(state_mapping=mapping):
            return float(np.asarray(self._optimizer.learning_rate))


class _Value:
    """A variable's path and host value, as :func:`first_non_finite` reads variables."""

    def __init__(self, path: str, value: np.ndarray) -> None:
        self.path, self.value = path, value


def _results(metrics: Metrics, stacked_values, placement: Placement) -> dict[str, float]:
    """Each metric's result from the per-device variables, summed over devices (over all
    processes: a collective)."""
    for var, value in zip(metrics.variables, placement.summed(stacked_values)):
        var.assign(value)
    return {m.name: float(m.result()) for m in metrics.objects}


def _eval_batch(data, batch: int, replicas: int) -> tuple[int, int]:
    """(examples per batch, that padded to a multiple of ``replicas``): ``batch``, or all of
    ``data``'s examples where (x, y) arrays hold fewer (--eval-batch-size 1000000 on 10,000
    examples allocated a block of a million)."""
    if isinstance(data, tuple):
        batch = max(1, min(batch, len(data[0])))
    return batch, math.ceil(batch / replicas) * replicas


def _eval_blocks(data, batch: int, padded: int):
    """(xs, ys, weights, batches, examples) blocks of batches of ``padded`` examples (the real
    ones weighted 1): every example of ``data`` once. A block holds :func:`_block_length`
    batches, the same for every block of a run's evaluations (one compiled shape)."""

    def batches():
        if isinstance(data, tuple):
            x, y = data
            for start in range(0, len(x), batch):
                yield x[start : start + batch], y[start : start + batch]
        else:
            yield from data.as_numpy_iterator()

    block: list = []
    length = None
    for x, y in batches():
        block.append((np.asarray(x), np.asarray(y)))
        length = length or _block_length(block[0][0], padded)
        if len(block) == length:
            yield _pack(block, padded, length)
            block = []
    if block:
        yield _pack(block, padded, length)


def _block_length(x: np.ndarray, padded: int) -> int:
    """Batches per evaluation block: EVAL_BLOCK, fewer where that many batches of ``padded``
    examples like ``x``'s would pass EVAL_BLOCK_BYTES; at least one."""
    per_batch = padded * max(1, x[0].nbytes)  # a batch holds one example at least
    return max(1, min(EVAL_BLOCK, EVAL_BLOCK_BYTES // per_batch))


def _pack(block: list, padded: int, length: int):
    x0, y0 = block[0]
    xs = np.zeros((length, padded, *x0.shape[1:]), x0.dtype)
    ys = np.zeros((length, padded, *y0.shape[1:]), np.int32)
    ws = np.zeros((length, padded), np.float32)
    real = 0
    for i, (x, y) in enumerate(block):
        xs[i, : len(x)], ys[i, : len(y)], ws[i, : len(y)] = x, y, 1.0
        real += len(y)
    return xs, ys, ws, len(block), real


def _metric(spec):
    import keras

    if isinstance(spec, keras.metrics.Metric):
        return spec.__class__.from_config(spec.get_config())
    if spec == "accuracy":  # integer labels, as for MNIST
        return keras.metrics.SparseCategoricalAccuracy(name="accuracy")
    try:
        return keras.metrics.get(spec)
    except ValueError:
        raise ConfigError(f"unknown metric {spec!r}; pass a keras.metrics.Metric") from None


__all__ = ["Runner"]
