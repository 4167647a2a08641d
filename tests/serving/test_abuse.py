"""A hostile client against a real `mirrorfit serve` process (issue 10, items 1-7).

Every answer to a bad request is TF Serving's own: a 4xx over REST, INVALID_ARGUMENT (or the
code TF Serving uses) over gRPC, with a message naming the bad value. The server's resources
(threads, memory, batch queues, metric series) stay bounded whatever the client sends, it stays
ready, and no traceback reaches its stderr.
"""

from __future__ import annotations

import concurrent.futures
import json
import shutil
import time
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import tensor_pb2, tensor_shape_pb2, types_pb2
from tensorflow_serving.apis import (
    classification_pb2,
    predict_pb2,
    prediction_service_pb2_grpc,
    regression_pb2,
)

from serving_support import Server, model_root  # noqa: F401 - fixture

pytestmark = pytest.mark.slow


# --- gRPC, batching and version polling (items 1, 2, 5 for gRPC, 6, 7) -------------------------

MAX_ROWS = 64  # --max_rows_per_request for the module's server
MAX_BYTES = 1_000_000  # --max_request_bytes


def _save_pixels(path: Path) -> None:
    """A uint8 image input (item 6) and a signature with a variable non-batch dimension
    (item 1: each length in use is its own batch queue)."""

    class Pixels(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 28, 28], tf.uint8, name="pixels")])
        def brightness(self, pixels):
            return {"brightness": tf.reduce_mean(tf.cast(pixels, tf.float32), axis=[1, 2])}

        @tf.function(input_signature=[tf.TensorSpec([None, None], tf.float32, name="x")])
        def total(self, x):
            return {"total": tf.reduce_sum(x, axis=1)}

    module = Pixels()
    tf.saved_model.save(
        module, str(path), signatures={"serving_default": module.brightness, "seq": module.total}
    )


@pytest.fixture(scope="module")
def hardened(model_root, tmp_path_factory):
    """A server with batching on, small limits, and fast version polling and load retries."""
    root = tmp_path_factory.mktemp("abuse")
    _save_pixels(root / "pixels" / "1")
    for name in ("²", "٣"):  # isdigit() is True for both: start-up used to crash on ²
        (root / "pixels" / name).mkdir()
    shutil.copytree(root / "pixels" / "1", root / "polled" / "0001")
    (root / "models.config").write_text(f"""model_config_list {{
  config {{ name: 'mnist' base_path: '{model_root / "mnist"}' }}
  config {{ name: 'pixels' base_path: '{root / "pixels"}' }}
  config {{ name: 'polled' base_path: '{root / "polled"}' }}
}}""")
    (root / "batching.config").write_text(
        "max_batch_size { value: 32 } batch_timeout_micros { value: 2000 } "
        "num_batch_threads { value: 2 } max_enqueued_batches { value: 100 }"
    )
    srv = Server(
        [
            f"--model_config_file={root / 'models.config'}",
            "--enable_batching",
            f"--batching_parameters_file={root / 'batching.config'}",
            f"--max_request_bytes={MAX_BYTES}",
            f"--max_rows_per_request={MAX_ROWS}",
            "--file_system_poll_wait_seconds=0.2",
            "--max_num_load_retries=1",
            "--load_retry_interval_micros=200000",
        ],
        root,
    )
    srv.models = root
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def channel(hardened):
    with grpc.insecure_channel(hardened.grpc_target) as channel:
        yield channel


@pytest.fixture(scope="module")
def stub(channel):
    return prediction_service_pb2_grpc.PredictionServiceStub(channel)


def _log_events(server, event: str, **fields) -> list[dict]:
    """The server's JSON log lines for ``event`` (with ``fields``)."""
    out = []
    for line in server.log.read_text().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("event") == event and all(entry.get(k) == v for k, v in fields.items()):
            out.append(entry)
    return out


def _proc(server, field: str) -> int:
    """A number from /proc/PID/status (Threads, VmRSS in kB)."""
    for line in Path(f"/proc/{server.proc.pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{server.proc.pid}/status")


def _request(model: str, alias: str, proto, signature: str = "") -> predict_pb2.PredictRequest:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    request.model_spec.signature_name = signature
    request.inputs[alias].CopyFrom(proto)
    return request


