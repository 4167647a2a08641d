"""Keras callbacks that record what a fit did, shared by the drivers in this folder
(callbacks.py, workers.py); imported after ``mirrorfit.setup``."""

from __future__ import annotations

import keras


def weights(model) -> list:
    return [w.copy() for w in model.get_weights()]


class Scripted(keras.callbacks.Callback):
    """Replaces val_loss with a scripted sequence and records the weights at each epoch end."""

    def __init__(self, values):
        super().__init__()
        self.values, self.weights = values, []

    def on_epoch_end(self, epoch, logs=None):
        logs["val_loss"] = self.values[epoch]
        self.weights.append(weights(self.model))


class Rates(keras.callbacks.Callback):
    """The learning rate and the weights at each epoch end; the batch of each batch end."""

    def __init__(self):
        super().__init__()
        self.seen, self.batches, self.weights = [], [], []

    def on_epoch_end(self, epoch, logs=None):
        self.seen.append(float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate)))
        self.weights.append(weights(self.model))

    def on_train_batch_end(self, batch, logs=None):
        self.batches.append(batch)


class Preempted(keras.callbacks.Callback):
    """Stops the run with an error at the end of epoch 2, as a kill would."""

    def on_epoch_end(self, epoch, logs=None):
        if epoch == 1:
            raise RuntimeError("preempted")
