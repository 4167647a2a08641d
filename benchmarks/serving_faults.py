"""An operator's fault under load, by hand (issue 27): N keep-alive REST clients call predict
on `mirrorfit serve` while the model's base folder is renamed away for S seconds and back
(`--fault rename`), or its version folders are moved out and back (`--fault empty`). Prints
the requests sent and failed before, during and after the fault, and the server's log lines
above info.

    python benchmarks/serving_faults.py [--fault rename|empty] [--clients 32] [--seconds 10]
                                        [--server-flags "--servable_versions_always_present"]

The server polls its folders every second (TF Serving's default), as in the issue's report.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serving_load import _free_port, _image  # noqa: E402 - this folder's sibling

SETTLE_S = 3.0  # load before the fault and after it is undone


async def _client(
    host: str, port: int, request: bytes, stop: asyncio.Event, results: list[tuple[float, int]]
) -> None:
    """One keep-alive connection, one request in flight: (time sent, HTTP status or 0)."""
    reader = writer = None
    while not stop.is_set():
        t0 = time.monotonic()
        try:
            if writer is None:
                reader, writer = await asyncio.open_connection(host, port)
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            )
            await reader.readexactly(length)
            status = int(head.split(b" ", 2)[1])
            if b"connection: close" in head.lower():
                writer.close()
                writer = None
        except (OSError, asyncio.IncompleteReadError, StopIteration):
            status, writer = 0, None
        results.append((t0, status))
    if writer is not None:
        writer.close()


async def _load(url: str, clients: int, fault, undo, seconds: float):
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps({"instances": _image().tolist()}).encode()
    request = (
        f"POST /v1/models/mnist:predict HTTP/1.1\r\nHost: {host}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    stop, results = asyncio.Event(), []
    tasks = [
        asyncio.create_task(_client(host, int(port), request, stop, results))
        for _ in range(clients)
    ]
    await asyncio.sleep(SETTLE_S)
    window = [time.monotonic()]
    fault()
    await asyncio.sleep(seconds)
    undo()
    window.append(time.monotonic())
    await asyncio.sleep(SETTLE_S)
    stop.set()
    await asyncio.gather(*tasks)
    return results, window


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fault", choices=["rename", "empty"], default="rename")
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--seconds", type=float, default=10)
    p.add_argument("--server-flags", default="", help="extra `mirrorfit serve` flags")
    a = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="mirrorfit-faults-"))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from pathlib import Path; "
            f"sys.path.insert(0, {str(Path(__file__).parent)!r}); import serving_load; "
            f"serving_load.export_models(Path({str(root)!r}), ['mlp'])",
        ],
        check=True,
        env=env,
        capture_output=True,
    )
    base = root / "mlp"
    rest, log = _free_port(), root / "server.log"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mirrorfit.cli",
            "serve",
            f"--port={_free_port()}",
            f"--rest_api_port={rest}",
            "--model_name=mnist",
            f"--model_base_path={base}",
            *a.server_flags.split(),
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(log, "w"),
        env=env,
    )
    url = f"http://127.0.0.1:{rest}"
    import httpx

    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            sys.exit(f"server did not start:\n{log.read_text()[-3000:]}")
        time.sleep(0.3)
    version = next(base.iterdir())
    if a.fault == "rename":  # a deploy that renames the folder, an unmount, ...

        def fault():
            base.rename(root / "mlp.gone")

        def undo():
            (root / "mlp.gone").rename(base)
    else:  # the folder stays, its versions go

        def fault():
            version.rename(root / version.name)

        def undo():
            (root / version.name).rename(version)

    try:
        results, (start, end) = asyncio.run(_load(url, a.clients, fault, undo, a.seconds))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    print(
        f"{a.clients} REST clients, --fault {a.fault} for {a.seconds:g} s, server flags: "
        f"{a.server_flags or '-'}"
    )
    for name, keep in (
        ("before", lambda t: t < start),
        ("during", lambda t: start <= t < end),
        ("after", lambda t: t >= end),
    ):
        statuses = Counter(status for t, status in results if keep(t))
        sent, ok = sum(statuses.values()), statuses.pop(200, 0)
        print(
            f"  {name:6}: {sent:6} requests sent, {sent - ok:6} failed "
            f"{dict(statuses) if statuses else ''}"
        )
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    above_info = Counter((e["level"], e["event"]) for e in lines if e["level"] != "info")
    print(f"  server log above info: {dict(above_info) or 'none'}")
    for e in lines:
        if e["level"] != "info":
            print(f"    {json.dumps(e)[:300]}")
            break


if __name__ == "__main__":
    main()