def _declared(dtype, dims) -> tensor_pb2.TensorProto:
    """A TensorProto declaring ``dims`` and holding no values."""
    return tensor_pb2.TensorProto(
        dtype=dtype,
        tensor_shape=tensor_shape_pb2.TensorShapeProto(
            dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=n) for n in dims]
        ),
    )


def _code(stub, request) -> grpc.StatusCode:
    try:
        stub.Predict(request, timeout=30)
    except grpc.RpcError as e:
        assert "Traceback" not in e.details() and "<class" not in e.details(), e.details()
        return e.code()
    return grpc.StatusCode.OK


def _warm(server, stub) -> None:
    """One good request per signature, both transports: batch threads and pools started."""
    image = np.zeros((1, 28, 28), np.float32)
    assert _code(stub, _request("mnist", "images", tf.make_tensor_proto(image))) == OK
    assert (
        _code(
            stub,
            _request("pixels", "pixels", tf.make_tensor_proto(np.zeros((1, 28, 28), np.uint8))),
        )
        == OK
    )
    assert (
        _code(
            stub, _request("pixels", "x", tf.make_tensor_proto(np.ones((1, 3), np.float32)), "seq")
        )
        == OK
    )
    assert (
        httpx.post(
            f"{server.url}/v1/models/mnist:predict", json={"instances": image.tolist()}, timeout=30
        ).status_code
        == 200
    )


OK, INVALID = grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT


def test_bad_shapes_make_no_batch_queues_or_threads(hardened, stub):
    # Item 1: ten bad shapes took the server from 15 to 35 threads, never freed.
    _warm(hardened, stub)
    before = _proc(hardened, "Threads")
    for i in range(20):
        bad = np.zeros((1, 28, 8 + i), np.float32)
        assert _code(stub, _request("mnist", "images", tf.make_tensor_proto(bad))) == INVALID
        r = httpx.post(
            f"{hardened.url}/v1/models/mnist:predict",
            json={"instances": np.zeros((1, 5 + i)).tolist()},
            timeout=30,
        )
        assert r.status_code == 400 and "does not match the signature" in r.json()["error"]
    for n in range(1, 41):  # 40 lengths of a variable dimension: 40 queues, no new threads
        x = tf.make_tensor_proto(np.ones((1, n), np.float32))
        assert _code(stub, _request("pixels", "x", x, "seq")) == OK
    # the batch threads are one shared pool (num_batch_threads = 2), started by _warm
    assert _proc(hardened, "Threads") <= before, (before, _proc(hardened, "Threads"))


