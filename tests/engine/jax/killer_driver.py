"""Run by tests/engine/jax/test_jax_multi_worker.py as a worker task: ``python
killer_driver.py VICTIM STEP SIGNAL ARGS``. `mirrorfit ARGS` on JAX with TensorFlow blocked,
in which worker VICTIM of the first group (MIRRORFIT_LAUNCH_RESTART 0) sends itself SIGNAL
(a name: SIGKILL, SIGTERM) once the call that reached its global step STEP is dispatched
(mirrorfit.fit's loop: before that call's checkpoint): a kill at a known step, not a race
with a poll."""

import json
import os
import signal
import sys

sys.modules["tensorflow"] = None
os.environ["KERAS_BACKEND"] = "jax"

from mirrorfit.fitting.guards import Divergence  # noqa: E402

victim, at, sig = int(sys.argv[1]), int(sys.argv[2]), getattr(signal, sys.argv[3])
first = os.environ.get("MIRRORFIT_LAUNCH_RESTART") == "0"
me = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
real = Divergence.after_call


def after_call(self, runner, epoch, step):
    real(self, runner, epoch, step)
    if first and me == victim and self.steps >= at:  # the first group's steps: global ones
        os.kill(os.getpid(), sig)


Divergence.after_call = after_call

from mirrorfit.cli import run  # noqa: E402

sys.argv = ["mirrorfit", *sys.argv[4:]]
run()
