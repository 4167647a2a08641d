"""Keras callbacks under ``mirrorfit.fit`` on 2 replicas. Run as ``python callbacks.py BACKEND
DIR`` in a fresh process; writes DIR/result.json and DIR/ weights and model files."""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import numpy as np

import mirrorfit

BACKEND, DIR = sys.argv[1], Path(sys.argv[2])
mirrorfit.setup(backend=BACKEND, replicas=2)
import keras  # noqa: E402
from recording import Preempted, Rates, Scripted  # noqa: E402

rng = np.random.default_rng(0)
x = rng.normal(size=(200, 8)).astype("float32")
y = (x @ rng.normal(size=(8, 1))).astype("float32")


def build():
    keras.utils.set_random_seed(3)
    m = keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)]
    )
    m.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse", metrics=["mae"])
    return m


out: dict = {}

# EarlyStopping with restore_best_weights and ModelCheckpoint(save_best_only) on the same
# scripted val_loss: best at epoch 1 (0-based), stop after 2 epochs without improvement.
model = build()
script = Scripted([3.0, 1.0, 2.0, 4.0, 5.0, 6.0])
history = mirrorfit.fit(
    model,
    x,
    y,
    batch_size=32,
    epochs=6,
    verbose=0,
    shuffle=False,
    validation_data=(x, y),
    steps_per_execution=4,
    callbacks=[
        script,
        keras.callbacks.EarlyStopping(patience=2, restore_best_weights=True),
        keras.callbacks.ModelCheckpoint(str(DIR / "best.keras"), save_best_only=True),
        keras.callbacks.ModelCheckpoint(str(DIR / "e{epoch}.weights.h5"), save_weights_only=True),
        keras.callbacks.CSVLogger(str(DIR / "log.csv")),
    ],
)
out["epochs_run"] = len(history.history["loss"])
out["history_keys"] = sorted(history.history)
out["restored_is_best"] = all(
    np.array_equal(a, b) for a, b in zip(model.get_weights(), script.weights[1])
)
out["restored_differs_from_last"] = not all(
    np.array_equal(a, b) for a, b in zip(model.get_weights(), script.weights[-1])
)
best = keras.models.load_model(DIR / "best.keras")
out["checkpoint_is_best"] = all(
    np.allclose(a, b, rtol=0, atol=0) for a, b in zip(best.get_weights(), script.weights[1])
)
third = build()
third.load_weights(DIR / "e3.weights.h5")
out["weights_file_is_epoch_3"] = all(
    np.array_equal(a, b) for a, b in zip(third.get_weights(), script.weights[2])
)
out["csv_rows"] = len((DIR / "log.csv").read_text().strip().splitlines()) - 1

# LearningRateScheduler: a rate of 0 from the second epoch on stops the weights; the rate
# the step used is the one the callback set (ReduceLROnPlateau changes it at an epoch's end).
model = build()
initial = model.get_weights()
rates = Rates()
mirrorfit.fit(
    model,
    x,
    y,
    batch_size=32,
    epochs=4,
    verbose=0,
    shuffle=False,
    steps_per_execution=3,
    callbacks=[keras.callbacks.LearningRateScheduler(lambda e, lr: 0.05 if e == 0 else 0.0), rates],
)
out["rates_seen"] = rates.seen
out["frozen_after_rate_0"] = all(
    np.array_equal(a, b) for a, b in zip(rates.weights[1], rates.weights[3])
)
out["moved_in_epoch_0"] = not all(np.array_equal(a, b) for a, b in zip(initial, rates.weights[0]))
out["batch_ends"] = rates.batches[:4]

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
    callbacks=[
        keras.callbacks.ReduceLROnPlateau(
            monitor="loss", factor=0.0, patience=0, min_delta=1e9, min_lr=0.0
        ),
        rates,
    ],
)
out["plateau_rates"] = rates.seen
# No improvement is ever enough (min_delta): the rate drops to 0 at the end of epoch 1.
out["plateau_frozen"] = all(
    np.array_equal(a, b) for a, b in zip(rates.weights[1], rates.weights[2])
)


