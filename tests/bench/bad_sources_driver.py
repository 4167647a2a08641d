"""Run by tests/bench/test_bench_sources.py: ``python bad_sources_driver.py CASES OUT EMPTY``.
In one fresh interpreter, runs `mirrorfit bench --out OUT --replicas 1 --precision fp32 ARGS`
(``cli.main``) for each case of CASES (a JSON object, name: ARGS) in order; starting a
point's process fails the case (AssertionError). ARGS ``["--env"]`` runs with no flag and
$MIRRORFIT_DATA and $KERAS_HOME set to the folder EMPTY (nothing where the program looks for
MNIST). Prints one JSON line: per case, [exit code, stderr, whether TensorFlow was loaded by
then]."""

import contextlib
import io
import json
import os
import subprocess
import sys

from mirrorfit.cli import main

cases, out, empty = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
real_run = subprocess.run


def spawned(command, *args, **kwargs):
    if "mirrorfit.bench.point" in command:  # (TF itself runs `uname -p`)
        raise AssertionError(f"a point's process was started: {command}")
    return real_run(command, *args, **kwargs)


subprocess.run = spawned
results = {}
for name, args in cases.items():
    if args == ["--env"]:  # no --data-dir: nothing where the program looks for MNIST
        args = []
        saved = dict(os.environ)
        os.environ.update(MIRRORFIT_DATA=empty, KERAS_HOME=empty)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(["bench", "--out", out, "--replicas", "1", "--precision", "fp32", *args])
    if name == "no mnist":
        os.environ.clear()
        os.environ.update(saved)
    results[name] = [rc, err.getvalue(), "tensorflow" in sys.modules]
print(json.dumps(results))
