"""Run by tests/engine/jax/test_jax_runner.py: ``python uneven_eval_driver.py``. On 2 logical
CPU devices, the JAX engine (TensorFlow blocked) trains the MLP one epoch on 512 MNIST
examples, then evaluates 1,001 test examples in batches of 63. Prints one JSON line: the
trainer's result, and the accuracy and loss computed here from the model's predictions."""

import json
import os
import sys

sys.modules["tensorflow"] = None
os.environ["KERAS_BACKEND"] = "jax"

import keras  # noqa: E402
import numpy as np  # noqa: E402

import mirrorfit  # noqa: E402
from mirrorfit.engine import jax as engine  # noqa: E402

placement = engine.build_distribution(engine.configure_devices(replicas=2))
data = mirrorfit.load_mnist(train_examples=512, download=False)
trainer = mirrorfit.Trainer(
    strategy=placement,
    model=mirrorfit.models.mlp,
    optimizer=keras.optimizers.SGD(0.1),
    loss=keras.losses.SparseCategoricalCrossentropy(),
    global_batch=64,
)
trainer.fit(mirrorfit.train_batches(data.x_train, data.y_train, global_batch=64, seed=0), epochs=1)
x, y = data.x_test[:1001], data.y_test[:1001]
result = trainer.evaluate((x, y), batch_size=63)
probs = np.asarray(trainer.model.predict(x / 255.0, verbose=0))
print(
    json.dumps(
        {
            "result": result,
            "acc": float(np.mean(np.argmax(probs, 1) == y)),
            "loss": float(np.mean(-np.log(probs[np.arange(len(y)), y]))),
        }
    )
)
