"""Run by tests/distribute/test_launch.py as the task `mirrorfit launch` starts (no
TensorFlow): ``python launch_task_driver.py MODE FOLDER [EXTRA]``. One script, several
behaviours (MODE); FOLDER is for marker and pid files. Each task life prints its TF_CONFIG
and restart count first."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

config = json.loads(os.environ["TF_CONFIG"])
task, workers = config["task"], len(config["cluster"]["worker"])
name = "chief" if task["type"] == "chief" else f"{task['type']}{task['index']}"
mode, d = sys.argv[1], Path(sys.argv[2])
life = os.environ["MIRRORFIT_LAUNCH_RESTART"]
print("TF_CONFIG", os.environ["TF_CONFIG"], "RESTART", life)


def wait_for(*names, timeout=15):
    end = time.monotonic() + timeout
    while not all((d / n).exists() for n in names):
        if time.monotonic() > end:
            sys.exit(99)
        time.sleep(0.02)


def die_once():  # SIGKILL itself the first time only
    marker = d / f"{name}.died"
    if not marker.exists():
        marker.touch()
        os.kill(os.getpid(), signal.SIGKILL)


if mode == "output":
    sys.stdout.write("step 1/3\rstep 2/3\rstep 3/3\r\n")
    print(f"to stderr from {name}", file=sys.stderr)
    (d / name).touch()
    if name == "worker0" and workers > 1:
        wait_for("worker1")
elif mode == "group-restart":
    if name == "worker1":
        die_once()
        (d / "worker1.back").touch()
    else:
        wait_for("worker1.back")
elif mode == "always-fail":
    if name == "worker1":
        sys.exit(int(sys.argv[3]))
    time.sleep(30)
elif mode == "refused-late":  # worker 0 refuses a flag, tearing down for a second; worker 1,
    # having lost it, exits first with a peer's failure (69)
    if name == "worker1":
        sys.exit(69)
    time.sleep(1)
    sys.exit(2)
elif mode == "ps":
    (d / name).touch()
    if name == "chief":
        wait_for("worker0", "worker1", "ps0")
        sys.exit(5)
    time.sleep(30)  # workers and ps serve until stopped
elif mode == "ps-worker-restart":
    if name == "worker1":
        die_once()
        (d / "worker1.back").touch()
    if name == "chief":
        wait_for("worker1.back")
    else:
        time.sleep(30)
elif mode == "cpus":
    print("CPUS", sorted(os.sched_getaffinity(0)))
elif mode == "sigterm":
    (d / f"{name}.pid").write_text(str(os.getpid()))
    if name == "worker0":
        signal.signal(signal.SIGTERM, lambda *a: (print("chief got SIGTERM"), sys.exit(75)))
    else:  # ignores SIGTERM (needs the SIGKILL) and has a child of its own
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        child = subprocess.Popen(["sleep", "60"])
        (d / "grandchild.pid").write_text(str(child.pid))
    (d / f"{name}.ready").touch()
    time.sleep(60)
