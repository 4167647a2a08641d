"""Run by tests/test_forkserver.py: ``python forkserver_probe_driver.py CODE [BACKEND]``: prints
a JSON line of what a program sees (argv, folder, a variable, sys.path, __name__, process
group and session, CPUs, umask, the frameworks already imported), sets $KERAS_BACKEND to
BACKEND if given, then exits CODE."""

import json
import os
import sys

loaded = sorted(m for m in ("jax", "keras", "tensorflow") if sys.modules.get(m) is not None)
print("to stderr", file=sys.stderr)
print(
    json.dumps(
        dict(
            argv=sys.argv,
            cwd=os.getcwd(),
            probe=os.environ.get("FORKSERVER_PROBE"),
            path=sys.path,
            main=__name__,
            group=os.getpgid(0),
            session=os.getsid(0),
            cpus=sorted(os.sched_getaffinity(0)),
            umask=os.umask(0o22),
            loaded=loaded,
        )
    )
)
if len(sys.argv) > 2:
    os.environ["KERAS_BACKEND"] = sys.argv[2]
sys.exit(int(sys.argv[1]))