def test_a_tiny_request_declaring_a_huge_tensor_allocates_nothing(hardened, stub):
    # Item 2: 18 bytes declaring [1000000, 28, 28] became a 3 GB zero array.
    rss = _proc(hardened, "VmRSS")
    huge = _request("mnist", "images", _declared(types_pb2.DT_FLOAT, [1000000, 28, 28]))
    assert huge.ByteSize() < 40
    with pytest.raises(grpc.RpcError) as info:
        stub.Predict(huge, timeout=30)
    assert info.value.code() == INVALID
    assert f"1000000 rows is more than the limit of {MAX_ROWS}" in info.value.details()
    cases = [  # within the row limit, but declaring more than they hold
        _request("mnist", "images", _declared(types_pb2.DT_FLOAT, [MAX_ROWS, 28, 28])),
        _request("pixels", "x", _declared(types_pb2.DT_FLOAT, [1, 10**12]), "seq"),
        _request("pixels", "x", _declared(types_pb2.DT_FLOAT, [MAX_ROWS, 2**62]), "seq"),
    ]
    for request in cases:
        with pytest.raises(grpc.RpcError) as info:
            stub.Predict(request, timeout=30)
        assert info.value.code() == INVALID and "tensor parsing error" in info.value.details()
    rows = tf.make_tensor_proto(np.zeros((MAX_ROWS + 1, 28, 28), np.float32))  # 205 kB, real
    assert _code(stub, _request("mnist", "images", rows)) == INVALID
    big = tf.make_tensor_proto(np.zeros((1, MAX_BYTES // 4 + 1), np.float32))
    assert _code(stub, _request("pixels", "x", big, "seq")) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert _proc(hardened, "VmRSS") - rss < 50_000  # kB: nothing like the declared sizes


def test_grpc_errors_are_tf_serving_codes_without_python_text(hardened, stub):
    # Item 5 (gRPC): errors were UNKNOWN with Python's text ("could not convert string to
    # float", "Unable to allocate 3.06 PiB").
    text = tf.make_tensor_proto(np.array([[b"a"] * 28] * 28, object).reshape(1, 28, 28))
    assert _code(stub, _request("mnist", "images", text)) == INVALID
    assert (
        _code(stub, _request("mnist", "images", _declared(types_pb2.DT_FLOAT, [2**62, 2**62])))
        == INVALID
    )
    with grpc.insecure_channel(hardened.grpc_target) as channel:
        raw = channel.unary_unary("/tensorflow.serving.PredictionService/Predict")
        with pytest.raises(grpc.RpcError) as info:
            raw(b"\x0a\xff\xff\xff\xff\x0f", timeout=30)
    assert info.value.code() == INVALID and "Failed to parse" in info.value.details()


def test_dtype_mismatches_are_refused_not_cast(hardened, stub):
    # Item 6: DT_FLOAT sent to the uint8 input answered OK with an all-zero image's result.
    floats = tf.make_tensor_proto(np.full((1, 28, 28), 0.9, np.float32))
    with pytest.raises(grpc.RpcError) as info:
        stub.Predict(_request("pixels", "pixels", floats), timeout=30)
    assert info.value.code() == INVALID
    assert info.value.details() == "Expected input pixels to be uint8 but get float."
    over = _declared(types_pb2.DT_UINT8, [1, 28, 28])
    over.int_val.extend([300] * 784)
    with pytest.raises(grpc.RpcError) as info:
        stub.Predict(_request("pixels", "pixels", over), timeout=30)
    assert info.value.details() == "tensor parsing error: pixels (values out of range for uint8)"


def _version_states(server, model: str) -> dict[int, str]:
    r = httpx.get(f"{server.url}/v1/models/{model}", timeout=10)
    return {int(s["version"]): s["state"] for s in r.json()["model_version_status"]}


def _wait_for(predicate, timeout_s: float = 60):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError("timed out")


def test_a_slow_copy_is_picked_up_once_complete(hardened):
    # Item 7: a version that failed to load while half copied was dropped until restart.
    base, source = hardened.models / "polled", hardened.models / "pixels" / "1"
    half, staging = base / "0002", base / ".staging"  # (staged: the poller sees one state)
    staging.mkdir()
    pb = (source / "saved_model.pb").read_bytes()
    (staging / "saved_model.pb").write_bytes(pb[: len(pb) // 2])
    staging.rename(half)  # half of the copy is there
    # the first attempt and --max_num_load_retries=1 retry, 0.2 s apart, both fail
    _wait_for(lambda: len(_log_events(hardened, "load failed", model="polled")) >= 2)
    time.sleep(0.6)  # no third attempt on unchanged content
    failed = _log_events(hardened, "load failed", model="polled")
    assert [e["retries_left"] for e in failed] == [1, 0]
    assert _version_states(hardened, "polled") == {1: "AVAILABLE", 2: "END"}
    shutil.copytree(source, half, dirs_exist_ok=True)  # the copy completes
    _wait_for(lambda: _version_states(hardened, "polled").get(2) == "AVAILABLE")
    r = httpx.post(
        f"{hardened.url}/v1/models/polled:predict",
        json={"instances": np.zeros((1, 28, 28), int).tolist()},
        timeout=30,
    )
    assert r.status_code == 200
    assert "Traceback" not in hardened.log.read_text()


def _hostile(client, stub, raw, i: int):
    """The i-th hostile request and the answers allowed for it: (gRPC code or HTTP status)."""
    image = np.zeros((1, 28, 28), np.float32)
    kind = i % 10
    if kind == 0:  # a new wrong shape each time
        return lambda: _code(
            stub,
            _request(
                "mnist", "images", tf.make_tensor_proto(np.zeros((1, 28, 29 + i % 200), np.float32))
            ),
        ), {INVALID}
    if kind == 1:  # a float image for the uint8 input
        return lambda: _code(stub, _request("pixels", "pixels", tf.make_tensor_proto(image))), {
            INVALID
        }
    if kind == 2:  # a huge declared shape
        return lambda: _code(
            stub,
            _request("mnist", "images", _declared(types_pb2.DT_FLOAT, [10 ** (i % 7 + 3), 28, 28])),
        ), {INVALID}
    if kind == 3:  # an unknown model (a new name each time)
        return lambda: _code(stub, _request(f"nope{i}", "images", tf.make_tensor_proto(image))), {
            grpc.StatusCode.NOT_FOUND
        }
    if kind == 4:  # bytes that are no PredictRequest
        return lambda: _raw_code(raw, bytes([0x0A, 0xFF, i % 256, 0xFF])), {INVALID}
    if kind == 5:  # too many rows
        return lambda: _code(
            stub,
            _request(
                "mnist",
                "images",
                tf.make_tensor_proto(np.zeros((MAX_ROWS + 1 + i % 5, 28, 28), np.float32)),
            ),
        ), {INVALID}
    if kind == 6:  # REST: a wrong shape
        wrong = {"instances": np.zeros((1, 3 + i % 50)).tolist()}
        return lambda: _post(client, "mnist", wrong), {400}
    if kind == 7:  # REST: strings for a float input
        return lambda: _post(client, "mnist", {"instances": [["x"] * 28] * 28}), {400}
    if kind == 8:  # REST: an unknown model
        return lambda: _post(client, f"nope{i}", {"instances": image.tolist()}), {404}
    return lambda: _post(client, "mnist", b'{"instances": [[' + b"\xff" * (i % 64)), {400}


def _raw_code(raw, body: bytes) -> grpc.StatusCode:
    try:
        raw(body, timeout=30)
    except grpc.RpcError as e:
        return e.code()
    return grpc.StatusCode.OK


def _post(client: httpx.Client, model: str, body) -> int:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return client.post(f"/v1/models/{model}:predict", content=content).status_code


def test_a_thousand_hostile_requests_leave_the_server_as_it_was(hardened, channel, stub):
    raw = channel.unary_unary("/tensorflow.serving.PredictionService/Predict")
    _warm(hardened, stub)
    with httpx.Client(base_url=hardened.url, timeout=30) as client:  # pooled connections
        for i in range(20):  # one of each kind first: lazily made pools and caches exist
            call, _ = _hostile(client, stub, raw, i)
            call()
        threads, rss = _proc(hardened, "Threads"), _proc(hardened, "VmRSS")
        requests = [_hostile(client, stub, raw, i) for i in range(1000)]
        start = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(lambda item: (item[0](), item[1]), requests))
        elapsed = time.monotonic() - start
    wrong = [(i, got, allowed) for i, (got, allowed) in enumerate(answers) if got not in allowed]
    assert not wrong, wrong[:10]
    # Threads: the batch pool, gRPC's and uvicorn's threads and TensorFlow's pools are all
    # made by _warm and the first round; a hostile request must add none. Before the fix the
    # 100 new shapes above added 2 batch threads each. The slack of 4 is for pools that grow
    # on demand under concurrency (asyncio's default executor, anyio's thread pool).
    assert _proc(hardened, "Threads") <= threads + 4, (threads, _proc(hardened, "Threads"))
    # Memory: no request above may cost more than it carries; the largest carries 0.2 MB and
    # 16 run at once: a few MB, plus allocator and gRPC buffer growth. 100 MB is far below a
    # single declared tensor above (3 GB and more) and still catches a leak of 100 kB per
    # request.
    assert _proc(hardened, "VmRSS") - rss < 100_000, (rss, _proc(hardened, "VmRSS"))
    assert httpx.get(f"{hardened.url}/readyz", timeout=10).status_code == 200
    assert "Traceback" not in hardened.log.read_text()
    assert elapsed < 60, elapsed


# --- REST transport, limits and metrics (items 3, 4, 5 for REST) -------------------------------

REST_LIMIT_S = 1.0  # the header and body timeouts of the module's REST server
MAX_CONNECTIONS = 16
GRPC_MAX_THREADS = 2  # gRPC requests in progress at once: as many as the model pool runs


def _save_slow(path: Path) -> None:
    """A model that takes a second without using a core (tf.data's sleep, a test helper of
    TensorFlow's, is a graph op, so it survives the export): unbatched calls pile up
    deterministically, whatever the load."""
    from tensorflow.python.data.experimental.ops.testing import sleep

    class Slow(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 1], tf.float32, name="x")])
        def slow(self, x):
            ds = tf.data.Dataset.range(1).apply(sleep(1_000_000))
            zero = tf.cast(ds.reduce(tf.constant(0, tf.int64), lambda a, b: a + b), tf.float32)
            return {"y": x + zero}

    module = Slow()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.slow})


