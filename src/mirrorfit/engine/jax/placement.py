"""Where a JAX run computes: a 1-D mesh of this process's devices (axis ``"data"``), the batch
split along it and the state replicated, as one frozen :class:`Placement` (the JAX engine's
counterpart of :class:`mirrorfit.engine.tensorflow.distribution.Distribution`).

``--strategy`` names that only TensorFlow has (central storage, parameter servers) and the
TensorFlow collectives' flags are refused here in one line; ``auto``, ``single`` and
``mirrored`` are all data parallel over the mesh (one device is a mesh of one).
"""

from __future__ import annotations

from dataclasses import dataclass

from mirrorfit.engine.backends import GLOBAL_BATCH, check_settings
from mirrorfit.engine.jax.devices import DeviceSetup
from mirrorfit.errors import ConfigError

AXIS = "data"  # the mesh axis the batch is split along


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
    backend = "jax"  # which engine runs it (mirrorfit.engine.controller picks the runner by it)
    lockstep = False  # several processes: metric reads and checks are collectives
    input_split = GLOBAL_BATCH  # what each process reads (mirrorfit.job.data)

    def agree(self, flag: bool) -> bool:
        """True on every process if ``flag`` is True on any; one process: ``flag``."""
        return flag

    def all_equal(self, value: int) -> bool:
        """Whether every process holds the same ``value``; one process: True."""
        return True

    strategy_name = "DataParallel (JAX mesh)"  # for the summary

    def describe(self) -> str:
        """One line for the start of a run."""
        return f"data parallel over a mesh of {self.replicas} device(s) (JAX)"


def build_placement(setup: DeviceSetup, *, kind: str = "auto", cross_device_ops: str = "auto",
                    communication: str = "auto", cluster=None, **_) -> Placement:
    """The mesh over ``setup``'s devices for strategy ``kind``; ConfigError, one line, for a
    strategy or collective setting that only the TensorFlow engine has."""
    check_settings("jax", strategy=kind, cross_device_ops=cross_device_ops,
                   communication=communication)
    if cluster is not None:
        check_settings("jax", strategy="multi-worker")
    if kind == "single" and setup.replicas != 1:
        raise ConfigError(f"--strategy single runs on one device but {setup.replicas} replicas "
                          "were asked for; use --replicas 1 or --strategy mirrored")
    import numpy as np
    from jax.sharding import Mesh

    mesh = Mesh(np.array(setup.jax_devices), (AXIS,))
    return Placement(mesh=mesh, kind="data-parallel", replicas=setup.replicas,
                     local_replicas=setup.replicas)
