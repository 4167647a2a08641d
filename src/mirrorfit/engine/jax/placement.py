"""Where a JAX run computes: a 1-D mesh of devices (axis ``"data"``), the batch split along it
and the state replicated, as one frozen :class:`Placement` (the counterpart of TensorFlow's
:class:`~mirrorfit.engine.tensorflow.distribution.Distribution`). With ``--strategy
multi-worker`` the mesh spans every process's devices, process by process; reads of
per-device values are collectives every worker runs at the same point (``lockstep``).
TensorFlow-only strategies and flags are refused in one line.
(why: docs/multi-worker-jax.md#how-a-job-is-laid-out)
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Sequence

import numpy as np

from mirrorfit.engine.backends import GLOBAL_BATCH, WORKER_SHARE, check_settings
from mirrorfit.engine.jax import processes
from mirrorfit.engine.jax.devices import DeviceSetup
from mirrorfit.errors import ConfigError

AXIS = "data"  # the mesh axis the batch is split along
MODEL_AXIS = "model"  # the second axis of a 2-D mesh (model_parallel > 1): weights split on it


@dataclass(frozen=True)
class Placement:
    """A JAX run's devices and this process's place among them. ``replicas``: devices in the
    mesh (over all processes); ``local_replicas``: this process's. ``is_chief`` decides who
    writes outputs."""

    mesh: object  # jax.sharding.Mesh
    kind: str
    replicas: int
    local_replicas: int
    workers: int = 1
    worker_index: int = 0
    is_chief: bool = True
    task: str = "local"
    cluster: object | None = None
    shard: str = "none"  # what of the state is split over the mesh (engine.jax.sharding)
    model_parallel: int = 1  # devices a weight is split over (a 2-D mesh: data x model)
    backend = "jax"  # which engine runs it (mirrorfit.engine.controller picks the runner by it)

    @cached_property
    def grid(self):
        """The 2-D mesh (``data`` x ``model``) of ``model_parallel``: the same devices, each
        run of ``model_parallel`` neighbours one group that splits the weights."""
        from jax.sharding import Mesh

        devices = np.array(list(self.mesh.devices.flat))
        shape = (self.replicas // self.model_parallel, self.model_parallel)
        return Mesh(devices.reshape(shape), (AXIS, MODEL_AXIS))

    @property
    def data_parallel(self) -> int:
        """The groups a batch is split over (``replicas / model_parallel``)."""
        return self.replicas // self.model_parallel

    @property
    def lockstep(self) -> bool:
        """Several processes: metric reads and checks are collectives, run by every worker at
        the same points."""
        return self.workers > 1

    @property
    def input_split(self) -> str:
        """What each process reads (mirrorfit.job.data): its share of every global batch."""
        return WORKER_SHARE if self.workers > 1 else GLOBAL_BATCH

    def agree(self, flag: bool) -> bool:
        """True on every process if ``flag`` is True on any; one process: ``flag``."""
        if self.workers == 1:
            return flag
        return self._max_min(1 if flag else 0)[0] > 0

    def all_equal(self, value: int) -> bool:
        """Whether every process holds the same ``value``; one process: True."""
        if self.workers == 1:
            return True
        high, low = self._max_min(int(value))
        return high == low

    def gather(self, values: Sequence[int]) -> np.ndarray:
        """Every process's ``values`` (small non-negative ints, the same count on each), one
        row per worker in worker order: a collective; one process: its own row."""
        local = np.asarray(values, np.int32)[None]
        if self.workers == 1:
            return local
        # Each row says whose it is: a worker's devices may be more or fewer than another's.
        own = np.concatenate([[self.worker_index], local[0]]).astype(np.int32)
        block = np.repeat(own[None], self.local_replicas, axis=0)
        with processes.waiting():
            rows = np.asarray(
                self._replicated(self.from_local(block, (self.replicas, block.shape[1])))
            )
        first = {int(r[0]): r[1:] for r in rows[::-1]}
        return np.stack([first[w] for w in sorted(first)])

    @cached_property
    def _replicated(self):
        import jax

        return jax.jit(lambda v: v, out_shardings=self.sharding())

    def _max_min(self, value: int) -> tuple[int, int]:
        """(max, min) of ``value`` over the processes: one small all-reduce."""
        local = np.full((self.local_replicas,), value, np.int32)
        with processes.waiting():
            out = np.asarray(self._reduce_int(self.from_local(local, (self.replicas,))))
        return int(out[0]), int(out[1])

    @cached_property
    def _reduce_int(self):
        import jax
        import jax.numpy as jnp

        return jax.jit(lambda v: jnp.stack([jnp.max(v), jnp.min(v)]), out_shardings=self.sharding())

    # -- arrays over the mesh ------------------------------------------------------------------
    def sharding(self, *spec):
        """The NamedSharding of ``spec`` over the mesh (none: replicated)."""
        from jax.sharding import NamedSharding, PartitionSpec as P

        return NamedSharding(self.mesh, P(*spec))

    def put(self, values: Sequence, sharding) -> list:
        """Host (or, in one process, device) arrays, the same on every process, as arrays of
        ``sharding`` (one, or one per value): each process puts its own devices' pieces
        (``jax.device_put`` checks across processes that the values agree, a hidden
        collective every time)."""
        import jax

        shardings = sharding if isinstance(sharding, (list, tuple)) else [sharding] * len(values)
        if self.workers == 1:  # copies: a device array given stays its holder's
            return jax.device_put(list(values), list(shardings), may_alias=False)
        return [_from_host(np.asarray(v), s) for v, s in zip(values, shardings)]

    def replicated(self, values: Sequence) -> list:
        """Arrays of any sharding as arrays whole on every device (several processes: a
        collective every worker runs)."""
        with processes.waiting():
            return self._replicated(list(values))

    def from_local(self, local: np.ndarray, global_shape: tuple[int, ...], sharding=None):
        """An array of ``global_shape`` split along the mesh axis (axis 0 of ``global_shape``,
        or as ``sharding`` says) from this process's piece ``local``."""
        import jax

        sharding = sharding or self.sharding(AXIS)
        if self.workers == 1:
            return jax.device_put(local, sharding)
        return jax.make_array_from_process_local_data(sharding, local, global_shape)

    def summed(self, stacked: Sequence) -> list[np.ndarray]:
        """Per-device values (stacked along a first axis of the mesh's size) summed over the
        devices, on the host (several processes: a collective)."""
        if self.workers == 1:
            return [np.asarray(a).sum(axis=0).astype(np.asarray(a).dtype) for a in stacked]
        with processes.waiting():
            return [np.asarray(a) for a in self._sum(list(stacked))]

    @cached_property
    def _sum(self):
        import jax
        import jax.numpy as jnp

        def total(xs):
            # One reduction of one buffer per dtype: across processes each array of a list
            # would be an all-reduce of its own (~4 ms each for workers bound to a core).
            out = [None] * len(xs)
            by_dtype: dict = {}
            for i, x in enumerate(xs):
                by_dtype.setdefault(jnp.dtype(x.dtype), []).append(i)
            for indices in by_dtype.values():
                flat = jnp.concatenate(
                    [xs[i].reshape(xs[i].shape[0], -1) for i in indices], axis=1
                ).sum(axis=0)
                at = 0
                for i in indices:
                    size = xs[i][0].size
                    out[i] = flat[at : at + size].reshape(xs[i].shape[1:]).astype(xs[i].dtype)
                    at += size
            return out

        return jax.jit(total, out_shardings=self.sharding())

    def averaged(self, stacked: Sequence) -> list:
        """Per-device statistics as one value each: floats' mean over the devices, integers'
        first device's (they agree). One process: host arrays; several: arrays replicated on
        every device (a collective)."""
        if self.workers == 1:
            return [
                np.asarray(a).mean(axis=0).astype(a.dtype)
                if np.issubdtype(a.dtype, np.floating)
                else np.asarray(a)[0]
                for a in stacked
            ]
        with processes.waiting():
            return self._average(list(stacked))

    @cached_property
    def _average(self):
        import jax
        import jax.numpy as jnp

        return jax.jit(
            lambda xs: [
                x.mean(axis=0).astype(x.dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x[0]
                for x in xs
            ],
            out_shardings=self.sharding(),
        )

    strategy_name = "DataParallel (JAX mesh)"  # for the summary

    def describe(self) -> str:
        """One line for the start of a run."""
        if self.workers == 1:
            return f"data parallel over a mesh of {self.replicas} device(s) (JAX)"
        return (
            f"data parallel over a mesh of {self.replicas} device(s) in {self.workers} "
            f"processes (JAX, jax.distributed), {self.task} of {self.workers} worker(s)"
            + (" (chief)" if self.is_chief else "")
        )


def local_value(value) -> np.ndarray:
    """A replicated value as a host array: a NumPy one as it is, a JAX array's piece on this
    process's first device (whole, as every device holds it; no collective)."""
    return np.asarray(value.addressable_data(0) if hasattr(value, "addressable_data") else value)


def _from_host(value: np.ndarray, sharding):
    import jax

    return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])


