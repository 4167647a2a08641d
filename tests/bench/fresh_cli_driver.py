"""Run by tests/bench/test_bench_flags.py: ``python fresh_cli_driver.py ARGVS``. In a fresh
interpreter, runs the CLI (``cli.main``) on each argv of ARGVS (a JSON list of lists). Prints
one JSON line: per argv, its exit code, what it printed, and which of TensorFlow and Keras
were loaded by then (sys.modules only grows: the first argv to load one shows it)."""

import contextlib
import io
import json
import sys

from mirrorfit.cli import main

results = []
for argv in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:  # argparse: --help, malformed values
            code = e.code
    results.append(
        {
            "argv": argv,
            "code": code,
            "out": out.getvalue(),
            "err": err.getvalue(),
            "loaded": sorted({"tensorflow", "keras"} & set(sys.modules)),
        }
    )
print(json.dumps(results))
