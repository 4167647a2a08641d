"""Run by tests/cli/test_cli.py: ``python left_guard_driver.py``. A SIGTERM stops a
PreemptionGuard before training started (its watchdog waits 0.5 s here); the process then
lives on past the watchdog's wait. Prints one JSON line: what the guard said."""

import json
import os
import signal
import time

from mirrorfit.job import preemption
from mirrorfit.job.preemption import Preempted, PreemptionGuard

preemption.SETUP_GRACE_S = 0.5  # the watchdog's wait, short for the test
try:
    with PreemptionGuard():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1)
except Preempted as e:
    stopped = str(e)
time.sleep(1.5)
print(json.dumps({"stopped": stopped}))