def build_placement(
    setup: DeviceSetup,
    *,
    kind: str = "auto",
    cross_device_ops: str = "auto",
    communication: str = "auto",
    cluster=None,
    shard: str = "none",
    model_parallel: int = 1,
    **_,
) -> Placement:
    """The mesh over ``setup``'s devices for strategy ``kind`` (``multi-worker``: over every
    process's, ``cluster``'s job joined by ``configure_devices(cluster=...)``); ConfigError,
    one line, for a strategy or collective setting that only the TensorFlow engine has.
    ``shard``: ``none``, ``optimizer`` or ``all`` (:mod:`mirrorfit.engine.jax.sharding`);
    ``model_parallel``: the devices each weight is split over (a 2-D mesh)."""
    from dataclasses import replace

    check_settings(
        "jax",
        strategy=kind,
        cross_device_ops=cross_device_ops,
        communication=communication,
        shard=shard,
    )
    placement = replace(_build(setup, kind, cluster), shard=shard)
    _check_model_parallel(placement, model_parallel)
    return replace(placement, model_parallel=model_parallel)


def _check_model_parallel(placement: Placement, model_parallel: int) -> None:
    """ConfigError for a 2-D mesh the placement cannot make."""
    if model_parallel == 1:
        return
    if placement.replicas % model_parallel:
        raise ConfigError(
            f"model_parallel={model_parallel} (--model-parallel {model_parallel}) does not "
            f"divide the {placement.replicas} replicas into groups; give a divisor of the "
            f"replicas, or more replicas (e.g. replicas={model_parallel * 2}, --replicas "
            f"{model_parallel * 2}, on logical CPU devices)"
        )
    if placement.workers > 1:
        raise ConfigError(
            f"model_parallel={model_parallel} (--model-parallel {model_parallel}) splits the "
            "weights over one process's devices; a job of several workers trains with "
            "model_parallel=1"
        )


