"""The JAX engine (Keras 3 on JAX), in the order a run uses it: ``devices`` -> ``placement`` (a
mesh; ``sharding``, ``created_sharded``: the state split over it) -> ``keras_fit`` (the
compiled model's step, S steps in one jitted call, one all-reduce per step: ``step``) ->
``fit_state``/``orbax_state`` (a split state's checkpoint files). Imports no TensorFlow.
"""

import importlib
from typing import TYPE_CHECKING

from mirrorfit.engine.contract import Capabilities

# The engine's interface (mirrorfit.engine.backends), loaded on first use: its modules import
# the framework, and some callers need only a part (``mirrorfit export`` reads a JAX
# checkpoint's arrays with NumPy, on a machine that may have no JAX).
_EXPORTS = {
    "configure_devices": "devices",
    "list_devices": "devices",
    "build_distribution": "placement",
}


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'mirrorfit.engine.jax' has no attribute {name!r}")
    module = importlib.import_module(f"mirrorfit.engine.jax.{_EXPORTS[name]}")
    value = getattr(module, name if name != "build_distribution" else "build_placement")
    globals()[name] = value
    return value


def seed(value: int) -> None:
    """Seed Python, NumPy and Keras (weights, Dropout) as ``keras.utils.set_random_seed`` does,
    without TensorFlow: that function seeds TensorFlow too wherever it is installed, and
    importing it here would cost seconds and the promise that this engine never loads it."""
    import random

    import numpy as np
    from keras.src.backend.common import global_state
    from keras.src.random import seed_generator
    from keras.src.utils.rng_utils import GLOBAL_RANDOM_SEED

    global_state.set_global_attribute(GLOBAL_RANDOM_SEED, value)
    global_state.set_global_attribute(seed_generator.GLOBAL_SEED_GENERATOR, None)
    random.seed(value)
    np.random.seed(value)


def keras_setup(
    replicas: int | None,
    devices: tuple[str, ...],
    shard: str = "none",
    cluster=None,
    model_parallel: int = 1,
):
    """``mirrorfit.setup``'s devices and mesh for a Keras script: (DeviceSetup, Placement,
    Placement or None); ``cluster``: joined first, the mesh over every worker's devices;
    ``model_parallel``: a 2-D mesh, each weight split over that many devices."""
    from mirrorfit.engine.jax import created_sharded
    from mirrorfit.engine.jax.devices import configure_devices
    from mirrorfit.engine.jax.placement import build_placement

    chosen = configure_devices(replicas=replicas, devices=devices, cluster=cluster)
    placement = build_placement(
        chosen,
        kind="multi-worker" if cluster else "auto",
        cluster=cluster,
        shard=shard,
        model_parallel=model_parallel,
    )
    made = created_sharded.distribution(placement)
    if made is not None:  # the model the script builds next is created on its shards
        import keras

        keras.distribution.set_distribution(made)
    return chosen, placement, placement if cluster is not None else None


def creating_variables(placement):
    """A context in which the Keras variables made are placed as ``placement`` holds them:
    on their shards under ``shard="all"`` (:mod:`~mirrorfit.engine.jax.created_sharded`)."""
    import contextlib

    from mirrorfit.engine.jax import created_sharded

    made = created_sharded.distribution(placement)
    return contextlib.nullcontext() if made is None else made.scope()


def read_split_state(folder, model) -> None:
    """The model's variables from checkpoint ``folder`` whose state was split over JAX
    devices (Orbax's files, read whole onto the host: TensorFlow's ``mirrorfit export`` takes
    it); ConfigError, one line, without Orbax."""
    from mirrorfit.errors import ConfigError

    try:
        from mirrorfit.engine.jax import orbax_state
        import orbax.checkpoint  # noqa: F401
    except ImportError as e:
        raise ConfigError(
            f"{folder} holds a state split over JAX devices (Orbax's files), and {e.name} "
            "is not installed: pip install 'mirrorfit[jax]'"
        ) from None
    orbax_state.read_model(folder, model)


def peer_failure(error: BaseException) -> bool:
    """Whether ``error`` is a collective that failed because another task went away."""
    from mirrorfit.engine.jax import processes

    return processes.peer_failure(error)


def stopped_answering(cluster) -> list[str]:
    """The tasks of ``cluster`` that went away, once :func:`peer_failure` said so (a dead
    task's port closes ~50 ms after it: waited for)."""
    from mirrorfit.engine.jax import processes

    if processes.joined() is None:
        return cluster.unreachable()
    processes.claim_report()  # this line, not the SIGABRT handler's
    return processes.gone(cluster)


def in_job() -> bool:
    """Whether this process joined a multi-worker job (jax.distributed). A failed task of one
    exits at once: in the teardown JAX's client would wait for every peer at its shutdown
    barrier, a dead one too, then abort the process with a fatal log."""
    from mirrorfit.engine.jax import processes

    return processes.joined() is not None


CAPABILITIES = Capabilities(
    strategies=("auto", "single", "mirrored", "multi-worker"),
    splits_state=True,  # --shard, --model-parallel (sharding.py, placement.py)
    exports_saved_model=False,  # a SavedModel needs TensorFlow: `mirrorfit export` writes it
    compiles_every_step=True,  # XLA compiles the whole step always (--xla is what it does)
    chooses_collectives=False,  # XLA does the all-reduce
    syncs_batchnorm_under_xla=True,  # the whole step is one XLA program
)

__all__ = [
    *_EXPORTS,
    "seed",
    "keras_setup",
    "read_split_state",
    "peer_failure",
    "stopped_answering",
    "in_job",
    "CAPABILITIES",
]


if TYPE_CHECKING:  # mypy checks this engine's fit module and runners against the contract
    from mirrorfit.engine.contract import FitEngine, FitRunner
    from mirrorfit.engine.jax import keras_fit, keras_override

    _fit: FitEngine = keras_fit
    _runner: type[FitRunner] = keras_fit.Runner
    _override_runner: type[FitRunner] = keras_override.OverrideRunner
