"""Build the tf.distribute strategy by name, as one frozen
:class:`~mirrorfit.engine.tensorflow.distribution.Distribution`: single, mirrored,
central-storage (one process), multi-worker, parameter-server (several processes). Batch
sizes are computed from the Distribution, after it exists.
"""

from __future__ import annotations

import contextlib
from typing import Callable

import tensorflow as tf

from mirrorfit.distribute._deadline import deadline
from mirrorfit.distribute._listen import listening
from mirrorfit.distribute.cluster import DEFAULT_COLLECTIVE_TIMEOUT_S, cluster_for
from mirrorfit.engine.tensorflow.devices import DeviceSetup
from mirrorfit.engine.backends import WORKER_SHARE, check_settings
from mirrorfit.engine.tensorflow.distribution import Distribution
from mirrorfit.engine.tensorflow.parameter_server import build_parameter_server
from mirrorfit.errors import ClusterError, ConfigError

# -- the strategies by name ----------------------------------------------------------------


def _cross_device_ops(name: str, setup: DeviceSetup):
    if name == "auto":
        if setup.kind == "GPU":
            return None  # TF's choice: NCCL collectives on physical GPUs
        # TF's default on CPUs, a RING collective, is slower than reduce-to-one
        # (docs/benchmarks.md#figures-behind-the-code).
        return tf.distribute.ReductionToOneDevice()
    if name == "nccl":
        if setup.kind != "GPU":
            raise ConfigError(
                "--cross-device-ops nccl needs GPUs; on CPU use auto, hierarchical or reduce-to-one"
            )
        return tf.distribute.NcclAllReduce()
    if name == "hierarchical":
        return tf.distribute.HierarchicalCopyAllReduce()
    return tf.distribute.ReductionToOneDevice()


def _single(setup: DeviceSetup, cross_device_ops: str) -> tf.distribute.Strategy:
    if setup.replicas != 1:
        raise ConfigError(
            f"--strategy single runs on one device but {setup.replicas} replicas "
            "were asked for; use --replicas 1 or --strategy mirrored"
        )
    return tf.distribute.OneDeviceStrategy(setup.devices[0])


def _mirrored(setup: DeviceSetup, cross_device_ops: str) -> tf.distribute.Strategy:
    return tf.distribute.MirroredStrategy(
        list(setup.devices), cross_device_ops=_cross_device_ops(cross_device_ops, setup)
    )


def _central_storage(setup: DeviceSetup, cross_device_ops: str) -> tf.distribute.Strategy:
    # Variables live on the CPU (or the one GPU); compute is mirrored on the devices.
    return tf.distribute.experimental.CentralStorageStrategy(compute_devices=list(setup.devices))


_LOCAL: dict[str, Callable[[DeviceSetup, str], tf.distribute.Strategy]] = {
    "single": _single,
    "mirrored": _mirrored,
    "central-storage": _central_storage,
}
CLUSTER_KINDS = ("multi-worker", "parameter-server")


def build_strategy(
    setup: DeviceSetup, *, kind: str = "auto", cross_device_ops: str = "auto"
) -> tf.distribute.Strategy:
    """The one-process strategy for ``setup``: auto is single on one device, mirrored on
    several. (:func:`build_distribution` also knows clusters.)"""
    if kind == "auto":
        kind = "single" if setup.replicas == 1 else "mirrored"
    if kind not in _LOCAL:
        raise ConfigError(
            f"unknown strategy {kind!r}; choose one of: auto, {', '.join(_LOCAL)}"
            f", {', '.join(CLUSTER_KINDS)}"
        )
    return _LOCAL[kind](setup, cross_device_ops)


