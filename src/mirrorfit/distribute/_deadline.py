"""A deadline for waits inside TensorFlow's C++ that hold the GIL (no Python thread or signal
handler runs during them): a tiny watchdog process ends this one with a message.
(why: docs/architecture.md#a-worker-that-never-joins)
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from typing import Iterator, Sequence

# The watchdog: waits for its stdin to close (the block finished) or the deadline; at the
# deadline it names the peers whose port refuses a connection, and kills the waiting process.
_WATCHDOG = r"""
import os, select, signal, socket, sys
parent, timeout, text = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
peers = sys.argv[4:]  # "name=host:port"
ready, _, _ = select.select([sys.stdin], [], [], timeout)
if ready:
    sys.exit(0)
gone = []
for peer in peers:
    name, _, address = peer.partition("=")
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=2).close()
    except OSError:
        gone.append(f"{name} ({address})")
who = ", ".join(gone) or "a worker"
os.write(2, f"mirrorfit: error: {who} {text}\n".encode())
os.kill(parent, signal.SIGKILL)
"""


@contextlib.contextmanager
def deadline(timeout_s: float, text: str, peers: Sequence[tuple[str, str]]) -> Iterator[None]:
    """Kill this process (SIGKILL, exit 137) with ``mirrorfit: error: <who> <text>`` if the
    block still runs after ``timeout_s`` seconds; ``who`` names the ``peers`` ((name,
    "host:port") pairs) whose port refuses connections then."""
    import os

    watchdog = subprocess.Popen(
        [
            sys.executable,
            "-c",
            _WATCHDOG,
            str(os.getpid()),
            str(timeout_s),
            text,
            *(f"{name}={address}" for name, address in peers),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
    )
    try:
        yield
    finally:
        watchdog.stdin.close()
        watchdog.wait()
