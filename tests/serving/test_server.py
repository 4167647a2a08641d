"""serving.server: batching through the real server, graceful shutdown, malformed input (fuzz)
never answered with a 5xx, and bad command lines."""

import json
import random
import re
import threading
import time

import grpc
import httpx
import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from conftest import run_cli
from serving_support import Server, model_root, server  # noqa: F401 (fixtures)

IMAGE = np.linspace(0, 1, 784, dtype=np.float32).reshape(1, 28, 28)


def _grpc_burst(server, n_clients, requests_each):
    channel = grpc.insecure_channel(server.grpc_target)
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "mnist"
    request.inputs["images"].CopyFrom(tf.make_tensor_proto(IMAGE))
    errors = []

    def client():
        for _ in range(requests_each):
            try:
                stub.Predict(request, timeout=30)
            except grpc.RpcError as e:
                errors.append(e.code())

    threads = [threading.Thread(target=client) for _ in range(n_clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    channel.close()
    return errors


@pytest.mark.slow
def test_batching_merges_concurrent_grpc_requests(tmp_path, model_root):
    params = tmp_path / "batching.config"
    params.write_text(
        "max_batch_size { value: 32 } batch_timeout_micros { value: 5000 } "
        "num_batch_threads { value: 1 } max_enqueued_batches { value: 100 }"
    )
    srv = Server(
        [
            f"--model_config_file={model_root / 'models.config'}",
            f"--monitoring_config_file={model_root / 'monitoring.config'}",
            "--enable_batching",
            f"--batching_parameters_file={params}",
        ],
        tmp_path,
    )
    try:
        assert _grpc_burst(srv, n_clients=16, requests_each=10) == []
        text = httpx.get(f"{srv.url}/monitoring/prometheus/metrics").text
    finally:
        srv.stop()
    count = sum_ = 0.0
    for line in text.splitlines():
        if line.startswith(":tensorflow:serving:batching_session:processed_batch_size_count"):
            count = float(line.split()[-1])
        if line.startswith(":tensorflow:serving:batching_session:processed_batch_size_sum"):
            sum_ = float(line.split()[-1])
    assert sum_ >= 160  # every request went through the batcher (warm-up excluded)
    assert count < 160 and sum_ / count > 1.5, (count, sum_)  # merged into fewer, larger calls


@pytest.mark.slow
def test_sigterm_finishes_requests_in_flight(tmp_path, model_root):
    params = tmp_path / "batching.config"  # requests wait 2 s in the queue: in flight
    params.write_text(
        "max_batch_size { value: 64 } batch_timeout_micros { value: 2000000 } "
        "num_batch_threads { value: 1 }"
    )
    srv = Server(
        [
            f"--model_config_file={model_root / 'models.config'}",
            "--enable_batching",
            f"--batching_parameters_file={params}",
        ],
        tmp_path,
    )
    results = []
    # clients made (and connected) up front: on a loaded machine making four in their threads
    # took longer than the wait below, and the SIGTERM came before the requests
    clients = [httpx.Client(timeout=30) for _ in range(4)]
    for c in clients:
        assert c.get(f"{srv.url}/readyz").status_code == 200

    def client(c):
        r = c.post(f"{srv.url}/v1/models/mnist:predict", json={"instances": IMAGE.tolist()})
        results.append(r.status_code)

    threads = [threading.Thread(target=client, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    time.sleep(0.8)
    code = srv.stop()  # SIGTERM while the 4 requests wait for their batch
    for t in threads:
        t.join()
    for c in clients:
        c.close()
    assert results == [200] * 4 and code == 0
    assert '"event": "shutting down"' in srv.logs()


def _malformed_bodies(seed: int, n: int):
    rng = random.Random(seed)
    valid = json.dumps({"instances": [[[0.5] * 28] * 28]})
    fixed = [
        b"",
        b"{",
        b"[]",
        b"null",
        b"1e999999",
        b'{"instances": [[[NaN]]]}',
        b"\xff\xfe",
        b'{"instances": {"b64": "!!"}}',
        b'{"inputs": {"images": "x"}}',
        b'{"instances": [[[1, 2], [3]]]}',
        b'{"instances": [[[[[[[[[[1]]]]]]]]]]}',
        b"[" * 5000 + b"]" * 5000,
        b'{"signature_name": null, "instances": [1]}',
        b'{"instances": [true]}',
        b'{"instances": [{"images": 1, "x": 2}]}',
        b'{"instances": [1e400]}',
        b'{"examples": [{"x": {"y": 1}}]}',
    ]
    for body in fixed:
        yield body
    for _ in range(n):
        data = bytearray(valid.encode())
        for _ in range(rng.randint(1, 8)):
            op = rng.random()
            pos = rng.randrange(len(data))
            if op < 0.4:
                data[pos] = rng.randrange(256)
            elif op < 0.7:
                del data[pos : pos + rng.randint(1, 50)]
            else:
                data[pos:pos] = rng.choice(
                    [
                        b"[",
                        b"]",
                        b"{",
                        b"}",
                        b",",
                        b'"',
                        b"-",
                        b"e9",
                        b"null",
                        b"true",
                        b'{"b64": "AA=="}',
                    ]
                )
        yield bytes(data)


@pytest.mark.slow
def test_fuzzed_bodies_never_get_a_5xx(server):
    paths = [
        "/v1/models/mnist:predict",
        "/v1/models/multi:predict",
        "/v1/models/multi:classify",
        "/v1/models/multi:regress",
        "/v1/models/mnist/versions/1:predict",
    ]
    seen = set()
    with httpx.Client(timeout=30) as client:
        for i, body in enumerate(_malformed_bodies(seed=1234, n=150)):
            r = client.post(server.url + paths[i % len(paths)], content=body)
            assert r.status_code < 500, (body[:200], r.status_code, r.text[:300])
            if r.status_code != 200:
                assert "error" in r.json()
            seen.add(r.status_code)
    assert 400 in seen
    assert httpx.get(f"{server.url}/readyz").status_code == 200  # still up


@pytest.mark.parametrize(
    "args, needle",
    [
        ([], "give --model_base_path (with --model_name) or --model_config_file"),
        (["--model_base_path=/nonexistent"], "--model_base_path /nonexistent is not a folder"),
        (
            ["--model_base_path=.", "--batching_parameters_file=x"],
            "--batching_parameters_file needs --enable_batching",
        ),
        (["--model_base_path=.", "--port=8500", "--rest_api_port=8500"], "both 8500"),
        (["--model_base_path=.", "--enable_batching=maybe"], "expected true or false"),
        (["--model_config_file=/nonexistent.config"], "cannot read it"),
        # issue 27 item 5: accepted and ignored before
        (
            ["--model_base_path=.", "--model_config_file_poll_wait_seconds=5"],
            "--model_config_file_poll_wait_seconds needs --model_config_file",
        ),
        (
            ["--model_base_path=.", "--rest_api_body_timeout_in_ms=0"],
            "--rest_api_body_timeout_in_ms must be 1-86400000 (a day), got 0",
        ),
        # -1 meant 'unlimited' to gRPC: the server started and took 84 MB messages
        (
            ["--model_base_path=.", "--max_request_bytes", "-1"],
            "--max_request_bytes must be 1-2147483647 (2 GiB, gRPC's limit), got -1",
        ),
    ],
)
def test_bad_serve_command_lines(args, needle):
    proc = run_cli("serve", *args, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert needle in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "field, value, needle",
    [
        ("max_request_bytes", 2**31, "--max_request_bytes must be 1-2147483647"),
        ("max_rows_per_request", -5, "--max_rows_per_request must be positive, got -5"),
        ("rest_api_timeout_in_ms", -1, "--rest_api_timeout_in_ms must be 1-86400000"),
        ("rest_api_max_buffered_bytes", -1, "--rest_api_max_buffered_bytes must be at least"),
        ("grpc_max_threads", 0, "--grpc_max_threads must be positive, got 0"),
        ("max_num_load_retries", -1, "--max_num_load_retries must be >= 0"),
        ("tensorflow_intra_op_parallelism", -1, "--tensorflow_intra_op_parallelism must be 0"),
        ("tensorflow_inter_op_parallelism", 10**6, "--tensorflow_inter_op_parallelism must be 0"),
        ("file_system_poll_wait_seconds", float("nan"), "--file_system_poll_wait_seconds must be"),
        ("file_system_poll_wait_seconds", float("inf"), "--file_system_poll_wait_seconds must be"),
        (
            "model_config_file_poll_wait_seconds",
            float("inf"),
            "--model_config_file_poll_wait_seconds must be",
        ),
        ("shutdown_grace_seconds", -1.0, "--shutdown_grace_seconds must be 0-86400"),
        ("shutdown_grace_seconds", float("nan"), "--shutdown_grace_seconds must be 0-86400"),
    ],
)
def test_every_numeric_setting_is_range_checked(field, value, needle, tmp_path):
    from mirrorfit.errors import ConfigError
    from mirrorfit.serving.settings import ServeConfig, check_config

    model = {"model_base_path": str(tmp_path)}  # a folder: the path is checked too
    check_config(ServeConfig(**model))  # the defaults pass
    with pytest.raises(ConfigError, match=re.escape(needle)):
        check_config(ServeConfig(**model, **{field: value}))


def test_loaded_versions_leave_the_gc_scans_and_unloaded_ones_are_freed(model_root):
    import gc
    import weakref

    from mirrorfit.serving import server as server_module

    path = str(next((model_root / "mnist").iterdir()))
    try:
        loaded = server_module._load("mnist", 1, path, tags="serve", warmup=False)
        # TensorFlow and the model are out of every later collection's scan (no long pauses)
        assert gc.get_freeze_count() > 100_000
        # a version whose objects reference each other: only the collector can free them
        cycle = [loaded._keepalive]
        cycle.append(cycle)
        loaded._keepalive.__dict__["_test_cycle"] = cycle
        server_module._freeze_heap()
        model = weakref.ref(loaded._keepalive)
        del loaded, cycle
        server_module._unload(None, "mnist", 1)
        assert model() is None  # its reference cycles were collected, not frozen forever
        assert gc.get_freeze_count() > 100_000
    finally:
        gc.unfreeze()