@pytest.fixture(scope="module")
def rest_server(model_root, tmp_path_factory):
    """No batching, tight REST bounds, and uvicorn's other HTTP stack (h11 on asyncio; the
    REST suite in test_rest.py runs on the default, httptools on uvloop)."""
    root = tmp_path_factory.mktemp("abuse-rest")
    _save_slow(root / "slow" / "1")
    (root / "models.config").write_text(f"""model_config_list {{
  config {{ name: 'mnist' base_path: '{model_root / "mnist"}' }}
  config {{ name: 'multi' base_path: '{model_root / "multi"}' }}
  config {{ name: 'slow' base_path: '{root / "slow"}' }}
}}""")
    ms = int(REST_LIMIT_S * 1000)
    srv = Server(
        [
            f"--model_config_file={root / 'models.config'}",
            f"--monitoring_config_file={model_root / 'monitoring.config'}",
            "--max_unbatched_in_flight=2",
            f"--rest_api_max_connections={MAX_CONNECTIONS}",
            f"--rest_api_header_timeout_in_ms={ms}",
            f"--rest_api_body_timeout_in_ms={ms}",
            f"--grpc_max_threads={GRPC_MAX_THREADS}",
            "--rest_api_http_impl=h11",
            "--event_loop=asyncio",
        ],
        root,
    )
    yield srv
    srv.stop()


