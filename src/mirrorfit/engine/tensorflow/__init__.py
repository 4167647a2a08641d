"""The TensorFlow engine, in the order a run uses it: ``devices`` (GPUs, logical CPU devices,
thread pools) -> ``strategy`` (tf.distribute by name, as one ``distribution.Distribution``;
``parameter_server`` for ParameterServerStrategy) -> ``step`` (what each replica runs) ->
``loop`` (S steps in one tf.function) -> ``runner`` (everything built under the strategy)."""

import importlib

# The engine's interface (mirrorfit.engine.backends), loaded on first use: its modules import
# the framework, and some callers need only a part (``mirrorfit export`` reads a JAX
# checkpoint's arrays with NumPy, on a machine that may have no JAX).
_EXPORTS = {"configure_devices": "devices", "list_devices": "devices", "Runner": "runner",
            "build_distribution": "strategy"}


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


__all__ = [*_EXPORTS, "seed"]
