"""``mirrorfit.fit(checkpoint_dir=D, checkpoint_every=N)`` stopped by SIGTERM inside an epoch,
then run again: the run a Keras script's user reruns after a preemption. Run as ``python
preempt.py BACKEND DIR MODE [SHARD]`` (SHARD: ``mirrorfit.setup``'s, default none; not none:
a first layer wide enough to split, its checkpoints Orbax's), MODE one of:

- ``whole``: 3 epochs uninterrupted, shuffled; weights to DIR/whole-W.npz;
- ``stopped``: the same into DIR/ckpt, SIGTERM sent to this process after step 10 of epoch 2
  (5 calls of 2 steps in); ``mirrorfit.Preempted`` expected: DIR/stopped-W.json;
- ``resumed``: the same call again (no signal): its History and weights, DIR/resumed-W.*.

Alone: 2 replicas on this process. Under ``mirrorfit launch --workers 2``: one replica each,
and only worker 1 is signalled (every worker must stop at the same step, and the chief save).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import numpy as np

import mirrorfit

BACKEND, DIR, MODE = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
SHARD = sys.argv[4] if len(sys.argv) > 4 else "none"
JOINED = bool(os.environ.get("TF_CONFIG"))
chosen = mirrorfit.setup(
    backend=BACKEND,
    shard=SHARD,
    **({"strategy": "multi-worker"} if JOINED else {"replicas": 2}),
)
import keras  # noqa: E402

W = chosen.distribution.worker_index if JOINED else 0
rng = np.random.default_rng(0)
x = rng.normal(size=(320, 8)).astype("float32")
y = (x @ rng.normal(size=(8, 1))).astype("float32")


class SignalAt(keras.callbacks.Callback):
    """SIGTERM to this process at the end of batch ``step`` of ``epoch`` (0-based) in
    ``stopped`` mode (on worker 1 alone when launched); nothing otherwise."""

    def __init__(self, epoch, step):
        super().__init__()
        self.at, self.epoch = (epoch, step), None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        armed = MODE == "stopped" and (not JOINED or W == 1)
        if armed and (self.epoch, batch + 1) == self.at:
            os.kill(os.getpid(), signal.SIGTERM)


keras.utils.set_random_seed(7)
model = keras.Sequential(
    [
        keras.Input((8,)),
        keras.layers.Dense(16 if SHARD == "none" else 128, activation="relu"),
        keras.layers.Dropout(0.2),  # its seed generator's state is in the checkpoint too
        keras.layers.Dense(1),
    ]
)
model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse", metrics=["mae"])
kwargs = dict(
    batch_size=16,
    epochs=3,
    verbose=0,
    shuffle=True,
    steps_per_execution=2,
    # a schedule of the current rate, as keras.io writes them: on 5cdf61e a resume inside
    # epoch 2 halved its rate twice (the checkpoint's rate had been halved already)
    callbacks=[SignalAt(1, 10), keras.callbacks.LearningRateScheduler(lambda e, lr: lr * 0.5)],
)
if MODE != "whole":
    kwargs.update(checkpoint_dir=DIR / "ckpt", checkpoint_every=4)
out: dict = {}
try:
    history = mirrorfit.fit(model, x, y, **kwargs)
    out["history"] = history.history
except mirrorfit.Preempted as e:
    out["preempted"] = str(e)
out["checkpoints"] = sorted(p.name for p in (DIR / "ckpt").glob("epoch-*"))
out["files"] = sorted(  # the newest checkpoint's
    p.name for p in (sorted((DIR / "ckpt").glob("epoch-*")) or [DIR])[-1].iterdir()
)
np.savez(DIR / f"{MODE}-{W}.npz", *model.get_weights())
(DIR / f"{MODE}-{W}.json").write_text(json.dumps(out))
