"""Run by tests/job/test_observe.py in a fresh process (configure_devices() must run before
TensorFlow starts): ``python scalars_driver.py LOGDIR``. Trains the MLP 2 epochs on 1,280
MNIST examples (5 steps an execution) with a ScalarWriter on LOGDIR as its step hook and
epoch callback. Prints an empty JSON object."""

import json
import sys

import keras

import mirrorfit
from mirrorfit.job.observe import ScalarWriter

data = mirrorfit.load_mnist(train_examples=1280, download=False)
strategy = mirrorfit.build_strategy(mirrorfit.configure_devices())
trainer = mirrorfit.Trainer(
    strategy=strategy,
    model=mirrorfit.models.mlp,
    optimizer=keras.optimizers.SGD(0.05),
    loss=keras.losses.SparseCategoricalCrossentropy(),
    global_batch=64,
    steps_per_execution=5,
)
board = ScalarWriter(sys.argv[1])
trainer.fit(
    mirrorfit.train_batches(data.x_train, data.y_train, global_batch=64, seed=0),
    epochs=2,
    validation=(data.x_val, data.y_val),
    hooks=[board.step_hook],
    callbacks=[board.epoch_callback],
)
print(json.dumps({}))
