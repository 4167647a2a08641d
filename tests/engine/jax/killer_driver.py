"""Run by tests/engine/jax/test_jax_multi_worker.py as a worker task: ``python
killer_driver.py VICTIM STEP SIGNAL ARGS``. `mirrorfit ARGS` on JAX with TensorFlow blocked,
in which worker VICTIM of the first group (MIRRORFIT_LAUNCH_RESTART 0) sends itself SIGNAL
(a name: SIGKILL, SIGTERM) at the step hook of step STEP (after the checkpoint hook): a kill
at a known step, not a race with a poll."""

import json
import os
import signal
import sys

sys.modules["tensorflow"] = None
os.environ["KERAS_BACKEND"] = "jax"

from mirrorfit.artifacts.checkpoint import Checkpointer  # noqa: E402

victim, at, sig = int(sys.argv[1]), int(sys.argv[2]), getattr(signal, sys.argv[3])
first = os.environ.get("MIRRORFIT_LAUNCH_RESTART") == "0"
me = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
real = Checkpointer.step_hook


def step_hook(self, trainer):
    real(self, trainer)
    if first and me == victim and trainer.step >= at:
        os.kill(os.getpid(), sig)


Checkpointer.step_hook = step_hook

from mirrorfit.cli import run  # noqa: E402

sys.argv = ["mirrorfit", *sys.argv[4:]]
run()
