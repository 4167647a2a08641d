"""The TensorFlow engine, in the order a run uses it: ``devices`` (GPUs, logical CPU devices,
thread pools) -> ``strategy`` (tf.distribute by name, as one ``distribution.Distribution``;
``parameter_server`` for ParameterServerStrategy) -> ``keras_fit`` (the compiled model's
step per replica, S steps in one tf.function; ``coordinated_fit`` under parameter servers)."""

import importlib
from typing import TYPE_CHECKING

from mirrorfit.engine.contract import Capabilities

# The engine's interface (mirrorfit.engine.backends), loaded on first use: its modules import
# the framework, and some callers need only a part (``mirrorfit export`` reads a JAX
# checkpoint's arrays with NumPy, on a machine that may have no JAX).
_EXPORTS = {
    "configure_devices": "devices",
    "list_devices": "devices",
    "build_distribution": "strategy",
}


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'mirrorfit.engine.tensorflow' has no attribute {name!r}")
    module = importlib.import_module(f"mirrorfit.engine.tensorflow.{_EXPORTS[name]}")
    value = getattr(module, name)
    globals()[name] = value
    return value


def seed(value: int) -> None:
    """Seed Python, NumPy, Keras and TensorFlow (weights, Dropout, tf.data's shuffles)."""
    import keras

    keras.utils.set_random_seed(value)


def keras_setup(replicas: int | None, devices: tuple[str, ...], shard: str = "none", cluster=None):
    """``mirrorfit.setup``'s devices and strategy for a Keras script: (DeviceSetup, strategy,
    Distribution or None). The strategy becomes the process's default, so the model the script
    builds next is mirrored (TensorFlow's variables are mirrored only when created under one).
    ``cluster``: MultiWorkerMirroredStrategy over its workers."""
    from mirrorfit.engine import backends

    backends.check_settings("tensorflow", shard=shard)
    backends.import_tensorflow(
        "mirrorfit.setup(backend='tensorflow', the default unless $KERAS_BACKEND says jax)"
    )
    import tensorflow as tf

    from mirrorfit.engine.tensorflow.devices import configure_devices
    from mirrorfit.engine.tensorflow.strategy import build_distribution, build_strategy

    chosen = configure_devices(replicas=replicas, devices=devices)
    distribution = None
    if cluster is None:
        strategy = build_strategy(chosen)
    else:
        distribution = build_distribution(chosen, kind="multi-worker", cluster=cluster)
        strategy = distribution.strategy
        _saving_makes_no_variables()
    tf.distribute.experimental_set_strategy(strategy)
    return chosen, strategy, distribution


def _saving_makes_no_variables() -> None:
    """Before a multi-worker strategy becomes the default: Keras's saving makes a reference
    Optimizer (two variables) on every save, to learn which attributes to skip; its cache is
    read under another key than it is written (Keras 3.15), so it never hits. Under the
    strategy a variable is a collective every worker must join, and a model the chief saved
    alone stopped the job. The skip sets are made here and kept under both keys."""
    from keras.src.backend.common import global_state
    from keras.src.saving import saving_lib

    for kind in ("Operation", "Layer", "Functional", "Sequential", "Metric", "Optimizer", "Loss"):
        skip = saving_lib.get_attr_skipset(kind)
        for key in ("skiplist", "skipset"):
            global_state.set_global_attribute(f"saving_attr_{key}_{kind}", skip)


def creating_variables(placement):
    """Nothing here: the model is built under the strategy's scope, which places it."""
    import contextlib

    return contextlib.nullcontext()


def peer_failure(error: BaseException) -> bool:
    """Whether ``error`` is a collective that failed because another task went away."""
    import sys

    tf = sys.modules.get("tensorflow")  # not loaded: not TensorFlow's error
    return tf is not None and isinstance(
        error,
        (
            tf.errors.UnavailableError,
            tf.errors.DeadlineExceededError,
            tf.errors.CancelledError,
            tf.errors.AbortedError,
        ),
    )


def stopped_answering(cluster) -> list[str]:
    """The tasks of ``cluster`` that went away, once :func:`peer_failure` said so."""
    return cluster.unreachable()


def in_job() -> bool:
    """Whether a failed task must exit at once, past the teardown: not on TensorFlow."""
    return False


CAPABILITIES = Capabilities(
    strategies=(
        "auto",
        "single",
        "mirrored",
        "central-storage",
        "multi-worker",
        "parameter-server",
    ),
    splits_state=False,
    exports_saved_model=True,
    compiles_every_step=False,  # --xla compiles each replica's step; without it, tf.function
    chooses_collectives=True,  # --cross-device-ops, --communication
    syncs_batchnorm_under_xla=False,  # a replica's XLA pass cannot all-reduce (merge_call)
)

__all__ = [
    *_EXPORTS,
    "seed",
    "keras_setup",
    "peer_failure",
    "stopped_answering",
    "in_job",
    "CAPABILITIES",
]


if TYPE_CHECKING:  # mypy checks this engine's fit module and runner against the contract
    from mirrorfit.engine.contract import FitEngine, FitRunner
    from mirrorfit.engine.tensorflow import keras_fit

    _fit: FitEngine = keras_fit
    _runner: type[FitRunner] = keras_fit.Runner
