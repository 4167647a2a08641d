"""Run by tests/test_preloaded.py: ``python preloaded_probe_driver.py CODE [BACKEND]``: prints
a JSON line of what a program sees (argv, cwd, a variable, sys.path[0], __name__), sets
$KERAS_BACKEND to BACKEND if given, then exits CODE."""

import json
import os
import sys

print("to stderr", file=sys.stderr)
print(
    json.dumps(
        dict(
            argv=sys.argv,
            cwd=os.getcwd(),
            probe=os.environ.get("PRELOADED_PROBE"),
            path0=sys.path[0],
            main=__name__,
        )
    )
)
if len(sys.argv) > 2:
    os.environ["KERAS_BACKEND"] = sys.argv[2]
sys.exit(int(sys.argv[1]))
