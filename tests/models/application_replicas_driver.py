"""Run by tests/models/test_build.py: ``python application_replicas_driver.py``. MobileNet
(v1: the quickest application to compile, ~10 s here) trains one step of synthetic 32x32x3
images through ``mirrorfit.fit`` on 2 logical CPU replicas (TensorFlow). Prints one JSON line:
the loss, the replicas and the steps."""

import json

import numpy as np

import mirrorfit

mirrorfit.setup(backend="tensorflow", replicas=2)
import keras  # noqa: E402

from mirrorfit.models.build import model_factory  # noqa: E402

rng = np.random.default_rng(0)
x = rng.random((8, 32, 32, 3), dtype=np.float32)
y = rng.integers(0, 4, 8)
model = model_factory("MobileNet", input_shape=(32, 32, 3), num_classes=4)()
model.compile(optimizer=keras.optimizers.SGD(1e-2), loss="sparse_categorical_crossentropy")
steps: list = []
count = keras.callbacks.LambdaCallback(on_train_batch_end=lambda b, logs: steps.append(b))
history = mirrorfit.fit(model, x, y, batch_size=8, epochs=1, verbose=0, callbacks=[count])
runner = mirrorfit.fitting.loop.runner_of(model)
print(
    json.dumps(
        {"loss": history.history["loss"][-1], "replicas": runner.replicas, "steps": len(steps)}
    )
)
