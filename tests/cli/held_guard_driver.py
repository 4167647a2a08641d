"""Run by tests/cli/test_cli.py: ``python held_guard_driver.py``. A PreemptionGuard told that
``mirrorfit.fit`` trains (whose own handler only records a signal), then the main thread held
in C, as in a parameter-server join whose workers are gone: the watchdog ends the process
(exit 75) and says so. Prints "held" to stdout before the signal can come."""

import ctypes
import signal

from mirrorfit.job import preemption
from mirrorfit.job.preemption import PreemptionGuard

preemption.SETUP_GRACE_S = 0.5  # the watchdog's wait, short for the test
libc = ctypes.CDLL(None)
with PreemptionGuard() as guard:
    guard.fitting()
    signal.signal(signal.SIGTERM, lambda *_: None)  # fit's own: records, acts at a safe point
    print("held", flush=True)
    while True:
        libc.sleep(10)  # in C: a signal cuts it short, and it is called again
