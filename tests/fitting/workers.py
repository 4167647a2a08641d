"""``mirrorfit.fit`` with Keras callbacks over 2 worker processes (run under ``mirrorfit launch
--workers 2``), or on 1 process with 2 devices as the reference (run alone). Run as ``python
workers.py BACKEND DIR``; each process writes DIR/result-W-N.json (worker W of N) and its
final weights to DIR/*-W-N.npz; the chief's callbacks write DIR/best.keras, DIR/log.csv and
DIR/eN.weights.h5."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

import mirrorfit

BACKEND, DIR = sys.argv[1], Path(sys.argv[2])
JOINED = bool(os.environ.get("TF_CONFIG"))
chosen = mirrorfit.setup(
    backend=BACKEND,
    **({"strategy": "multi-worker"} if JOINED else {"replicas": 2}),
)
import keras  # noqa: E402
from recording import Preempted, Rates, Scripted  # noqa: E402

ME = f"{chosen.distribution.worker_index if JOINED else 0}-{chosen.workers}"
rng = np.random.default_rng(0)
x = rng.normal(size=(200, 8)).astype("float32")
y = (x @ rng.normal(size=(8, 1))).astype("float32")
out: dict = {"replicas": chosen.replicas, "workers": chosen.workers, "chief": chosen.is_chief}


def build():
    keras.utils.set_random_seed(3 + (1 if ME.startswith("1-") else 0))  # workers differ here
    m = keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)]
    )
    m.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse", metrics=["mae"])
    return m


def same(a, b) -> bool:
    return all(np.array_equal(p, q) for p, q in zip(a, b, strict=True))


class Saves(keras.callbacks.ModelCheckpoint):
    """Keras's ModelCheckpoint, counting its saves on this worker."""

    count = 0

    def _save_model(self, epoch, batch, logs):
        Saves.count += 1
        super()._save_model(epoch, batch, logs)


# EarlyStopping with restore_best_weights and ModelCheckpoint(save_best_only) on the same
# scripted val_loss (best at epoch 1, 0-based; patience 2), shuffled: the workers' shuffles
# must agree, and their starting weights (drawn with other seeds on purpose) are the chief's.
model = build()
script = Scripted([3.0, 1.0, 2.0, 4.0, 5.0, 6.0])
history = mirrorfit.fit(
    model,
    x,
    y,
    batch_size=32,
    epochs=6,
    verbose=0,
    shuffle=True,
    validation_data=(x, y),
    steps_per_execution=3,
    callbacks=[
        script,
        keras.callbacks.EarlyStopping(patience=2, restore_best_weights=True),
        Saves(str(DIR / "best.keras"), save_best_only=True),
        keras.callbacks.ModelCheckpoint(str(DIR / "e{epoch}.weights.h5"), save_weights_only=True),
        keras.callbacks.CSVLogger(str(DIR / "log.csv")),
    ],
)
out["epochs_run"] = len(history.history["loss"])
out["history"] = history.history
out["restored_is_best"] = same(model.get_weights(), script.weights[1])
out["restored_differs_from_last"] = not same(model.get_weights(), script.weights[-1])
out["saves"] = Saves.count
np.savez(DIR / f"early-{ME}.npz", *model.get_weights())
np.savez(DIR / f"best-epoch-{ME}.npz", *script.weights[1])

# LearningRateScheduler: a rate of 0 from the second epoch on stops the weights.
model = build()
rates = Rates()
mirrorfit.fit(
    model,
    x,
    y,
    batch_size=32,
    epochs=3,
    verbose=0,
    shuffle=False,
    steps_per_execution=2,
    callbacks=[keras.callbacks.LearningRateScheduler(lambda e, lr: 0.05 if e == 0 else 0.0), rates],
)
out["rates_seen"] = rates.seen
out["frozen_after_rate_0"] = same(rates.weights[0], rates.weights[2])