def build_distribution(
    setup: DeviceSetup,
    *,
    kind: str = "auto",
    cross_device_ops: str = "auto",
    cluster=None,
    communication: str = "auto",
    collective_timeout_s: float = DEFAULT_COLLECTIVE_TIMEOUT_S,
    shard: str = "none",
) -> Distribution:
    """The strategy for ``setup`` (this process's devices) and, for ``multi-worker`` and
    ``parameter-server``, ``cluster`` (a :class:`~mirrorfit.distribute.cluster.Cluster`).
    ``collective_timeout_s`` (seconds) bounds the wait for the other workers at start-up and in
    every collective; ``shard`` must be ``"none"`` (the state is whole on every device).
    """
    check_settings("tensorflow", shard=shard)
    if kind not in CLUSTER_KINDS:
        strategy = build_strategy(setup, kind=kind, cross_device_ops=cross_device_ops)
        name = kind if kind != "auto" else ("single" if setup.replicas == 1 else "mirrored")
        return Distribution(
            strategy=strategy, kind=name, replicas=setup.replicas, local_replicas=setup.replicas
        )
    if cluster is None:  # from TF_CONFIG / SLURM; one line if there is none
        cluster = cluster_for(kind)
    if kind == "parameter-server":
        return build_parameter_server(setup, cluster, timeout_s=collective_timeout_s)
    return _multi_worker(setup, cluster, communication, collective_timeout_s)


def _multi_worker(
    setup: DeviceSetup, cluster, communication: str, timeout_s: float
) -> Distribution:
    if cluster.ps or cluster.task_type not in ("worker", "chief"):
        raise ConfigError(
            f"--strategy multi-worker: this cluster has parameter servers (task "
            f"{cluster.task_name()}); use --strategy parameter-server, or a "
            "cluster of workers only"
        )
    if setup.kind == "CPU" and setup.replicas > 1:
        raise ConfigError(
            f"--strategy multi-worker runs one replica per worker on CPUs, but "
            f"--replicas {setup.replicas} was asked for; drop --replicas, or "
            "start more workers (mirrorfit launch --workers N)"
        )
    implementation = {
        "auto": tf.distribute.experimental.CommunicationImplementation.AUTO,
        "ring": tf.distribute.experimental.CommunicationImplementation.RING,
        "nccl": tf.distribute.experimental.CommunicationImplementation.NCCL,
    }
    if communication == "nccl" and setup.kind != "GPU":
        raise ConfigError("--communication nccl needs GPUs; on CPU use ring or auto")
    resolver = cluster.tf_resolver()
    if setup.kind == "GPU":
        resolver.num_accelerators = lambda *a, **k: {"GPU": setup.replicas}
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=implementation[communication], timeout_seconds=timeout_s
    )
    from tensorflow.python.distribute import collective_all_reduce_strategy as cars

    # The strategy's start-up barrier has a deadline setting (TF's default: none)...
    cars.CollectiveAllReduceExtended._check_health_initial_timeout = int(max(1, timeout_s))
    # ...but before it, TF's coordination service waits for every task to register for ever,
    # holding the GIL: a watchdog process names who is missing and ends it
    # (why: docs/architecture.md#a-worker-that-never-joins).
    with deadline(
        timeout_s,
        f"did not join within {timeout_s:g} s; check that every task "
        "started (its log), or raise --collective-timeout",
        cluster.peers(),
    ):
        try:
            with _buffers_sent_whole(), listening(cluster):
                strategy = tf.distribute.MultiWorkerMirroredStrategy(
                    cluster_resolver=resolver, communication_options=options
                )
        except (RuntimeError, tf.errors.OpError) as e:  # the barrier timed out
            first = (str(getattr(e, "message", e)).strip().splitlines() or [""])[0][:160]
            raise ClusterError(
                f"{', '.join(cluster.unreachable()) or 'a worker'} did not join "
                f"within {timeout_s:g} s ({type(e).__name__}: {first}); check that "
                "every task started (its log), or raise --collective-timeout"
            ) from None
    local = strategy.extended._num_devices_per_worker  # noqa: SLF001 (no public accessor)
    return Distribution(
        strategy=strategy,
        kind="multi-worker",
        replicas=strategy.num_replicas_in_sync,
        local_replicas=local,
        workers=cluster.num_workers,
        worker_index=cluster.worker_rank,
        is_chief=cluster.is_chief,
        input_split=WORKER_SHARE,
        task=cluster.task_name(),
        cluster=cluster,
    )


@contextlib.contextmanager
def _buffers_sent_whole():
    """While the strategy starts this process's collective server, set ``recv_buf_max_chunk=-1``
    so that it sends each all-reduce buffer whole (the config is restored after; transport only:
    values and order unchanged). (why: docs/architecture.md#tensorflow-all-reduce-buffers)
    """
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
