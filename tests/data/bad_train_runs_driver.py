"""Run by tests/data/test_files_cli.py: ``python bad_train_runs_driver.py CASES``. In one
fresh interpreter, runs `mirrorfit train --epochs 1 --global-batch-size 10 --no-progress ARGS`
(``cli.main``) for each case of CASES (a JSON object, name: ARGS). Prints one JSON line: per
case, [exit code, stderr]."""

import contextlib
import io
import json
import sys

from mirrorfit.cli import main

results = {}
for name, args in json.loads(sys.argv[1]).items():
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = main(["train", "--epochs", "1", "--global-batch-size", "10", "--no-progress", *args])
    results[name] = [rc, err.getvalue()]
print(json.dumps(results))