# The same batches as 1 process with 2 devices: shuffle=False, a partial last batch (200 = 6 x
# 32 + 8), evaluated after.
model = build()
history = mirrorfit.fit(model, x, y, batch_size=32, epochs=2, verbose=0, shuffle=False)
out["plain_history"] = history.history
out["evaluate"] = mirrorfit.evaluate(model, x, y, batch_size=48, verbose=0, return_dict=True)
np.savez(DIR / f"plain-{ME}.npz", *model.get_weights())
if chosen.is_chief:  # the chief alone saves; the workers train on after it
    model.save(DIR / "plain.keras")


# BackupAndRestore: a run stopped by an error after epoch 2 on every worker resumes there on
# every worker (the chief saved the backup; all read it) with the weights of a run never
# stopped.
def backed_up(extra):
    model = build()
    history = mirrorfit.fit(
        model,
        x,
        y,
        batch_size=32,
        epochs=4,
        verbose=0,
        shuffle=False,
        callbacks=[keras.callbacks.BackupAndRestore(str(DIR / "bk")), *extra],
    )
    return model, history


try:
    backed_up([Preempted()])
except RuntimeError as e:
    out["preempted"] = str(e)
resumed, history = backed_up([])
out["resumed_epochs"] = len(history.history["loss"])
whole = build()
mirrorfit.fit(whole, x, y, batch_size=32, epochs=4, verbose=0, shuffle=False)
out["resumed_is_whole"] = same(resumed.get_weights(), whole.get_weights())

# checkpoint_dir: the chief writes, every worker reads and resumes after epoch 1.
kw = dict(batch_size=32, epochs=4, verbose=0, shuffle=False, checkpoint_dir=DIR / "ckpt")
try:
    mirrorfit.fit(build(), x, y, callbacks=[Preempted()], **kw)
except RuntimeError:
    pass
resumed = build()
out["ckpt_resumed_epochs"] = len(mirrorfit.fit(resumed, x, y, **kw).history["loss"])
out["ckpt_resumed_is_whole"] = same(resumed.get_weights(), whole.get_weights())

# What one worker does alone cannot set the workers apart, or leave one waiting.
if JOINED:
    one = ME.startswith("1-")
    # Data that differ in one example in the middle of a batch stop every worker in one line.
    mine = y.copy()
    mine[5] += 1.0 if one else 0.0
    try:
        mirrorfit.fit(build(), x, mine, batch_size=32, epochs=1, verbose=0, shuffle=False)
    except ValueError as e:
        out["differ"] = str(e)

    # Weights one worker set between two fits: the next fit starts from the chief's.
    model = build()
    mirrorfit.fit(model, x, y, batch_size=32, epochs=1, verbose=0, shuffle=False)
    if one:
        model.set_weights([w + 1.0 for w in model.get_weights()])
    mirrorfit.fit(model, x, y, batch_size=32, epochs=1, verbose=0, shuffle=False)
    np.savez(DIR / f"after-set-{ME}.npz", *model.get_weights())

    # A callback that stops one worker stops them all at that epoch.
    class StopOne(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if one and epoch == 1:
                self.model.stop_training = True

    history = mirrorfit.fit(
        build(), x, y, batch_size=32, epochs=5, verbose=0, callbacks=[StopOne()]
    )
    out["stopped_after"] = len(history.history["loss"])

    # Other arguments, or an argument one worker refuses: every worker says so in one line.
    try:
        mirrorfit.fit(build(), x, y, batch_size=32, epochs=3 if one else 2, verbose=0)
    except ValueError as e:
        out["other_epochs"] = str(e)
    try:
        where = DIR / "log.csv" if one else DIR / "ckpt-ok"
        mirrorfit.fit(build(), x, y, batch_size=32, epochs=1, verbose=0, checkpoint_dir=where)
    except ValueError as e:
        out["one_refused"] = str(e)
(DIR / f"result-{ME}.json").write_text(json.dumps(out))
