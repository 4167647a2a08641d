"""Run by tests/job/test_evaluate.py: ``python evaluate_runs_driver.py RUNS FOLDER``. In
one fresh interpreter, runs the CLI (``cli.main``) on each argv of RUNS (a JSON object, name:
argv), in order. Prints one JSON line: per name, [exit code, stderr, stdout]; and per
FOLDER/NAME.json of train, ckpt and saved, "NAME.json": its contents (null: not written)."""

import contextlib
import io
import json
import pathlib
import sys

from mirrorfit.cli import main

runs, folder = json.loads(sys.argv[1]), pathlib.Path(sys.argv[2])
results = {}
for name, args in runs.items():
    err, std = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(std):
        rc = main(args)
    results[name] = [rc, err.getvalue(), std.getvalue()]
for name in ("train", "ckpt", "saved"):
    path = folder / f"{name}.json"
    results[name + ".json"] = json.loads(path.read_text()) if path.exists() else None
print(json.dumps(results))
