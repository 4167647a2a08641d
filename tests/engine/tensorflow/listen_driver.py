"""Run by tests/engine/tensorflow/test_multi_worker.py: ``python listen_driver.py WORKER PS``
(two host:port addresses). Starts a one-worker multi-worker strategy's server on WORKER and a
parameter-server task's server on PS. Prints one JSON line: for each of the two ports, the
local addresses of the sockets listening on it."""

import ipaddress
import json
import sys
from pathlib import Path

from mirrorfit.distribute.cluster import Cluster
from mirrorfit.engine.tensorflow.devices import configure_devices
from mirrorfit.engine.tensorflow.strategy import build_distribution
from mirrorfit.engine.tensorflow.parameter_server import start_server


def listening(port: int) -> list[str]:
    """The local addresses of the sockets listening on ``port`` (/proc/net/tcp and tcp6)."""
    found = []
    for name in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{name}").read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            host, _, hexport = local.partition(":")
            if state == "0A" and int(hexport, 16) == port:
                raw = bytes.fromhex(host)
                # the kernel writes each 32-bit word in host (little-endian) order
                raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
                ip = ipaddress.ip_address(raw)
                found.append(str(getattr(ip, "ipv4_mapped", None) or ip))  # ::ffff:a.b.c.d
    return found


workers = sys.argv[1:3]
one = Cluster(workers=(workers[0],))
build_distribution(configure_devices(replicas=1), kind="multi-worker", cluster=one)
ps = Cluster(workers=("127.0.0.1:1",), ps=(workers[1],), chief="127.0.0.1:2", task_type="ps")
start_server(ps)
print(json.dumps([listening(int(a.rpartition(":")[2])) for a in workers]))