# A callback's own exception surfaces as itself.
class Broken(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        raise KeyError("mine")


try:
    mirrorfit.fit(build(), x, y, epochs=1, verbose=0, callbacks=[Broken()])
except KeyError as e:
    out["own_exception"] = str(e)


# BackupAndRestore: a run stopped by an error after epoch 2 resumes there, and ends with the
# weights of a run never stopped (as Keras's fit resumes).
def backed_up(extra, epochs=4):
    model = build()
    history = mirrorfit.fit(
        model,
        x,
        y,
        batch_size=32,
        epochs=epochs,
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
out["resumed_is_whole"] = all(
    np.array_equal(a, b) for a, b in zip(resumed.get_weights(), whole.get_weights())
)
out["backup_deleted"] = not (DIR / "bk").exists()


# checkpoint_dir: the same stop after epoch 2 (before the checkpoint of that epoch: it is
# written after the user's callbacks) resumes after epoch 1; the two latest are kept; a fit
# whose epochs are all done trains none; another model's checkpoint is refused in one line.
ckpt = DIR / "ckpt"
kw = dict(batch_size=32, epochs=4, verbose=0, shuffle=False, checkpoint_dir=ckpt)
try:
    mirrorfit.fit(build(), x, y, callbacks=[Preempted()], **kw)
except RuntimeError:
    out["ckpt_after_stop"] = sorted(p.name for p in ckpt.glob("epoch-*"))
resumed = build()
out["ckpt_resumed_epochs"] = len(mirrorfit.fit(resumed, x, y, **kw).history["loss"])
out["ckpt_resumed_is_whole"] = all(
    np.array_equal(a, b) for a, b in zip(resumed.get_weights(), whole.get_weights())
)
out["ckpt_kept"] = sorted(p.name for p in ckpt.glob("epoch-*"))
out["ckpt_done_epochs"] = len(mirrorfit.fit(build(), x, y, **kw).history.get("loss", []))
other = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
other.compile(optimizer="sgd", loss="mse")
try:
    mirrorfit.fit(other, x, y, **kw)
except ValueError as e:
    out["ckpt_other_model"] = str(e)
try:
    mirrorfit.fit(build(), x, y, **dict(kw, checkpoint_dir=DIR / "log.csv"))
except ValueError as e:
    out["ckpt_file"] = str(e)
# Same class, same weight shapes, another activation: refused; a folder of the user's named
# like a checkpoint is refused, not deleted; a second fit writing to the folder is refused.
tanh = keras.Sequential(
    [keras.Input((8,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)]
)
tanh.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse", metrics=["mae"])
try:
    mirrorfit.fit(tanh, x, y, **kw)
except ValueError as e:
    out["ckpt_other_layers"] = str(e)


def residual(from_input: bool):
    """The same layers, weights and settings; the residual from the input or from ``d1``."""
    inputs = keras.Input((8,))
    d1 = keras.layers.Dense(8, activation="relu")(inputs)
    added = keras.layers.Add()([keras.layers.Dense(8)(d1), inputs if from_input else d1])
    model = keras.Model(inputs, keras.layers.Dense(1)(added))
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    return model


wired = dict(kw, checkpoint_dir=DIR / "wired", epochs=1)
mirrorfit.fit(residual(False), x, y, **wired)
out["ckpt_same_wiring_epochs"] = mirrorfit.fit(residual(False), x, y, **dict(wired, epochs=2)).epoch
try:
    mirrorfit.fit(residual(True), x, y, **dict(wired, epochs=3))
except ValueError as e:
    out["ckpt_other_wiring"] = str(e)
junk = DIR / "junk" / "epoch-000007"
junk.mkdir(parents=True)
(junk / "mine.txt").write_text("mine")
try:
    mirrorfit.fit(build(), x, y, **dict(kw, checkpoint_dir=DIR / "junk"))
except ValueError as e:
    out["ckpt_junk"] = str(e)
out["ckpt_junk_kept"] = (junk / "mine.txt").read_text() == "mine"


class SecondFit(keras.callbacks.Callback):
    """Starts another fit on the same folder while this one holds it."""

    def on_epoch_end(self, epoch, logs=None):
        try:
            mirrorfit.fit(build(), x, y, **dict(kw, epochs=1, checkpoint_dir=DIR / "busy"))
        except ValueError as e:
            out["ckpt_busy"] = str(e)
        self.model.stop_training = True


mirrorfit.fit(build(), x, y, callbacks=[SecondFit()], **dict(kw, checkpoint_dir=DIR / "busy"))


# A callback that sets the weights the evaluation uses (as SwapEMAWeights does): zeros for
# the validation, the trained weights back after it. val_loss is then mean(y**2), and the
# training goes on as without it.
class ZerosForValidation(keras.callbacks.Callback):
    def on_test_begin(self, logs=None):
        self.kept = self.model.get_weights()
        self.model.set_weights([np.zeros_like(w) for w in self.kept])

    def on_test_end(self, logs=None):
        self.model.set_weights(self.kept)


swapped, plain = build(), build()
args = dict(batch_size=32, epochs=2, verbose=0, shuffle=False, validation_data=(x, y))
history = mirrorfit.fit(swapped, x, y, callbacks=[ZerosForValidation()], **args)
mirrorfit.fit(plain, x, y, **args)
out["val_loss_of_zeros"] = history.history["val_loss"]
out["mean_y2"] = float(np.mean(y**2))
out["swap_kept_training"] = all(
    np.array_equal(a, b) for a, b in zip(swapped.get_weights(), plain.get_weights())
)

# With allow_nan=True (Keras's way), TerminateOnNaN stops the run (NaN targets: a NaN input
# can vanish in a ReLU on oneDNN); by default fit stops it itself (tests/fitting/resume.py).
model = build()
yn = y.copy()
yn[40:] = np.nan
with warnings.catch_warnings(record=True) as said:
    warnings.simplefilter("always")
    history = mirrorfit.fit(
        model,
        x,
        yn,
        batch_size=32,
        epochs=3,
        verbose=0,
        shuffle=False,
        steps_per_execution=1,
        callbacks=[keras.callbacks.TerminateOnNaN()],
        checkpoint_dir=DIR / "nan-ckpt",  # NaN weights: no checkpoint, a warning
        allow_nan=True,
    )
out["nan_warned"] = any(
    "are not finite (" in str(w.message) and "no checkpoint written" in str(w.message) for w in said
)
out["nan_epochs"] = len(history.history.get("loss", []))
out["nan_checkpoints"] = sorted(p.name for p in (DIR / "nan-ckpt").glob("epoch-*"))
(DIR / "result.json").write_text(json.dumps(out))
