"""Run by tests/engine/jax/test_jax_runner.py: ``python sigterm_runs_driver.py RUNS ARMED``.
Runs `mirrorfit train` (cli.main) on each argv of RUNS (a JSON list) in one interpreter, on
JAX with TensorFlow blocked; run i gets a SIGTERM (once) after the step hook of the step
ARMED[i] names (ARMED: a JSON object, run index: step). Prints one JSON line: each run's exit
code and stderr."""

import json
import os
import sys

sys.modules["tensorflow"] = None
os.environ["KERAS_BACKEND"] = "jax"

import contextlib  # noqa: E402
import io  # noqa: E402
import signal  # noqa: E402
import traceback  # noqa: E402

from mirrorfit import cli  # noqa: E402
from mirrorfit.artifacts.checkpoint import Checkpointer  # noqa: E402

RUNS = json.loads(sys.argv[1])
ARMED = {int(i): step for i, step in json.loads(sys.argv[2]).items()}
fired, current = set(), [0]
real_hook = Checkpointer.step_hook


def step_hook(self, trainer):
    real_hook(self, trainer)
    if ARMED.get(current[0]) == trainer.step and current[0] not in fired:
        fired.add(current[0])
        os.kill(os.getpid(), signal.SIGTERM)


Checkpointer.step_hook = step_hook
out = []
for current[0], args in enumerate(RUNS):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            code = cli.main(args)
        except BaseException:
            code, _ = "exception", traceback.print_exc()
    out.append({"code": code, "err": err.getvalue()})
print(json.dumps(out))
