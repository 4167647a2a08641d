"""Serving through an operator's faults (issue 27), against a real `mirrorfit serve` process: a
base folder that vanishes or empties, a slow copy, clients that hang up mid-body, oversized
request heads, and a config file that changes, breaks or disappears.

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
    entries = "".join(
        f"  config {{ name: '{name}' base_path: '{path}' {more.get(name, '')} }}\n"
        for name, path in models.items()
    )
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
    srv = Server(
        [
            f"--model_config_file={config}",
            "--model_config_file_poll_wait_seconds=0.2",
            f"--file_system_poll_wait_seconds={POLL_S}",
            "--load_retry_interval_micros=60000000",
            f"--monitoring_config_file={model_root / 'monitoring.config'}",
        ],
        root,
    )
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
    return httpx.post(
        f"{server.url}/v1/models/{path}:predict", json={"instances": IMAGE.tolist()}, timeout=30
    )


# ---- item 1: the base folder disappears ---------------------------------------------------------


def _clients(server, stop, counts, failures):
    def rest():
        with httpx.Client(timeout=30) as client:
            while not stop.is_set():
                r = client.post(
                    f"{server.url}/v1/models/mnist:predict", json={"instances": IMAGE.tolist()}
                )
                counts.append(1)
                if r.status_code != 200:
                    failures.append(f"REST {r.status_code} {r.text[:200]}")

    def grpc_client():
        with grpc.insecure_channel(server.grpc_target) as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            request = predict_pb2.PredictRequest()
            request.model_spec.name = "mnist"
            request.inputs["images"].CopyFrom(tf.make_tensor_proto(IMAGE))
            while not stop.is_set():
                try:
                    stub.Predict(request, timeout=30)
                except grpc.RpcError as e:
                    failures.append(f"GRPC {e.code()} {e.details()}")
                counts.append(1)

    return [threading.Thread(target=f) for f in (rest, rest, grpc_client, grpc_client)]


def test_a_renamed_base_folder_keeps_serving(faults):
    base = faults.root / "mnist"
    stop, counts, failures = threading.Event(), [], []
    clients = _clients(faults, stop, counts, failures)
    for c in clients:
        c.start()
    try:
        time.sleep(0.3)
        base.rename(faults.root / "mnist.gone")  # a deploy renames it, an unmount, ...
        time.sleep(15 * POLL_S)
        during = _states(faults, "mnist")
        ready = httpx.get(f"{faults.url}/readyz", timeout=10).status_code
        (faults.root / "mnist.gone").rename(base)
        assert _wait_for(lambda: _states(faults, "mnist") == {1: "AVAILABLE"})
        time.sleep(3 * POLL_S)
    finally:
        stop.set()
        for c in clients:
            c.join()
    assert failures == [] and len(counts) > 20, (len(counts), len(failures), failures[:3])
    assert during == {1: "AVAILABLE"} and ready == 200
    assert _events(faults, "base path readable again", model="mnist")
    [warning] = _events(faults, "poll failed", model="mnist")  # 15 polls: one line (60 s)
    assert warning["level"] == "warning" and warning["path"] == str(base)
    assert warning["error"].startswith("FileNotFoundError") and warning["serving"] == [1]


def test_an_emptied_base_folder_unloads_by_default_and_says_so(faults):
    base = faults.root / "spare"
    (base / "0001").rename(faults.root / "spare-0001")  # the folder stays, its versions go
    try:
        assert _wait_for(lambda: _states(faults, "spare") == {1: "END"})
        [warning] = _events(faults, "no versions", model="spare")
        assert warning["level"] == "warning" and warning["path"] == str(base)
        assert warning["action"].startswith("unloading every version")
    finally:
        (faults.root / "spare-0001").rename(base / "0001")
    assert _wait_for(lambda: _states(faults, "spare") == {1: "AVAILABLE"})


def test_versions_always_present_keeps_an_emptied_folder_serving(model_root, tmp_path):
    base = tmp_path / "m"
    base.mkdir()
    # at start-up with no versions: refused before TensorFlow loads, as TF Serving refuses
    proc = run_cli(
        "serve",
        f"--model_base_path={base}",
        "--servable_versions_always_present",
        without_tensorflow=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert f"model 'default' has no versions under {base}" in proc.stderr
    copy_version(model_root / "mnist" / "0001", base, 1)
    server = Server(
        [
            "--model_name=m",
            f"--model_base_path={base}",
            "--servable_versions_always_present",
            f"--file_system_poll_wait_seconds={POLL_S}",
        ],
        tmp_path,
    )
    try:
        (base / "0001").rename(tmp_path / "0001-aside")
        assert _wait_for(lambda: _events(server, "no versions", model="m"))
        time.sleep(5 * POLL_S)
        assert _predict(server, "m").status_code == 200
        assert _states(server, "m") == {1: "AVAILABLE"}
        assert "--servable_versions_always_present" in _events(server, "no versions")[0]["action"]
    finally:
        server.stop()


# ---- item 2: a version whose copy completes after a failed load ---------------------------------


def _copy(src: Path, dst: Path, names) -> None:
    for name in names:
        if (src / name).is_dir():
            shutil.copytree(src / name, dst / name)
        else:
            shutil.copy2(src / name, dst / name)


def test_a_version_copied_in_place_is_loaded_at_once_when_complete(faults, model_root):
    base, src = faults.root / "mnist", model_root / "mnist" / "0002"
    files = sorted(p.name for p in src.iterdir())
    # As in the issue: the folders first, saved_model.pb last. No load is tried without it.
    (base / "0002").mkdir()
    _copy(src, base / "0002", [n for n in files if n != "saved_model.pb"])
    time.sleep(10 * POLL_S)
    assert not _events(faults, "load failed", model="mnist")
    [waiting] = _events(faults, "no SavedModel", model="mnist")
    assert waiting["versions"] == [2]
    _copy(src, base / "0002", ["saved_model.pb"])
    start = time.monotonic()
    assert _wait_for(lambda: _states(faults, "mnist").get(2) == "AVAILABLE", timeout=20)
    picked_up_s = time.monotonic() - start
    # saved_model.pb first, the variables after: the load fails, and is retried once the folder
    # has changed and settled, not --load_retry_interval_micros (60 s) later
    (base / "0003").mkdir()
    _copy(src, base / "0003", ["saved_model.pb"])
    assert _wait_for(lambda: _events(faults, "load failed", model="mnist", version=3))
    failed_at = time.monotonic()
    _copy(src, base / "0003", [n for n in files if n != "saved_model.pb"])
    assert _wait_for(lambda: _states(faults, "mnist").get(3) == "AVAILABLE", timeout=20)
    retried_s = time.monotonic() - failed_at
    assert picked_up_s < 10 and retried_s < 10, (picked_up_s, retried_s)


# ---- item 3: a client that hangs up mid-body ----------------------------------------------------


def _hang_up(server, expect_continue: bool) -> None:
    sock = socket.create_connection(("127.0.0.1", server.rest_port), timeout=10)
    head = (
        b"POST /v1/models/mnist:predict HTTP/1.1\r\nhost: x\r\n"
        b"content-type: application/json\r\ncontent-length: 1000\r\n"
    )
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
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(line_start))


def test_a_client_hanging_up_mid_body_is_counted_not_an_internal_error(faults):
    cancelled = ':tensorflow:serving:request_count{model_name="mnist",status="CANCELLED"}'
    before = _metric(faults, cancelled)
    for i in range(100):
        _hang_up(faults, expect_continue=i % 2 == 1)
    assert _wait_for(lambda: _metric(faults, cancelled) - before == 100, timeout=10), (
        _metric(faults, cancelled) - before
    )
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
    status, body = _raw(
        faults, b"GET /v1/models/" + b"m" * 70_000 + b" HTTP/1.1\r\nhost: x\r\n\r\n"
    )
    assert status == 414 and "Request URI is longer than" in body["error"]
    status, body = _raw(faults, head + b"x-big: " + b"a" * 60_000 + b"\r\n\r\n")
    assert status == 200 and "model_version_status" in body  # under the cap: served


# ---- item 5: configuration problems -------------------------------------------------------------


def test_the_config_file_is_reloaded_and_a_bad_one_keeps_the_last_good(faults):
    models = {"mnist": str(faults.root / "mnist"), "spare": str(faults.root / "spare")}
    original = faults.config.read_text()
    try:
        # added, with a base path relative to the server's working directory (TF Serving's
        # rule; the config file is in conf/)
        _write(faults.config, _config({**models, "extra": "spare"}))
        assert _wait_for(lambda: _states(faults, "extra") == {1: "AVAILABLE"})
        assert _predict(faults, "extra").status_code == 200
        assert _events(faults, "config reloaded")[-1]["added"] == ["extra"]
        # changed: a label
        _write(
            faults.config,
            _config(
                {**models, "extra": "spare"}, extra="version_labels { key: 'stable' value: 1 }"
            ),
        )
        assert _wait_for(lambda: _predict(faults, "extra/labels/stable").status_code == 200)
        assert _events(faults, "config reloaded")[-1]["changed"] == ["extra"]
        # garbage, then gone: the last good config keeps serving, each problem told once
        _write(faults.config, "model_config_list { config { nam")
        time.sleep(1.0)
        faults.config.unlink()
        time.sleep(1.0)
        assert _predict(faults, "extra/labels/stable").status_code == 200
        problems = _events(faults, "config not reloaded")
        assert [p["level"] for p in problems] == ["warning", "warning"]
        assert "not valid text format" in problems[0]["error"]
        assert "cannot read it" in problems[1]["error"]
        # removed
        _write(faults.config, _config(models))
        assert _wait_for(lambda: _predict(faults, "extra").status_code == 404)
        assert "Servable not found for request: Latest(extra)" in _predict(faults, "extra").text
        assert _events(faults, "config reloaded")[-1]["removed"] == ["extra"]
    finally:
        _write(faults.config, original)


def test_base_paths_without_versions_are_logged_once(faults, tmp_path):
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    models = {
        "mnist": str(faults.root / "mnist"),
        "spare": str(faults.root / "spare"),
        "etc": "/etc",
        "loop": str(loop),
        "procfs": "/proc",
    }
    original = faults.config.read_text()
    try:
        _write(faults.config, _config(models))
        assert _wait_for(lambda: _events(faults, "no SavedModel", model="procfs"))
        new_process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3)"])
        time.sleep(10 * POLL_S)
        new_process.kill()
        new_process.wait()
        [etc] = _events(faults, "no versions", model="etc")
        assert etc["level"] == "warning" and etc["path"] == "/etc"
        [loop_warning] = _events(faults, "poll failed", model="loop")
        assert "Too many levels of symbolic links" in loop_warning["error"]
        # /proc: every process folder is a version name without a SavedModel: not loaded,
        # one line for all of them, none more for a new process within the minute
        assert _events(faults, "load failed", model="procfs") == []
        [procfs] = _events(faults, "no SavedModel", model="procfs")
        assert procfs["count"] > 1 and procfs["path"] == "/proc"
        for model in ("etc", "loop", "procfs"):
            r = httpx.get(f"{faults.url}/v1/models/{model}", timeout=10)
            assert r.status_code == 404, r.text  # no status entries
    finally:
        _write(faults.config, original)
    assert _wait_for(lambda: httpx.get(f"{faults.url}/readyz", timeout=10).status_code == 200)
