"""Build the tf.distribute strategy, and say where this process stands in it.

A strategy is a value chosen by name. :func:`build_distribution` returns one frozen
:class:`Distribution`: the strategy, replicas in sync, workers, this task, whether it is the
chief, and how input is split. Batch sizes are computed from it, after it exists.

Input splits:

- ``"global-batch"`` (one process): the pipeline makes global batches, cut into one contiguous
  piece per replica (by the strategy's distributed dataset, or on host CPUs in the step).
- ``"worker-share"`` (several processes, MultiWorkerMirroredStrategy): every worker builds the
  same global batches and keeps its own contiguous share (worker w of W: examples
  ``[w*B/W, (w+1)*B/W)``), cut again per local replica. Replica r of N sees the same examples as
  on one process with N replicas, so the order never depends on the number of workers.
- ``"coordinator"`` (parameter servers): the chief schedules steps on workers that each read
  their own dataset (:mod:`mirrorfit.engine.coordinated`).
"""

from __future__ import annotations

import contextlib
import socket
from dataclasses import dataclass
from functools import cached_property
from typing import Callable

import tensorflow as tf

from mirrorfit.distribute._deadline import deadline
from mirrorfit.distribute.cluster import DEFAULT_COLLECTIVE_TIMEOUT_S, cluster_for
from mirrorfit.distribute.devices import DeviceSetup
from mirrorfit.errors import ClusterError, ConfigError

GLOBAL_BATCH, WORKER_SHARE, COORDINATOR = "global-batch", "worker-share", "coordinator"
# Strategies whose replicas take a batch cut in the step (Distribution.split)
_HOST_FED = (tf.distribute.OneDeviceStrategy, tf.distribute.MirroredStrategy,
             tf.distribute.MultiWorkerMirroredStrategy)


