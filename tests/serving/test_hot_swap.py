"""serving.repository under load: a new version dropped in takes over with zero failed
requests; a broken version shows in the status and never takes traffic."""

import threading
import time

import grpc
import httpx
import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from serving_support import Server, copy_version, model_root  # noqa: F401 (fixture)

pytestmark = pytest.mark.slow
IMAGE = np.linspace(0, 1, 784, dtype=np.float32).reshape(1, 28, 28)


def _rest_client(server, stop, seen, failures):
    with httpx.Client(timeout=30) as client:
        while not stop.is_set():
            try:
                r = client.post(
                    f"{server.url}/v1/models/mnist:predict", json={"instances": IMAGE.tolist()}
                )
                if r.status_code != 200:
                    failures.append(f"REST {r.status_code} {r.text[:200]}")
                else:
                    seen.add(("REST", round(r.json()["predictions"][0][0], 6)))
            except httpx.HTTPError as e:
                failures.append(f"REST {e!r}")


def _grpc_client(server, stop, seen, failures):
    channel = grpc.insecure_channel(server.grpc_target)
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "mnist"
    request.inputs["images"].CopyFrom(tf.make_tensor_proto(IMAGE))
    while not stop.is_set():
        try:
            response = stub.Predict(request, timeout=30)
            seen.add(("GRPC", response.model_spec.version.value))
        except grpc.RpcError as e:
            failures.append(f"GRPC {e.code()} {e.details()}")
    channel.close()


def _status(server):
    body = httpx.get(f"{server.url}/v1/models/mnist", timeout=30).json()
    return {int(s["version"]): s for s in body["model_version_status"]}


def _wait_for(predicate, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def test_new_version_swaps_in_under_load_with_zero_failures(tmp_path, model_root):
    base = tmp_path / "mnist"
    copy_version(model_root / "mnist" / "0001", base, 1)
    server = Server(
        ["--model_name=mnist", f"--model_base_path={base}", "--file_system_poll_wait_seconds=0.2"],
        tmp_path,
    )
    stop, seen, failures = threading.Event(), set(), []
    clients = [
        threading.Thread(target=_rest_client, args=(server, stop, seen, failures)) for _ in range(4)
    ] + [
        threading.Thread(target=_grpc_client, args=(server, stop, seen, failures)) for _ in range(4)
    ]
    try:
        for c in clients:
            c.start()
        time.sleep(1.0)
        copy_version(model_root / "mnist" / "0002", base, 2)  # the new version is dropped in
        assert _wait_for(lambda: _status(server).get(1, {}).get("state") == "END"), server.logs()
        assert _status(server)[2]["state"] == "AVAILABLE"
        time.sleep(1.0)  # keep calling the new version for a while
        # a broken version: its folder exists but holds no usable SavedModel
        (base / "0003").mkdir()
        (base / "0003" / "saved_model.pb").write_bytes(b"not a saved model")
        assert _wait_for(lambda: _status(server).get(3, {}).get("state") == "END"), server.logs()
        time.sleep(1.0)
    finally:
        stop.set()
        for c in clients:
            c.join()
        code = server.stop()
    assert failures == [], failures[:5]
    assert ("GRPC", 1) in seen and ("GRPC", 2) in seen  # traffic moved from 1 to 2
    assert ("GRPC", 3) not in seen
    assert len({v for k, v in seen if k == "REST"}) == 2  # REST saw both versions' answers
    assert code == 0


def test_broken_version_status_names_the_error(tmp_path, model_root):
    base = tmp_path / "m"
    copy_version(model_root / "mnist" / "0001", base, 1)
    (base / "0002").mkdir()
    (base / "0002" / "saved_model.pb").write_bytes(b"garbage")
    server = Server(
        ["--model_name=m", f"--model_base_path={base}", "--file_system_poll_wait_seconds=0"],
        tmp_path,
    )
    try:
        body = httpx.get(f"{server.url}/v1/models/m", timeout=30).json()
        states = {s["version"]: s for s in body["model_version_status"]}
        # latest policy: 2 is wanted, fails, so 1 keeps serving
        assert states["2"]["state"] == "END" and states["2"]["status"]["error_code"] != "OK"
        assert states["2"]["status"]["error_message"]
        r = httpx.post(
            f"{server.url}/v1/models/m:predict", json={"instances": IMAGE.tolist()}, timeout=30
        )
        assert r.status_code == 200
        r = httpx.post(
            f"{server.url}/v1/models/m/versions/2:predict",
            json={"instances": IMAGE.tolist()},
            timeout=30,
        )
        assert r.status_code == 404
    finally:
        server.stop()
