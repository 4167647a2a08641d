"""Run by tests/models/test_build.py: ``python application_replicas_driver.py``. MobileNet
(v1: the quickest application to compile, ~10 s here) trains one step of synthetic 32x32x3
images under mirrorfit on 2 logical CPU replicas. Prints one JSON line: the loss, the
replicas and the steps."""

import json

import keras

import mirrorfit
from mirrorfit.data.synthetic import synthetic_batches
from mirrorfit.models.build import model_factory

dist = mirrorfit.build_strategy(mirrorfit.configure_devices(replicas=2))
data = synthetic_batches(
    input_shape=(32, 32, 3), num_classes=4, global_batch=8, steps_per_epoch=1, seed=0
)
trainer = mirrorfit.Trainer(
    strategy=dist,
    optimizer=keras.optimizers.SGD(1e-2),
    model=model_factory("MobileNet", input_shape=(32, 32, 3), num_classes=4),
    loss=keras.losses.SparseCategoricalCrossentropy(),
    global_batch=8,
)
history = trainer.fit(data, epochs=1)
print(
    json.dumps(
        {"loss": history.epochs[-1]["loss"], "replicas": trainer.replicas, "steps": history.steps}
    )
)
