"""Where this process stands in a tf.distribute strategy: one frozen :class:`Distribution`.

Input splits (``input_split``): ``"global-batch"`` (one process: each global batch cut per
replica), ``"worker-share"`` (MultiWorkerMirroredStrategy: worker w of W keeps examples
``[w*B/W, (w+1)*B/W)`` of every global batch, cut again per local replica) and
``"coordinator"`` (parameter servers: each worker reads its own dataset).
(why: docs/architecture.md#tensorflow-input-splits)
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Callable, Sequence

import numpy as np
import tensorflow as tf

from mirrorfit.engine.backends import COORDINATOR, GLOBAL_BATCH, WORKER_SHARE

# Strategies whose replicas take a batch cut in the step (Distribution.split)
_HOST_FED = (
    tf.distribute.OneDeviceStrategy,
    tf.distribute.MirroredStrategy,
    tf.distribute.MultiWorkerMirroredStrategy,
)


@dataclass(frozen=True)
class Distribution:
    """Where training runs (build with :func:`build_distribution`): ``replicas`` in sync over all
    workers, ``local_replicas`` of this process; ``is_chief`` alone writes the outputs
    (checkpoint metadata, exports, metrics, TensorBoard, the console summary).
    """

    strategy: tf.distribute.Strategy
    kind: str  # single | mirrored | central-storage | multi-worker | parameter-server
    replicas: int
    local_replicas: int
    workers: int = 1
    worker_index: int = 0
    is_chief: bool = True
    input_split: str = GLOBAL_BATCH
    task: str = "local"  # "worker 1", "chief": how logs and errors name this process
    coordinator: object | None = None  # tf.distribute.coordinator.ClusterCoordinator
    cluster: object | None = None  # mirrorfit.distribute.cluster.Cluster
    backend = "tensorflow"  # which engine runs it (mirrorfit.engine.controller picks by it)

    def distribute(self, make: Callable[[int, int], tf.data.Dataset], *, per_replica: int):
        """A distributed dataset from ``make(worker, workers)`` (this worker's share of every global
        batch; ``make(0, 1)``: the global batches); ``per_replica`` (examples) cuts a share across
        the local replicas, never an example twice. Replicas on host CPUs get the plain dataset, cut
        in the step by :meth:`split` (why: docs/architecture.md#tensorflow-input-splits).
        """
        if self.feeds_from_host:
            dataset = make(self.worker_index, self.workers)
            if all(isinstance(s, tf.TensorSpec) for s in tf.nest.flatten(dataset.element_spec)):
                return dataset
            # sparse or ragged components: TF's distributed dataset knows how to cut them
        if self.input_split == GLOBAL_BATCH:
            return self.strategy.experimental_distribute_dataset(make(0, 1))
        local = self.local_replicas

        def per_worker(context: tf.distribute.InputContext) -> tf.data.Dataset:
            ds = make(context.input_pipeline_id, context.num_input_pipelines)
            return ds.rebatch(per_replica) if local > 1 else ds

        return self.strategy.distribute_datasets_from_function(per_worker)

    @cached_property
    def feeds_from_host(self) -> bool:
        """Whether :meth:`distribute` hands over the plain dataset and :meth:`split` cuts its
        batches: every local replica is a CPU of this host, under a mirrored strategy, with
        several replicas only on one process (replica ids are global across workers)."""
        if self.input_split == COORDINATOR or not isinstance(self.strategy, _HOST_FED):
            return False
        if self.local_replicas > 1 and self.workers > 1:
            return False
        devices = self.strategy.extended.worker_devices
        return all(tf.DeviceSpec.from_string(d).device_type == "CPU" for d in devices)

    def split(self, batch):
        """In the compiled step: a batch from :meth:`distribute`'s dataset as ``strategy.run``
        takes it. Fed from the host to several replicas, replica r of R gets the contiguous rows
        ``[r*n//R, (r+1)*n//R)`` (with full batches the pieces TF's distributed dataset would
        give); else the batch as it is."""
        if (
            not self.feeds_from_host
            or self.local_replicas == 1
            or any(isinstance(t, tf.distribute.DistributedValues) for t in tf.nest.flatten(batch))
        ):
            return batch  # already one value per replica (a distributed iterator's)
        replicas = self.local_replicas

        def piece(context: tf.distribute.experimental.ValueContext):
            r = context.replica_id_in_sync_group

            def rows(t: tf.Tensor) -> tf.Tensor:
                n = tf.shape(t, out_type=tf.int64)[0]
                return t[r * n // replicas : (r + 1) * n // replicas]

            return tf.nest.map_structure(rows, batch)

        return self.strategy.experimental_distribute_values_from_function(piece)

    def agree(self, flag: bool) -> bool:
        """True on every worker if ``flag`` is True on any (a preemption signal that reached
        one worker stops all of them at the same step). One scalar all-reduce; free on one
        process."""
        if self.workers == 1 or self.input_split != WORKER_SHARE:
            return flag
        return float(self._sum(tf.constant([1.0 if flag else 0.0], tf.float64))[0]) > 0

    def all_equal(self, value: int) -> bool:
        """Whether every worker holds the same ``value`` (e.g. the restored step): two scalar
        all-reduces, zero variance. Always True on one process."""
        if self.workers == 1 or self.input_split != WORKER_SHARE:
            return True
        v = float(value)
        total, squares = self._sum(tf.constant([v, v * v], tf.float64)).numpy()
        n = self.replicas  # every replica of a worker contributes its worker's value
        return squares / n - (total / n) ** 2 < 0.1

    def gather(self, values: Sequence[int]) -> np.ndarray:
        """Every worker's ``values`` (small non-negative ints, below 2**24, the same count on
        each), one row per worker in worker order: one all-reduce of a vector, each worker
        filling its own row; one process (or parameter servers): its own row."""
        mine = np.asarray(values, np.float64)
        if self.workers == 1 or self.input_split != WORKER_SHARE:
            return mine[None].astype(np.int64)
        # Every replica adds its worker's row, with a 1 in front: the first column then counts
        # each worker's replicas, which divide its row back to its values.
        table = np.zeros((self.workers, len(mine) + 1), np.float64)
        table[self.worker_index] = [1.0, *mine]
        total = self._sum(tf.constant(table.ravel())).numpy().reshape(table.shape)
        return np.rint(total[:, 1:] / np.maximum(total[:, :1], 1)).astype(np.int64)

    def from_chief(self, values: Sequence[np.ndarray]) -> list[np.ndarray]:
        """``values`` (host arrays) as the chief holds them, on every worker: one all-reduce
        of them in float64, the chief's replicas adding their share, the others zeros."""
        values = [np.asarray(v) for v in values]
        if self.workers == 1 or not values:
            return values
        flat = np.concatenate([v.astype(np.float64).ravel() for v in values])
        share = flat / self.local_replicas if self.is_chief else np.zeros_like(flat)
        total = self._sum(tf.constant(share)).numpy()
        out, at = [], 0
        for v in values:
            out.append(total[at : at + v.size].reshape(v.shape).astype(v.dtype))
            at += v.size
        return out

    @cached_property
    def _sum(self) -> Callable[[tf.Tensor], tf.Tensor]:
        """Sum of a small float64 vector over every replica, compiled once (run eagerly, a
        collective costs a warning and more time)."""

        @tf.function
        def total(value):
            per_replica = self.strategy.run(lambda: tf.identity(value))
            return self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

        return total

    @property
    def strategy_name(self) -> str:
        """The tf.distribute strategy's class name, for the summary."""
        return type(self.strategy).__name__

    def describe(self) -> str:
        """One line for the start of a run."""
        if self.workers == 1 and self.coordinator is None:
            return f"{type(self.strategy).__name__}"
        return (
            f"{type(self.strategy).__name__}, {self.task} of {self.workers} worker(s), "
            f"{self.replicas} replica(s) in sync" + (" (chief)" if self.is_chief else "")
        )