@dataclass(frozen=True)
class Distribution:
    """Where training runs: build with :func:`build_distribution`.

    ``replicas`` counts every replica in sync over all workers; ``local_replicas`` those of this
    process. ``is_chief`` decides who writes outputs (checkpoint metadata, exports, metrics,
    TensorBoard, the console summary): one place, here.
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

    def distribute(self, make: Callable[[int, int], tf.data.Dataset], *, per_replica: int):
        """A distributed dataset from ``make(worker, workers)``, which returns this worker's
        share of every global batch (``make(0, 1)``: the global batches themselves).
        ``per_replica`` (examples) cuts a worker's share across its local replicas; a share
        that is smaller (an evaluation's last batch) gives fewer or smaller pieces, never an
        example twice.

        Replicas on this host's CPUs get the plain dataset, and :meth:`split` cuts each batch
        inside the compiled step: the batches are already where those replicas compute, and
        TF's distributed iterator would copy them there through a MultiDeviceIterator, which
        cost 40-65% of the CNN's and MLP's throughput on 2 logical CPU replicas and ~30% on
        one at one thread (measured side by side). Devices keep it: there it overlaps a real
        copy with the step."""
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
        if not self.feeds_from_host or self.local_replicas == 1 or any(
                isinstance(t, tf.distribute.DistributedValues) for t in tf.nest.flatten(batch)):
            return batch  # already one value per replica (a distributed iterator's)
        replicas = self.local_replicas

        def piece(context: tf.distribute.experimental.ValueContext):
            r = context.replica_id_in_sync_group

            def rows(t: tf.Tensor) -> tf.Tensor:
                n = tf.shape(t, out_type=tf.int64)[0]
                return t[r * n // replicas:(r + 1) * n // replicas]
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

    @cached_property
    def _sum(self) -> Callable[[tf.Tensor], tf.Tensor]:
        """Sum of a small float64 vector over every replica, compiled once (run eagerly, a
        collective costs a warning and more time)."""
        @tf.function
        def total(value):
            per_replica = self.strategy.run(lambda: tf.identity(value))
            return self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
        return total

    def describe(self) -> str:
        """One line for the start of a run."""
        if self.workers == 1 and self.coordinator is None:
            return f"{type(self.strategy).__name__}"
        return (f"{type(self.strategy).__name__}, {self.task} of {self.workers} worker(s), "
                f"{self.replicas} replica(s) in sync"
                + (" (chief)" if self.is_chief else ""))


# -- the strategies by name ----------------------------------------------------------------

def _cross_device_ops(name: str, setup: DeviceSetup):
    if name == "auto":
        if setup.kind == "GPU":
            return None  # TF's choice: NCCL collectives on physical GPUs
        # TF's default on CPUs is a RING collective: measured 1.7x slower than reduce-to-one
        # for the MLP on 2 logical CPU replicas (benchmarks/textbook_vs_mirrorfit.py).
        return tf.distribute.ReductionToOneDevice()
    if name == "nccl":
        if setup.kind != "GPU":
            raise ConfigError("--cross-device-ops nccl needs GPUs; on CPU use auto, "
                              "hierarchical or reduce-to-one")
        return tf.distribute.NcclAllReduce()
    if name == "hierarchical":
        return tf.distribute.HierarchicalCopyAllReduce()
    return tf.distribute.ReductionToOneDevice()


def _single(setup: DeviceSetup, cross_device_ops: str) -> tf.distribute.Strategy:
    if setup.replicas != 1:
        raise ConfigError(f"--strategy single runs on one device but {setup.replicas} replicas "
                          "were asked for; use --replicas 1 or --strategy mirrored")
    return tf.distribute.OneDeviceStrategy(setup.devices[0])


def _mirrored(setup: DeviceSetup, cross_device_ops: str) -> tf.distribute.Strategy:
    return tf.distribute.MirroredStrategy(
        list(setup.devices), cross_device_ops=_cross_device_ops(cross_device_ops, setup))


def _central_storage(setup: DeviceSetup, cross_device_ops: str) -> tf.distribute.Strategy:
    # Variables live on the CPU (or the one GPU); compute is mirrored on the devices.
    return tf.distribute.experimental.CentralStorageStrategy(compute_devices=list(setup.devices))


_LOCAL: dict[str, Callable[[DeviceSetup, str], tf.distribute.Strategy]] = {
    "single": _single,
    "mirrored": _mirrored,
    "central-storage": _central_storage,
}
CLUSTER_KINDS = ("multi-worker", "parameter-server")


def build_strategy(setup: DeviceSetup, *, kind: str = "auto",
                   cross_device_ops: str = "auto") -> tf.distribute.Strategy:
    """The one-process strategy for ``setup``: auto is single on one device, mirrored on
    several. (:func:`build_distribution` also knows clusters.)"""
    if kind == "auto":
        kind = "single" if setup.replicas == 1 else "mirrored"
    if kind not in _LOCAL:
        raise ConfigError(f"unknown strategy {kind!r}; choose one of: auto, {', '.join(_LOCAL)}"
                          f", {', '.join(CLUSTER_KINDS)}")
    return _LOCAL[kind](setup, cross_device_ops)


def build_distribution(setup: DeviceSetup, *, kind: str = "auto", cross_device_ops: str = "auto",
                       cluster=None, communication: str = "auto",
                       collective_timeout_s: float = DEFAULT_COLLECTIVE_TIMEOUT_S) -> Distribution:
    """The strategy for ``setup`` (this process's devices) and, for ``multi-worker`` and
    ``parameter-server``, ``cluster`` (a :class:`~mirrorfit.distribute.cluster.Cluster`).

    ``collective_timeout_s`` (seconds) bounds the wait for the other workers at start-up and for
    every collective after: a worker that never comes up, or stops answering, is named in one
    line instead of a hang.
    """
    if kind not in CLUSTER_KINDS:
        strategy = build_strategy(setup, kind=kind, cross_device_ops=cross_device_ops)
        name = kind if kind != "auto" else ("single" if setup.replicas == 1 else "mirrored")
        return Distribution(strategy=strategy, kind=name, replicas=setup.replicas,
                            local_replicas=setup.replicas)
    if cluster is None:  # from TF_CONFIG / SLURM; one line if there is none
        cluster = cluster_for(kind)
    if kind == "parameter-server":
        from mirrorfit.engine.coordinated import build_parameter_server
        return build_parameter_server(setup, cluster, timeout_s=collective_timeout_s)
    return _multi_worker(setup, cluster, communication, collective_timeout_s)


def _multi_worker(setup: DeviceSetup, cluster, communication: str,
                  timeout_s: float) -> Distribution:
    if cluster.ps or cluster.task_type not in ("worker", "chief"):
        raise ConfigError(f"--strategy multi-worker: this cluster has parameter servers (task "
                          f"{cluster.task_name()}); use --strategy parameter-server, or a "
                          "cluster of workers only")
    if setup.kind == "CPU" and setup.replicas > 1:
        raise ConfigError(f"--strategy multi-worker runs one replica per worker on CPUs, but "
                          f"--replicas {setup.replicas} was asked for; drop --replicas, or "
                          "start more workers (mirrorfit launch --workers N)")
    implementation = {"auto": tf.distribute.experimental.CommunicationImplementation.AUTO,
                      "ring": tf.distribute.experimental.CommunicationImplementation.RING,
                      "nccl": tf.distribute.experimental.CommunicationImplementation.NCCL}
    if communication == "nccl" and setup.kind != "GPU":
        raise ConfigError("--communication nccl needs GPUs; on CPU use ring or auto")
    resolver = cluster.tf_resolver()
    if setup.kind == "GPU":
        resolver.num_accelerators = lambda *a, **k: {"GPU": setup.replicas}
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=implementation[communication], timeout_seconds=timeout_s)
    from tensorflow.python.distribute import collective_all_reduce_strategy as cars
    # The strategy's start-up barrier has a deadline setting (TF's default: none)...
    cars.CollectiveAllReduceExtended._check_health_initial_timeout = int(max(1, timeout_s))
    # ...but before it, TF's coordination service waits for every task to register, in C++,
    # for ever, whatever its register timeout says (measured on TF 2.21). Nothing can interrupt
    # that wait (it holds the GIL), so a watchdog process names who is missing and ends it.
    with deadline(timeout_s, f"did not join within {timeout_s:g} s; check that every task "
                  "started (its log), or raise --collective-timeout", peers(cluster)):
        try:
            with _buffers_sent_whole(), listening(cluster):
                strategy = tf.distribute.MultiWorkerMirroredStrategy(
                    cluster_resolver=resolver, communication_options=options)
        except (RuntimeError, tf.errors.OpError) as e:  # the barrier timed out
            first = (str(getattr(e, "message", e)).strip().splitlines() or [""])[0][:160]
            raise ClusterError(f"{_missing(cluster) or 'a worker'} did not join within "
                               f"{timeout_s:g} s ({type(e).__name__}: {first}); check that "
                               "every task started (its log), or raise --collective-timeout"
                               ) from None
    local = strategy.extended._num_devices_per_worker  # noqa: SLF001 (no public accessor)
    return Distribution(strategy=strategy, kind="multi-worker",
                        replicas=strategy.num_replicas_in_sync, local_replicas=local,
                        workers=cluster.num_workers, worker_index=cluster.worker_rank,
                        is_chief=cluster.is_chief, input_split=WORKER_SHARE,
                        task=cluster.task_name(), cluster=cluster)


@contextlib.contextmanager
def _buffers_sent_whole():
    """While the strategy starts this process's collective server: have that server send each
    all-reduce buffer as one piece.

    TF's gRPC ``RecvBuf`` cuts every buffer it sends into 4 KiB protobuf strings unless the
    server's ``recv_buf_max_chunk`` says otherwise; -1 sends it whole, as TF's DTensor
    multi-client set-up asks of its own server. MultiWorkerMirroredStrategy copies its server's
    config from the eager context when it starts the server, and has no option for this field,
    so the context carries it for that moment only (restored after: later servers in this
    process, e.g. a Python caller's, are not affected). Measured here (2 workers, one core
    each, the CNN's 2.5 MB of gradients, TF's profiler): the all-reduce took 4.8-5.0 ms per step
    against 5.9-7.0 ms. Transport only: the values and their order are unchanged."""
    from tensorflow.core.protobuf import config_pb2
    from tensorflow.python.eager import context

    ctx = context.context()
    before = ctx._config  # noqa: SLF001 (no public setter for this field)
    config = config_pb2.ConfigProto()
    if before is not None:
        config.CopyFrom(before)
    config.experimental.recv_buf_max_chunk = -1
    ctx._config = config  # noqa: SLF001
    try:
        yield
    finally:
        ctx._config = before  # noqa: SLF001


@contextlib.contextmanager
def listening(cluster):
    """While the block starts this task's TensorFlow server: it listens on the task's own
    address from the cluster spec (TF alone listens on every interface), and a port another
    process holds is one line at once (TF waited, then blamed a peer). Where it must listen on
    every interface, one line says so."""
    import sys

    from mirrorfit.distribute import _listen

    ip, note = _listen.prepare(cluster)
    port = int(cluster.address(cluster.task_type, cluster.task_index).rpartition(":")[2])
    with _listen.own_address(ip, port) as rewritten:
        yield
    if not rewritten:
        why = note or "this platform's TensorFlow libraries cannot be redirected"
        print(f"mirrorfit: {cluster.task_name()}: TensorFlow's server listens on every interface "
              f"({why}); keep the job on a private network", file=sys.stderr)


def unreachable(cluster, *, timeout_s: float = 2.0) -> list[str]:
    """The other tasks whose port does not accept a connection now (to name, after a
    collective failed, the one that stopped answering)."""
    gone = []
    for name, address in peers(cluster):
        host, _, port = address.rpartition(":")
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
        except OSError:
            gone.append(f"{name} ({address})")
    return gone


def _missing(cluster) -> str:
    return ", ".join(unreachable(cluster))


def peers(cluster) -> list[tuple[str, str]]:
    """(name, "host:port") of every other task of ``cluster``."""
    me = cluster.address(cluster.task_type, cluster.task_index)
    out = []
    for job, addresses in (("chief", [cluster.chief] if cluster.chief else []),
                           ("worker", cluster.workers), ("ps", cluster.ps)):
        for i, address in enumerate(addresses):
            if address != me:
                out.append((f"{job} {i}" if job != "chief" else "chief", address))
    return out
