"""``python fit_save_driver.py DIR MODE EPOCHS``: ``mirrorfit.fit`` of a small compiled model
(Adam, 256 examples, batch 32) on JAX (TensorFlow blocked) with ``checkpoint_dir=DIR`` up to
EPOCHS epochs. MODE ``train``: as it is; ``crash``: SIGKILLs itself at a checkpoint's commit
(the rename into place); ``fsync``: records every fsync. Prints one JSON line: the epochs this
run trained, the warnings it gave, the fsynced paths, whether the weights are finite, and
the line of a refusal (a ValueError) where there is one."""

from __future__ import annotations

import json
import os
import signal
import sys
import warnings

sys.modules["tensorflow"] = None  # the JAX engine never imports it

import numpy as np  # noqa: E402

import mirrorfit  # noqa: E402

DIR, MODE, EPOCHS = sys.argv[1], sys.argv[2], int(sys.argv[3])
mirrorfit.setup(backend="jax")
import keras  # noqa: E402

signal.alarm(120)  # a hang (a FIFO opened for reading) fails the test, not the suite
keras.utils.set_random_seed(0)
rng = np.random.default_rng(0)
x, y = rng.normal(size=(256, 8)).astype("float32"), rng.integers(0, 3, 256)
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(3, activation="softmax")])
model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="sparse_categorical_crossentropy")
synced: list[str] = []
if MODE == "crash":  # die at the commit point, the rename of the temp folder into place
    real_replace = os.replace
    os.replace = lambda src, dst: (
        os.kill(os.getpid(), signal.SIGKILL)
        if os.path.basename(dst).startswith("epoch-")
        else real_replace(src, dst)
    )
if MODE == "fsync":
    real_fsync = os.fsync
    os.fsync = lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), real_fsync(fd))[1]
trained: list[int] = []
seen = keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: trained.append(epoch))
refused = None
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    try:
        mirrorfit.fit(
            model,
            x,
            y,
            batch_size=32,
            epochs=EPOCHS,
            checkpoint_dir=DIR,
            verbose=0,
            callbacks=[seen],
        )
    except ValueError as e:  # mirrorfit's FitError: one line
        refused = str(e)
finite = all(np.isfinite(w).all() and w.any() for w in model.get_weights())
said = [str(w.message) for w in caught if "checkpoint" in str(w.message)]
out = {"trained": trained, "warnings": said, "synced": synced, "finite": bool(finite)}
print(json.dumps({**out, "refused": refused} if refused else out))
