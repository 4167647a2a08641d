"""Run by tests/cli/test_cli.py: ``python held_guard_driver.py WORKERS``. A PreemptionGuard told
that ``mirrorfit.fit`` trains on WORKERS processes (whose own handler only records a signal),
then the main thread held in C for 3 s after the signal, as in a parameter-server join whose
workers are gone, or a long call on one process. Several workers: the watchdog ends the process
(exit 75) and says so; one: the call ends, and the process prints "returned" and exits 0 (where
fit would save and exit 75). Prints "held" to stdout before the signal can come."""

import ctypes
import signal
import sys
import time

from mirrorfit.job import preemption
from mirrorfit.job.preemption import PreemptionGuard

preemption.SETUP_GRACE_S = 0.5  # the watchdog's wait, short for the test
libc = ctypes.CDLL(None)
got: list[float] = []
with PreemptionGuard() as guard:
    guard.fitting(workers=int(sys.argv[1]))
    # fit's own: records, acts at a safe point
    signal.signal(signal.SIGTERM, lambda *_: got.append(time.monotonic()))
    print("held", flush=True)
    while not got or time.monotonic() - got[0] < 3:
        libc.usleep(100_000)  # in C: a signal cuts it short, and it is called again
print("returned", flush=True)
