"""Run by tests/distribute/test_launch.py as each of many tasks `mirrorfit launch` starts:
``python hold_output_driver.py FOLDER``. Ignores SIGTERM and leaves a child in a session of
its own (out of reach of the group kill) holding the task's output open; writes
FOLDER/PID.held (the child's pid), then sleeps."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen(["sleep", "60"], start_new_session=True)  # keeps the pipes
Path(sys.argv[1], f"{os.getpid()}.held").write_text(str(child.pid))
time.sleep(60)
