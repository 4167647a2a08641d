"""Run by tests/engine/jax/test_jax_train.py: ``python sigterm_runs_driver.py RUNS ARMED``.
Runs `mirrorfit train` (cli.main) on each argv of RUNS (a JSON list) in one interpreter, on
JAX with TensorFlow blocked; run i gets a SIGTERM (once) after the call of steps that ends
at the optimizer step ARMED[i] names (ARMED: a JSON object, run index: step). Prints one
JSON line: each run's exit code and stderr."""

import json
import os
import sys

sys.modules["tensorflow"] = None
os.environ["KERAS_BACKEND"] = "jax"

import contextlib  # noqa: E402
import io  # noqa: E402
import signal  # noqa: E402
import traceback  # noqa: E402

import keras  # noqa: E402

from mirrorfit import cli  # noqa: E402
from mirrorfit.job import keras_job  # noqa: E402

RUNS = json.loads(sys.argv[1])
ARMED = {int(i): step for i, step in json.loads(sys.argv[2]).items()}
fired, current = set(), [0]


class SignalAt(keras.callbacks.Callback):
    """After the call of steps that ends at the armed optimizer step, a SIGTERM (once)."""

    def on_train_batch_end(self, batch, logs=None):
        step = int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))
        if ARMED.get(current[0]) == step and current[0] not in fired:
            fired.add(current[0])
            os.kill(os.getpid(), signal.SIGTERM)


real_callbacks = keras_job.user_callbacks  # every run's, as --callbacks would add it
keras_job.user_callbacks = lambda spec: [*real_callbacks(spec), SignalAt()]
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
