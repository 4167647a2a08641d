"""Run by tests/artifacts/test_checkpoint.py: ``python cli_runs_driver.py SPEC``. Runs
`mirrorfit train` (cli.main, the console script's function) several times in one fresh
interpreter, with methods patched to raise a signal (or fail) at chosen moments. SPEC is a
JSON object: "runs", a list of argvs; "patches", {name of a patch below: its keyword
arguments}, applied in that order before the first run; "armed", {run index: moment}: run i
fires (once) the moment armed[i] names. Prints one JSON line: each run's exit code and
stderr."""

import contextlib
import io
import json
import os
import signal
import sys
import traceback

import keras

from mirrorfit import cli
from mirrorfit.artifacts import epoch_checkpoint
from mirrorfit.job import keras_job

spec = json.loads(sys.argv[1])
ARMED = {int(i): moment for i, moment in spec["armed"].items()}
fired, current = set(), [0]


def fire_once(moment, sig=signal.SIGTERM, times=1):
    if ARMED.get(current[0]) == moment and current[0] not in fired:
        fired.add(current[0])
        for _ in range(times):
            os.kill(os.getpid(), sig)


class _Moments(keras.callbacks.Callback):
    """Added to every run's callbacks (as --callbacks would add it): ``after_call(step)``
    after each call of steps, ``step`` the optimizer steps done; ``on_validation(epoch)``."""

    after_call, on_validation = [], []

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        step = int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))
        for hook in self.after_call:
            hook(step)

    def on_test_begin(self, logs=None):
        for hook in self.on_validation:
            hook(self.epoch)


real_callbacks = keras_job.user_callbacks
keras_job.user_callbacks = lambda spec: [*real_callbacks(spec), _Moments()]


def at_step(step, sig, times):
    """Moment "step": the first call of steps past ``step``, ``times`` signals ``sig``."""
    _Moments.after_call.append(
        lambda done: fire_once("step", getattr(signal, sig), times) if done >= step else None
    )


def at_steps():
    """Moment "step N": after the call of steps that ends at step N, a SIGTERM."""
    _Moments.after_call.append(lambda done: fire_once(f"step {done}"))


def last_validation():
    """Moment "validation": while the last of 3 epochs validates, a SIGTERM."""
    _Moments.on_validation.append(lambda epoch: fire_once("validation") if epoch == 2 else None)


def last_checkpoint():
    """Moment "checkpoint": as the last of 3 epochs' checkpoint is written, a SIGTERM."""
    real_save = epoch_checkpoint.Saver.save

    def save(self, model, position):
        if position.epoch == 3:
            fire_once("checkpoint")
        return real_save(self, model, position)

    epoch_checkpoint.Saver.save = save


def disk_full():
    """A full disk: run 1 where epoch 2's meta.json reaches the disk (fsync), run 2 in Keras's
    own weights file write (h5py's report of ENOSPC)."""
    import errno

    real_fsync, real_write = os.fsync, keras.Model.save_weights

    def fsync(fd):
        path = os.readlink(f"/proc/self/fd/{fd}")
        if current[0] == 1 and path.endswith("meta.json"):  # epoch 2's, the one it writes
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_fsync(fd)

    def write(self, filepath, *args, **kwargs):
        if current[0] == 2:
            raise OSError(errno.ENOSPC, f"Unable to synchronously create file ({filepath})")
        return real_write(self, filepath, *args, **kwargs)

    os.fsync, keras.Model.save_weights = fsync, write


PATCHES = {p.__name__: p for p in (at_step, at_steps, last_validation, last_checkpoint, disk_full)}
for name, kwargs in spec["patches"].items():
    PATCHES[name](**kwargs)

out = []
for current[0], args in enumerate(spec["runs"]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            code = cli.main(args)
        except BaseException:
            code, _ = "exception", traceback.print_exc()
    out.append({"code": code, "err": err.getvalue()})
print(json.dumps(out))
