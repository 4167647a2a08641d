"""Run by tests/artifacts/test_checkpoint.py: ``python crash_save_driver.py FOLDER MODE``, on
FOLDER holding a checkpoint of the MLP (Adam, 256 MNIST examples, global batch 32). MODE
``first``: trains one epoch and saves it (the checkpoint the others start from). MODE
``crash``: resumes, trains one more epoch and SIGKILLs itself at the save's commit point (the
rename). MODE ``restore``: restores the newest checkpoint and prints one JSON line: its step
and epoch, and whether the weights came back (not all zero)."""

import json
import os
import signal
import sys

import keras

import mirrorfit
from mirrorfit.artifacts.checkpoint import Checkpointer

folder, mode = sys.argv[1], sys.argv[2]
setup = mirrorfit.configure_devices(replicas=1)
strategy = mirrorfit.build_strategy(setup)
data = mirrorfit.load_mnist(train_examples=256, download=False)
trainer = mirrorfit.Trainer(
    strategy=strategy,
    model=mirrorfit.models.mlp,
    optimizer=keras.optimizers.Adam(1e-3),
    loss=keras.losses.SparseCategoricalCrossentropy(),
    global_batch=32,
)
ckpt = Checkpointer(folder, trainer=trainer, model_spec="mlp")
if mode == "first":
    trainer.fit(
        mirrorfit.train_batches(data.x_train, data.y_train, global_batch=32, seed=0), epochs=1
    )
    ckpt.save()
elif mode == "crash":
    ckpt.restore_latest()
    trainer.fit(
        mirrorfit.train_batches(data.x_train, data.y_train, global_batch=32, seed=0),
        epochs=trainer.epoch + 1,
    )
    os.rename = lambda *a: os.kill(os.getpid(), signal.SIGKILL)  # die at the commit point
    ckpt.save()
else:
    restored = ckpt.restore_latest()
    weights_ok = bool(trainer.model.get_weights()[0].any())
    print(
        json.dumps(
            {
                "step": restored and restored.step,
                "epoch": restored and restored.epoch,
                "ok": weights_ok,
            }
        )
    )
