"""Serving through an operator's faults (issue 27), against a real `mirrorfit serve` process:
clients that hang up mid-body, and oversized request heads.

One server for the module polls fast (0.1 s; the config file every 0.2 s) and keeps TF
Serving's default 60 s between load retries, so a version picked up in seconds was not waiting
for a retry.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from conftest import run_cli
from serving_support import Server, copy_version, model_root  # noqa: F401 (fixture)

pytestmark = pytest.mark.slow
IMAGE = np.linspace(0, 1, 784, dtype=np.float32).reshape(1, 28, 28)
POLL_S = 0.1


def _config(models: dict[str, str], **more: str) -> str:
    """A ModelServerConfig text: name -> base path, and name -> more fields."""
    entries = "".join(f"  config {{ name: '{name}' base_path: '{path}' {more.get(name, '')} }}\n"
                      for name, path in models.items())
    return f"model_config_list {{\n{entries}}}\n"


def _write(path: Path, text: str) -> None:
    """Replace a file whole, as a config deploy should: a reader never sees half of it."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


@pytest.fixture(scope="module")
def faults(model_root, tmp_path_factory):
    root = tmp_path_factory.mktemp("faults")
    for name in ("mnist", "spare"):
        copy_version(model_root / "mnist" / "0001", root / name, 1)
    (root / "conf").mkdir()
    config = root / "conf" / "models.config"
    _write(config, _config({"mnist": str(root / "mnist"), "spare": str(root / "spare")}))
    srv = Server([f"--model_config_file={config}", "--model_config_file_poll_wait_seconds=0.2",
                  f"--file_system_poll_wait_seconds={POLL_S}",
                  "--load_retry_interval_micros=60000000",
                  f"--monitoring_config_file={model_root / 'monitoring.config'}"], root)
    srv.root, srv.config = root, config
    yield srv
    srv.stop()


def _events(server, event: str, **fields) -> list[dict]:
    out = []
    for line in server.log.read_text().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("event") == event and all(entry.get(k) == v for k, v in fields.items()):
            out.append(entry)
    return out


def _states(server, model: str) -> dict[int, str]:
    r = httpx.get(f"{server.url}/v1/models/{model}", timeout=10)
    if r.status_code != 200:
        return {}
    return {int(s["version"]): s["state"] for s in r.json()["model_version_status"]}


def _wait_for(predicate, timeout: float = 15) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def _predict(server, path: str = "mnist") -> httpx.Response:
    return httpx.post(f"{server.url}/v1/models/{path}:predict",
                      json={"instances": IMAGE.tolist()}, timeout=30)


# ---- item 3: a client that hangs up mid-body ----------------------------------------------------

def _hang_up(server, expect_continue: bool) -> None:
    sock = socket.create_connection(("127.0.0.1", server.rest_port), timeout=10)
    head = (b"POST /v1/models/mnist:predict HTTP/1.1\r\nhost: x\r\n"
            b"content-type: application/json\r\ncontent-length: 1000\r\n")
    if expect_continue:
        sock.sendall(head + b"expect: 100-continue\r\n\r\n")
        assert sock.recv(100).startswith(b"HTTP/1.1 100")
    else:
        sock.sendall(head + b"\r\n")
    sock.sendall(b'{"instances": [[')  # part of the body, then gone
    time.sleep(0.01)
    sock.close()


def _metric(server, line_start: str) -> float:
    text = httpx.get(f"{server.url}/monitoring/prometheus/metrics", timeout=10).text
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith(line_start))


def test_a_client_hanging_up_mid_body_is_counted_not_an_internal_error(faults):
    cancelled = ':tensorflow:serving:request_count{model_name="mnist",status="CANCELLED"}'
    before = _metric(faults, cancelled)
    for i in range(100):
        _hang_up(faults, expect_continue=i % 2 == 1)
    assert _wait_for(lambda: _metric(faults, cancelled) - before == 100, timeout=10), \
        _metric(faults, cancelled) - before
    assert _events(faults, "internal error") == []
    lines = _events(faults, "client disconnected")
    assert len(lines) == 1 and lines[0]["level"] == "info"  # one per minute at most
    assert _predict(faults).status_code == 200


# ---- item 4: the request-head cap ---------------------------------------------------------------

def _raw(server, head: bytes) -> tuple[int, dict]:
    with socket.create_connection(("127.0.0.1", server.rest_port), timeout=10) as sock:
        sock.sendall(head)  # all of it at once: one read on the server's side
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    status, _, body = data.partition(b"\r\n\r\n")
    return int(status.split()[1]), json.loads(body)


def test_the_whole_request_head_counts_toward_its_cap(faults):
    head = b"GET /v1/models/mnist HTTP/1.1\r\nhost: x\r\nconnection: close\r\n"
    status, body = _raw(faults, head + b"x-big: " + b"a" * 100_000 + b"\r\n\r\n")
    assert status == 431 and "Request head is larger than 65536 bytes" in body["error"]
    many = b"".join(b"x-h%04d: %s\r\n" % (i, b"a" * 12) for i in range(3500))  # 77 KB
    assert _raw(faults, head + many + b"\r\n")[0] == 431
    status, body = _raw(faults, b"GET /v1/models/" + b"m" * 70_000
                        + b" HTTP/1.1\r\nhost: x\r\n\r\n")
    assert status == 414 and "Request URI is longer than" in body["error"]
    status, body = _raw(faults, head + b"x-big: " + b"a" * 60_000 + b"\r\n\r\n")
    assert status == 200 and "model_version_status" in body  # under the cap: served
