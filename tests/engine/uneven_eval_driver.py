"""Run by tests/engine/test_controller.py: ``python uneven_eval_driver.py``. On 2 logical CPU
replicas (TensorFlow), trains the MLP one epoch on 512 MNIST examples, then evaluates 1,001
test examples in batches of 64 (the last one partial). Prints one JSON line: the trainer's
result, and the accuracy and loss computed here from the model's predictions."""

import json

import keras
import numpy as np

import mirrorfit

setup = mirrorfit.configure_devices(replicas=2)
strategy = mirrorfit.build_strategy(setup)
data = mirrorfit.load_mnist(train_examples=512, download=False)
trainer = mirrorfit.Trainer(
    strategy=strategy,
    model=mirrorfit.models.mlp,
    optimizer=keras.optimizers.SGD(0.1),
    loss=keras.losses.SparseCategoricalCrossentropy(),
    global_batch=64,
)
trainer.fit(mirrorfit.train_batches(data.x_train, data.y_train, global_batch=64, seed=0), epochs=1)
x, y = data.x_test[:1001], data.y_test[:1001]
result = trainer.evaluate((x, y), batch_size=64)
probs = trainer.model.predict(x / 255.0, verbose=0)
expected_acc = float(np.mean(np.argmax(probs, 1) == y))
expected_loss = float(np.mean(-np.log(probs[np.arange(len(y)), y])))
print(json.dumps({"result": result, "acc": expected_acc, "loss": expected_loss}))