def _socket(server):
    import socket

    return socket.create_connection(("127.0.0.1", server.rest_port), timeout=30)


def _until_closed(sock) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def test_rest_idle_and_slowloris_connections_are_cut(rest_server):
    idle, slow_head, slow_body = _socket(rest_server), _socket(rest_server), _socket(rest_server)
    slow_head.sendall(b"POST /v1/models/mnist:predict HTTP/1.1\r\nhost: x\r\n")  # no end
    slow_body.sendall(
        b"POST /v1/models/mnist:predict HTTP/1.1\r\nhost: x\r\ncontent-length: 1000\r\n\r\n{"
    )
    start = time.monotonic()
    for _ in range(int(REST_LIMIT_S * 3)):  # a byte a second on each
        time.sleep(0.5)
        for sock, byte in ((slow_head, b"x"), (slow_body, b" ")):
            try:
                sock.sendall(byte)
            except OSError:  # cut: the point of the test
                pass
    answers = [_until_closed(s) for s in (idle, slow_head, slow_body)]
    assert time.monotonic() - start < REST_LIMIT_S + 5  # all closed by the server
    assert answers[0] == b""  # idle: closed quietly
    assert answers[1].startswith(b"HTTP/1.1 408") and b"header_timeout" in answers[1]
    assert answers[2].startswith(b"HTTP/1.1 408") and b"body_timeout" in answers[2]
    assert httpx.get(f"{rest_server.url}/readyz", timeout=10).status_code == 200


def test_rest_connections_beyond_the_limit_get_503_and_the_server_recovers(rest_server):
    held = [_socket(rest_server) for _ in range(MAX_CONNECTIONS)]
    time.sleep(0.3)
    assert httpx.get(f"{rest_server.url}/readyz", timeout=10).status_code == 503
    time.sleep(REST_LIMIT_S + 1)  # the server drops the silent ones itself
    assert httpx.get(f"{rest_server.url}/readyz", timeout=10).status_code == 200
    for sock in held:
        sock.close()


def test_unbatched_overload_answers_503_not_an_endless_queue(rest_server):
    body = {"instances": [[1.0]]}
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        clients = [httpx.Client(timeout=30) for _ in range(6)]
        for c in clients:  # connected before the burst: it lands within the model's second
            c.get(f"{rest_server.url}/readyz")
        answers = list(
            pool.map(
                lambda c: c.post(f"{rest_server.url}/v1/models/slow:predict", json=body), clients
            )
        )
        for c in clients:
            c.close()
    codes = sorted(r.status_code for r in answers)
    assert codes == [200, 200, 503, 503, 503, 503], [r.text for r in answers]
    busy = next(r for r in answers if r.status_code == 503)
    assert "--max_unbatched_in_flight" in busy.json()["error"]
    # the bound is the service's, shared with gRPC: two REST calls hold both slots for their
    # second, and a gRPC call meanwhile is refused by the pool (gRPC's own bound is not reached)
    request = _request("slow", "x", tf.make_tensor_proto(np.ones((1, 1), np.float32)))
    with (
        grpc.insecure_channel(rest_server.grpc_target) as channel,
        concurrent.futures.ThreadPoolExecutor(2) as pool,
    ):
        clients = [httpx.Client(timeout=30) for _ in range(2)]
        for c in clients:
            c.get(f"{rest_server.url}/readyz")
        held = [
            pool.submit(c.post, f"{rest_server.url}/v1/models/slow:predict", json=body)
            for c in clients
        ]
        time.sleep(0.3)
        code = _code(prediction_service_pb2_grpc.PredictionServiceStub(channel), request)
        assert [f.result().status_code for f in held] == [200, 200]
        for c in clients:
            c.close()
    assert code == grpc.StatusCode.UNAVAILABLE, code
    assert (
        httpx.post(f"{rest_server.url}/v1/models/slow:predict", json=body, timeout=30).status_code
        == 200
    )  # slots given back


