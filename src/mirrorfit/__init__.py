"""mirrorfit: data-parallel Keras training that is correct and fast, with numbers to prove it::

    import mirrorfit
    mirrorfit.setup(backend="jax", replicas=2)          # before the model is built
    import keras
    model = ...                                         # your Keras model, compiled
    history = mirrorfit.fit(model, x, y, batch_size=64, epochs=10)

More: docs/keras-script.md; the CLI's training job from Python: docs/training.md#python-api
"""

import importlib

# Names are imported on first use (PEP 562), not here: importing TensorFlow takes seconds and
# fixes its C++ log level for the process, so `mirrorfit --help`, a flag error and the CLI's
# quiet-logging setting must all come before it.
_EXPORTS = {
    "models": "mirrorfit.models",
    "TrainConfig": "mirrorfit.config",
    "load_config": "mirrorfit.config",
    "eval_dataset": "mirrorfit.data",
    "load_mnist": "mirrorfit.data",
    "train_batches": "mirrorfit.data",
    "load_data": "mirrorfit.data.sources",
    "Data": "mirrorfit.data.sources",
    "DeviceSetup": "mirrorfit.engine.device_setup",
    "configure_devices": "mirrorfit.engine.tensorflow.devices",
    "list_devices": "mirrorfit.engine.tensorflow.devices",
    "Cluster": "mirrorfit.distribute.cluster",
    "resolve_cluster": "mirrorfit.distribute.cluster",
    "Distribution": "mirrorfit.engine.tensorflow.strategy",
    "build_distribution": "mirrorfit.engine.tensorflow.strategy",
    "ConfigError": "mirrorfit.errors",
    "DataError": "mirrorfit.errors",
    "MirrorfitError": "mirrorfit.errors",
    "FitError": "mirrorfit.errors",
    "DivergedError": "mirrorfit.errors",
    "Preempted": "mirrorfit.job.preemption",
    "Precision": "mirrorfit.models.precision",
    "LinearWarmup": "mirrorfit.models.schedules",
    "learning_rate": "mirrorfit.models.schedules",
    "build_strategy": "mirrorfit.engine.tensorflow.strategy",
    "build_optimizer": "mirrorfit.models.schedules",
    "run_training": "mirrorfit.job.train",
    "setup": "mirrorfit.fitting",
    "fit": "mirrorfit.fitting",
    "evaluate": "mirrorfit.fitting",
    "predict": "mirrorfit.fitting",
    "Setup": "mirrorfit.fitting",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'mirrorfit' has no attribute {name!r}")
    module = importlib.import_module(_EXPORTS[name])
    value = module if name == "models" else getattr(module, name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
