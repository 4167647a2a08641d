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

from mirrorfit import cli
from mirrorfit.artifacts.checkpoint import Checkpointer
from mirrorfit.engine.controller import Trainer

spec = json.loads(sys.argv[1])
ARMED = {int(i): moment for i, moment in spec["armed"].items()}
fired, current = set(), [0]


def fire_once(moment, sig=signal.SIGTERM, times=1):
    if ARMED.get(current[0]) == moment and current[0] not in fired:
        fired.add(current[0])
        for _ in range(times):
            os.kill(os.getpid(), sig)


def at_step(step, sig, times):
    """Moment "step": the first step past ``step``, ``times`` signals ``sig`` ("SIGINT")."""
    real_hook = Checkpointer.step_hook

    def step_hook(self, trainer):
        real_hook(self, trainer)
        if trainer.step >= step:
            fire_once("step", getattr(signal, sig), times)

    Checkpointer.step_hook = step_hook


def at_steps():
    """Moment "step N": after step N's hook, a SIGTERM."""
    real_hook = Checkpointer.step_hook

    def step_hook(self, trainer):
        real_hook(self, trainer)
        fire_once(f"step {trainer.step}")

    Checkpointer.step_hook = step_hook


def last_validation():
    """Moment "validation": while the last of 3 epochs validates, a SIGTERM."""
    real_evaluate = Trainer.evaluate

    def evaluate(self, data, batch_size=None):
        if self.epoch == 2:  # epochs done: 2 of 3, so this is epoch 3's validation
            fire_once("validation")
        return real_evaluate(self, data, batch_size)

    Trainer.evaluate = evaluate


def last_checkpoint():
    """Moment "checkpoint": as the last of 3 epochs' checkpoint is written, a SIGTERM."""
    real_save = Checkpointer.save

    def save(self):
        if self.trainer.epoch == 3:
            fire_once("checkpoint")
        return real_save(self)

    Checkpointer.save = save


def disk_full():
    """A full disk: run 1 where checkpoint 16's meta.json reaches the disk (fsync), run 2 in
    TensorFlow's own checkpoint write (its report of ENOSPC)."""
    import errno

    import tensorflow as tf

    real_fsync, real_write = os.fsync, tf.train.Checkpoint.write

    def fsync(fd):
        path = os.readlink(f"/proc/self/fd/{fd}")
        if current[0] == 1 and path.endswith("meta.json") and "000000016" in path:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_fsync(fd)

    def write(self, prefix, options=None):
        if current[0] == 2:
            raise tf.errors.ResourceExhaustedError(None, None, prefix + "; No space left on device")
        return real_write(self, prefix, options)

    os.fsync, tf.train.Checkpoint.write = fsync, write


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