def _metric_lines(server) -> list[str]:
    page = httpx.get(f"{server.url}/monitoring/prometheus/metrics", timeout=10).text
    return [line for line in page.splitlines() if not line.startswith("#")]


def _unknown_model_round(client, url: str, name: str) -> None:
    for path, body in (
        (f"/v1/models/{name}:predict", {"instances": [1]}),
        (f"/v1/models/{name}:classify", {"examples": [{}]}),
        (f"/v1/models/{name}:regress", {"examples": [{}]}),
    ):
        assert client.post(url + path, json=body).status_code == 404
    for path in (f"/v1/models/{name}", f"/v1/models/{name}/metadata"):
        assert client.get(url + path).status_code == 404


def test_unknown_model_names_add_no_metric_series(rest_server):
    with httpx.Client(timeout=30) as client:
        _unknown_model_round(client, rest_server.url, "first-unknown")  # the one shared series
        before = _metric_lines(rest_server)
        for i in range(50):
            _unknown_model_round(client, rest_server.url, f"nope{i}")
    after = _metric_lines(rest_server)
    assert len(after) == len(before), set(after) - set(before)  # was ~1,000 lines more
    assert not [line for line in after if "nope" in line or "first-unknown" in line]
    assert any('model_name="<unknown>",status="NOT_FOUND"' in line for line in after)


NASTY_REST = [  # (path, body): each was a 500 and a traceback in the server's log
    ("mnist:predict", b'{"instances": ' + b"[" * 66 + b"1" + b"]" * 66 + b"}"),
    ("mnist:predict", b'{"instances": ' + b"[" * 950 + b"1" + b"]" * 950 + b"}"),
    ("mnist:predict", b'{"instances": [' + b"9" * 4301 + b"]}"),
    (
        "multi:predict",
        b'{"signature_name": "multi", "inputs": {"a": [[' + b"9" * 400 + b', 1]], "b": [[1, 1]]}}',
    ),
    ("multi:classify", b'{"signature_name": "classify_x", "examples": [{"x": {"b64": "a"}}]}'),
    ("multi:regress", b'{"signature_name": "regress_x", "examples": [{"x": [{"b64": "a"}]}]}'),
    (
        "multi:classify",
        b'{"signature_name": "classify_x", "examples": [{"x": [-9223372036854775809, 1]}]}',
    ),
    ("multi:classify", b'{"signature_name": "classify_x", "examples": [{"x": "\\ud800"}]}'),
    ("multi:predict", b'{"signature_name": "ints", "instances": [[' + b"9" * 30 + b", 1, 2]]}"),
]


def test_nasty_rest_bodies_get_a_4xx_and_leave_no_traceback(rest_server):
    with httpx.Client(timeout=30) as client:
        for path, body in NASTY_REST:
            r = client.post(f"{rest_server.url}/v1/models/{path}", content=body)
            assert 400 <= r.status_code < 500, (body[:80], r.status_code, r.text[:300])
            assert r.json()["error"], body[:80]
    log = rest_server.log.read_text()
    assert "Traceback" not in log and "Exception in ASGI" not in log
    assert httpx.get(f"{rest_server.url}/readyz", timeout=10).status_code == 200