def _build(setup: DeviceSetup, kind: str, cluster) -> Placement:
    if kind == "single" and setup.replicas != 1:
        raise ConfigError(
            f"--strategy single runs on one device but {setup.replicas} replicas "
            "were asked for; use --replicas 1 or --strategy mirrored"
        )
    import numpy as np
    from jax.sharding import Mesh

    if kind == "multi-worker" or cluster is not None:
        return _over_processes(setup, cluster)
    mesh = Mesh(np.array(setup.handles), (AXIS,))
    return Placement(
        mesh=mesh, kind="data-parallel", replicas=setup.replicas, local_replicas=setup.replicas
    )


def _over_processes(setup: DeviceSetup, cluster) -> Placement:
    """The mesh of every process's devices: process p's at the same local positions as this
    process's (every task runs the same command), process by process."""
    import jax
    import numpy as np
    from jax.sharding import Mesh

    from mirrorfit.distribute.cluster import cluster_for

    cluster = cluster or cluster_for("multi-worker")
    if processes.joined() != cluster:
        raise ConfigError(
            "--strategy multi-worker --backend jax: join the cluster before JAX "
            "starts: configure_devices(cluster=...) (mirrorfit train does)"
        )
    if setup.kind == "CPU" and setup.replicas > 1:
        raise ConfigError(
            f"--strategy multi-worker runs one replica per worker on CPUs, but "
            f"--replicas {setup.replicas} was asked for; drop --replicas, or "
            "start more workers (mirrorfit launch --workers N)"
        )
    platform = setup.handles[0].platform
    local = list(jax.local_devices(backend=platform))
    positions = [local.index(d) for d in setup.handles]
    by_process: dict[int, list] = {}
    for d in jax.devices(platform):
        by_process.setdefault(d.process_index, []).append(d)
    if len(by_process) != cluster.num_workers:
        raise ConfigError(
            f"--strategy multi-worker: JAX sees {len(by_process)} process(es), the "
            f"cluster has {cluster.num_workers} workers"
        )
    devices = [by_process[p][i] for p in sorted(by_process) for i in positions]
    placement = Placement(
        mesh=Mesh(np.array(devices), (AXIS,)),
        kind="multi-worker",
        replicas=len(devices),
        local_replicas=setup.replicas,
        workers=cluster.num_workers,
        worker_index=cluster.worker_rank,
        is_chief=cluster.is_chief,
        task=cluster.task_name(),
        cluster=cluster,
    )
    with processes.gloo_lines_dropped():  # the first collective: gloo connects the processes
        placement.all_equal(setup.replicas)
    return placement
