"""mirrorfit: data-parallel Keras training that is correct and fast, with numbers to prove it.

Public API::

    import mirrorfit
    setup = mirrorfit.configure_devices(replicas=2)     # before TensorFlow starts
    strategy = mirrorfit.build_strategy(setup)
    trainer = mirrorfit.Trainer(strategy=strategy, model=mirrorfit.models.mlp,
                                optimizer=keras.optimizers.SGD(1e-2),
                                loss=keras.losses.SparseCategoricalCrossentropy(),
                                global_batch=64, steps_per_execution=50,
                                precision="bf16", accum_steps=1, jit_compile=False)
    history = trainer.fit(dataset_of_global_batches, epochs=10)
"""

from mirrorfit import models
from mirrorfit.config import TrainConfig, load_config
from mirrorfit.data import eval_dataset, load_mnist, train_batches
from mirrorfit.devices import DeviceSetup, configure_devices, list_devices
from mirrorfit.engine.trainer import History, Trainer
from mirrorfit.errors import ConfigError, DataError, MirrorfitError
from mirrorfit.precision import Precision
from mirrorfit.schedules import LinearWarmup, learning_rate
from mirrorfit.strategy import build_strategy
from mirrorfit.train import build_optimizer, run_training

__all__ = [
    "models", "TrainConfig", "load_config", "eval_dataset", "load_mnist", "train_batches",
    "DeviceSetup", "configure_devices", "list_devices", "History", "Trainer", "ConfigError",
    "DataError", "MirrorfitError", "Precision", "LinearWarmup", "learning_rate",
    "build_strategy", "build_optimizer", "run_training",
]