def test_a_large_body_is_decoded_off_the_event_loop(rest_server):
    # 19 MB of JSON: seconds of parsing, during which the loop keeps answering
    body = b'{"instances": [' + b",".join([b"[" + b"0.5," * 27 + b"0.5]"] * 28 * 6000) + b"]}"
    result = {}

    def big():
        start = time.monotonic()
        result["status"] = httpx.post(
            f"{rest_server.url}/v1/models/mnist:predict", content=body, timeout=60
        ).status_code
        result["seconds"] = time.monotonic() - start

    with httpx.Client(timeout=30) as client, concurrent.futures.ThreadPoolExecutor(1) as pool:
        client.get(f"{rest_server.url}/readyz")
        future = pool.submit(big)
        worst = 0.0
        while not future.done():
            start = time.monotonic()
            assert client.get(f"{rest_server.url}/readyz").status_code == 200
            worst = max(worst, time.monotonic() - start)
            time.sleep(0.01)
        future.result()
    assert result["status"] == 400  # 168,000 rows of 28 numbers: not images
    # before, the loop parsed it: /readyz waited as long as the request (seconds)
    assert worst < result["seconds"] / 4, (worst, result)


def test_grpc_requests_in_progress_are_bounded(rest_server):
    # the slow model holds each admitted request for a second: the rest arrive meanwhile
    request = _request("slow", "x", tf.make_tensor_proto(np.ones((1, 1), np.float32)))
    with (
        grpc.insecure_channel(rest_server.grpc_target) as channel,
        concurrent.futures.ThreadPoolExecutor(8) as pool,
    ):
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        codes = list(pool.map(lambda _: _code(stub, request), range(8)))
    # two are in progress (--grpc_max_threads=2) for a second each; one more arriving meanwhile
    # is refused by gRPC before its message is read (they were unlimited: each could hold a
    # 64 MiB message). With a third gRPC slot, the refusal depended on two refused requests
    # overlapping, which a loaded machine did not always give.
    assert codes.count(OK) >= 2 and grpc.StatusCode.RESOURCE_EXHAUSTED in codes, codes
    assert set(codes) <= {OK, grpc.StatusCode.RESOURCE_EXHAUSTED}, codes


# --- classify / regress: checked before any example is built ------------------------------------

PAD = 200_000  # context floats: 1 MB of JSON, 0.8 MB as a tf.Example, copied into every example


def _rss_mb(server) -> float:
    return _proc(server, "VmRSS") / 1024


def _examples_body(signature: str, n: int) -> bytes:
    context = ",".join(["0.0"] * PAD)
    return (
        f'{{"signature_name": "{signature}", "context": {{"pad": [{context}]}}, '
        f'"examples": [{",".join(["{}"] * n)}]}}'
    ).encode()


def test_rest_examples_are_checked_before_they_are_built(rest_server):
    cases = [
        ("mnist:classify", _examples_body("", 1000), "DT_STRING"),  # no tf.Example input
        ("multi:classify", _examples_body("classify_x", 1000), "--max_request_bytes"),
        ("multi:regress", _examples_body("regress_x", 1001), "--max_rows_per_request"),
    ]
    with httpx.Client(timeout=60) as client:
        for path, body, needle in cases:
            before = _rss_mb(rest_server)
            r = client.post(f"{rest_server.url}/v1/models/{path}", content=body)
            grown = _rss_mb(rest_server) - before
            assert r.status_code == 400 and needle in r.json()["error"], r.text[:300]
            assert grown < 150, (path, grown)  # was +800 MB: the context copied 1,000 times


def test_grpc_examples_are_checked_before_they_are_built(rest_server):
    wide = classification_pb2.ClassificationRequest()  # 0.8 MB, 800 MB once merged
    wide.model_spec.name, wide.model_spec.signature_name = "multi", "classify_x"
    ctx = wide.input.example_list_with_context
    ctx.context.features.feature["pad"].float_list.value.extend([0.0] * PAD)
    ctx.examples.MergeFrom([tf.train.Example()] * 1000)
    many = regression_pb2.RegressionRequest()  # 4 MB: two million empty examples
    many.model_spec.name, many.model_spec.signature_name = "multi", "regress_x"
    many.input.example_list.MergeFromString(b"\x0a\x00" * 2_000_000)
    with grpc.insecure_channel(rest_server.grpc_target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        for call, request, needle in (
            (stub.Classify, wide, "--max_request_bytes"),
            (stub.Regress, many, "--max_rows_per_request"),
        ):
            before = _rss_mb(rest_server)
            with pytest.raises(grpc.RpcError) as e:
                call(request, timeout=30)  # was 37 s (and +450 MB) for the two million
            grown = _rss_mb(rest_server) - before
            assert e.value.code() == INVALID and needle in e.value.details(), e.value.details()
            assert grown < 150, (needle, grown)
