"""Load test for `mirrorfit serve`: N concurrent REST and gRPC clients against the exported
MLP and CNN, with and without dynamic batching, next to the limit measured in the same run (the
SavedModel called in-process on batches of the same size).

Every side runs in its own process: the server (`mirrorfit serve`), the load generator (asyncio
clients: grpc.aio and raw HTTP/1.1 streams), and the in-process limit.

It also measures the transport alone: the same clients against an echo server (grpc.aio, or
uvicorn + Starlette) that answers every request with a canned response of the same size and
runs no model. Client, server and model share this machine's cores, so a request costs at least
1/echo + 1/limit machine-seconds; the bound printed is 1 / (1/echo + 1/limit).

    python benchmarks/serving_load.py [--models mlp,cnn] [--clients 64] [--seconds 10]
                                      [--load-generator python|h2load]

`--load-generator h2load` drives the same requests from nghttp2's C load generator (Debian:
nghttp2-client), which leaves the cores the Python clients used to the server and the model.
h2load cannot read gRPC's status trailers, so the run then checks the server's own request
counts (Prometheus page) for any status but OK.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def export_models(root: Path, models: list[str]) -> None:
    import keras
    import mirrorfit
    from mirrorfit.artifacts.export import export_saved_model

    for name in models:
        keras.utils.set_random_seed(0)
        export_saved_model(mirrorfit.models.model_factory(name)(), root / name)


def in_process(path: str, batch: int, seconds: float, callers: int = 1) -> float:
    """Examples/s of the SavedModel's signature called directly on ``batch`` images: one
    caller using every core, or ``callers`` concurrent callers with one core each."""
    import threading

    import numpy as np
    import tensorflow as tf

    if callers > 1:
        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.threading.set_inter_op_parallelism_threads(callers)
    fn = tf.saved_model.load(path).signatures["serving_default"]
    x = tf.constant(np.random.default_rng(0).uniform(0, 1, (batch, 28, 28)).astype("float32"))
    fn(images=x)
    counts = [0] * callers
    start = time.perf_counter()

    def call(i: int) -> None:
        while time.perf_counter() - start < seconds:
            fn(images=x)
            counts[i] += batch

    threads = [threading.Thread(target=call, args=(i,)) for i in range(callers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / (time.perf_counter() - start)


def _image():
    import numpy as np

    return np.random.default_rng(1).uniform(0, 1, (1, 28, 28)).astype("float32")


def _predict_request(model: str):
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2

    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    request.inputs["images"].CopyFrom(tf.make_tensor_proto(_image()))
    return request


async def _grpc_load(target: str, model: str, clients: int, seconds: float) -> list[float]:
    import grpc
    from tensorflow_serving.apis import prediction_service_pb2_grpc

    request = _predict_request(model)
    latencies: list[float] = []
    async with grpc.aio.insecure_channel(target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        await stub.Predict(request, timeout=60)
        end = time.perf_counter() + seconds

        async def client():
            while time.perf_counter() < end:
                t0 = time.perf_counter()
                await stub.Predict(request, timeout=60)
                latencies.append(time.perf_counter() - t0)

        await asyncio.gather(*(client() for _ in range(clients)))
    return latencies


async def _rest_load(url: str, model: str, clients: int, seconds: float) -> list[float]:
    """Keep-alive HTTP/1.1 clients on raw asyncio streams: httpx spent about 6 ms of client
    CPU per request here, which measured the client instead of the server."""
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps({"instances": _image().tolist()}).encode()
    request = (
        f"POST /v1/models/{model}:predict HTTP/1.1\r\nHost: {host}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    latencies: list[float] = []
    end = time.perf_counter() + seconds

    async def client():
        reader, writer = await asyncio.open_connection(host, int(port))
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head.split(b" ", 2)[1])
            length = next(
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            )
            await reader.readexactly(length)
            if status != 200:
                raise RuntimeError(f"HTTP {status}")
            latencies.append(time.perf_counter() - t0)
        writer.close()

    await asyncio.gather(*(client() for _ in range(clients)))
    return latencies


def _canned_response():
    import numpy as np
    from tensorflow_serving.apis import predict_pb2
    from mirrorfit.serving.grpc_service import to_tensor_proto

    response = predict_pb2.PredictResponse()
    response.model_spec.name = "echo"
    response.model_spec.version.value = 1
    response.model_spec.signature_name = "serving_default"
    response.outputs["probabilities"].CopyFrom(to_tensor_proto(np.full((1, 10), 0.1, "float32")))
    return response


def echo_server(grpc_port: int, rest_port: int) -> None:
    """A gRPC PredictionService and a REST :predict route that parse the request and return
    a canned answer of the real size: the transport's cost with no model behind it."""
    import gc
    import grpc
    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route
    from tensorflow_serving.apis import prediction_service_pb2_grpc

    response = _canned_response()
    body = json.dumps({"predictions": [[0.1] * 10]}).encode()

    class Echo(prediction_service_pb2_grpc.PredictionServiceServicer):
        async def Predict(self, request, context):
            return response

    async def predict(request):
        json.loads(await request.body())
        return Response(body, media_type="application/json")

    async def main():
        server = grpc.aio.server()
        prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(Echo(), server)
        server.add_insecure_port(f"127.0.0.1:{grpc_port}")
        await server.start()
        app = Starlette(
            routes=[
                Route("/v1/models/{rest:path}", predict, methods=["POST"]),
                Route("/readyz", lambda r: Response("ok")),
            ]
        )
        await uvicorn.Server(
            uvicorn.Config(
                app, host="127.0.0.1", port=rest_port, log_level="warning", access_log=False
            )
        ).serve()

    gc.collect()
    gc.freeze()
    asyncio.run(main())


def _child(argv: list[str]) -> None:
    import gc

    gc.collect()
    gc.freeze()  # TensorFlow's heap out of the collector's scans, as the server does
    kind = argv[0]
    if kind == "echo":
        echo_server(int(argv[1]), int(argv[2]))
        return
    if kind == "grpc-body":  # a gRPC message as on the wire: flag, length, PredictRequest
        message = _predict_request(argv[2]).SerializeToString()
        Path(argv[1]).write_bytes(b"\0" + len(message).to_bytes(4, "big") + message)
        return
    if kind == "inproc":
        print(
            json.dumps(
                {
                    "examples_per_sec": in_process(
                        argv[1], int(argv[2]), float(argv[3]), int(argv[4])
                    )
                }
            )
        )
        return
    api, target, model, clients, seconds = argv[1:6]
    load = _grpc_load if api == "grpc" else _rest_load
    t0 = time.perf_counter()
    lat = asyncio.run(load(target, model, int(clients), float(seconds)))
    wall = time.perf_counter() - t0
    lat.sort()
    print(
        json.dumps(
            {
                "requests_per_sec": len(lat) / wall,
                "p50_ms": 1e3 * lat[len(lat) // 2],
                "p99_ms": 1e3 * lat[int(len(lat) * 0.99)],
            }
        )
    )


def h2load(api: str, target: str, model: str, clients: int, seconds: float, workdir: Path) -> dict:
    """The load from h2load: ``clients`` connections, one request in flight on each."""
    body, log = workdir / f"{api}-{model}.body", workdir / "h2load.log"
    if api == "grpc":
        _run_child("grpc-body", str(body), model)
        url = f"http://{target}/tensorflow.serving.PredictionService/Predict"
        flags = ["-H", "content-type: application/grpc", "-H", "te: trailers"]
    else:
        body.write_text(json.dumps({"instances": _image().tolist()}))
        url = f"{target}/v1/models/{model}:predict"
        flags = ["--h1", "-H", "content-type: application/json"]
    log.unlink(missing_ok=True)
    out = subprocess.run(
        [
            "h2load",
            "-D",
            f"{seconds:g}",
            "-c",
            str(clients),
            "-m",
            "1",
            "-d",
            str(body),
            "--log-file",
            str(log),
            *flags,
            url,
        ],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    rows = [line.split("\t") for line in log.read_text().splitlines()]
    bad = sum(row[1] != "200" for row in rows)
    if out.count("finished in") != 1 or bad or not rows:
        sys.exit(f"h2load against {url}: {bad} of {len(rows)} answers not 200\n{out[-2000:]}")
    rps = float(out.split("finished in", 1)[1].split(",")[1].split()[0])
    lat = sorted(int(row[2]) / 1e6 for row in rows)
    return {
        "requests_per_sec": rps,
        "p50_ms": 1e3 * lat[len(lat) // 2],
        "p99_ms": 1e3 * lat[int(len(lat) * 0.99)],
    }


def _not_ok(url: str) -> int:
    """Requests the server answered with a status other than OK (from its Prometheus page)."""
    import httpx

    page = httpx.get(f"{url}/monitoring/prometheus/metrics", timeout=10).text
    return sum(
        int(float(line.rsplit(" ", 1)[1]))
        for line in page.splitlines()
        if line.startswith(":tensorflow:serving:request_count") and 'status="OK"' not in line
    )


def _run_child(*args: str) -> dict:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.run(
        [sys.executable, __file__, "--child", *args],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if out.returncode:
        sys.exit(f"{args} failed:\n{out.stderr[-3000:]}")
    lines = out.stdout.strip().splitlines()
    return json.loads(lines[-1]) if lines else {}


def _start_server(
    root: Path | None, model: str, batching: Path | None, extra: tuple[str, ...] = ()
) -> tuple:
    """`mirrorfit serve` for ``model`` (the echo server when ``root`` is None)."""
    port, rest = _free_port(), _free_port()
    args = (
        [
            sys.executable,
            "-m",
            "mirrorfit.cli",
            "serve",
            f"--port={port}",
            f"--rest_api_port={rest}",
            f"--model_name={model}",
            f"--model_base_path={root / model}",
            "--file_system_poll_wait_seconds=-1",
            f"--monitoring_config_file={root / 'monitoring.config'}",
            *extra,
        ]
        if root
        else [sys.executable, __file__, "--child", "echo", str(port), str(rest)]
    )
    if batching:
        args += ["--enable_batching", f"--batching_parameters_file={batching}"]
    proc = subprocess.Popen(
        args,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )
    import httpx

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{rest}/readyz", timeout=1).status_code == 200:
                return proc, f"127.0.0.1:{port}", f"http://127.0.0.1:{rest}"
        except httpx.HTTPError:
            time.sleep(0.3)
    proc.kill()
    sys.exit("server did not start")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(sys.argv[2:])
        return
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="mlp,cnn")
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--seconds", type=float, default=10)
    p.add_argument("--apis", default="grpc,rest")
    p.add_argument("--batch-timeout-micros", type=int, default=2000)
    cpus = os.cpu_count() or 1
    # One model call per core, each on one thread: on a few cores that beat one call spread
    # over all of them (two calls' worth of ops fighting over the cores the clients need).
    p.add_argument("--batch-threads", type=int, default=cpus, help="default: the cores")
    p.add_argument("--max-batch-size", type=int, default=0, help="default: --clients")
    p.add_argument(
        "--server-flags",
        help="extra `mirrorfit serve` flags (default: "
        "--tensorflow_intra_op_parallelism=1 --tensorflow_inter_op_parallelism=CORES)",
        default=f"--tensorflow_intra_op_parallelism=1 --tensorflow_inter_op_parallelism={cpus}",
    )
    p.add_argument("--load-generator", choices=["python", "h2load"], default="python")
    a = p.parse_args()
    if a.load_generator == "h2load" and not shutil.which("h2load"):
        sys.exit(
            "--load-generator h2load: h2load is not installed (Debian: apt-get install "
            "nghttp2-client); or use --load-generator python"
        )
    models = a.models.split(",")
    root = Path(tempfile.mkdtemp(prefix="mirrorfit-load-"))
    subprocess.run(
        [
            sys.executable,
            "-c",
            f"import sys; sys.path.insert(0, {str(ROOT / 'benchmarks')!r}); "
            f"import serving_load; from pathlib import Path; "
            f"serving_load.export_models(Path({str(root)!r}), {models!r})",
        ],
        check=True,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
        capture_output=True,
    )
    (root / "monitoring.config").write_text(
        'prometheus_config { enable: true, path: "/monitoring/prometheus/metrics" }\n'
    )

    def load(api: str, target: str, url: str, model: str) -> dict:
        if a.load_generator == "h2load":
            return h2load(api, target if api == "grpc" else url, model, a.clients, a.seconds, root)
        return _run_child(
            "load", api, target if api == "grpc" else url, model, str(a.clients), str(a.seconds)
        )

    batching = root / "batching.config"
    max_batch = a.max_batch_size or a.clients
    batching.write_text(
        f"max_batch_size {{ value: {max_batch} }} batch_timeout_micros {{ value: "
        f"{a.batch_timeout_micros} }} max_enqueued_batches {{ value: 1000 }} "
        f"num_batch_threads {{ value: {a.batch_threads} }}"
    )
    print(
        f"{a.clients} concurrent clients, {a.seconds:g} s per run, one image per request; "
        f"batching: max_batch_size {max_batch}, timeout {a.batch_timeout_micros} us, "
        f"{a.batch_threads} batch thread(s); load generator: {a.load_generator}; server "
        f"flags: {a.server_flags or '-'}\n",
        flush=True,
    )
    echo = {}
    proc, target, url = _start_server(None, "echo", None)
    try:
        for api in a.apis.split(","):
            echo[api] = load(api, target, url, "echo")["requests_per_sec"]
            print(
                f"{api:4} transport alone (echo server, no model): {echo[api]:8,.0f} requests/s",
                flush=True,
            )
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    print(flush=True)
    for model in models:
        path = str(next((root / model).iterdir()))
        # the better of one call on every core and one call per core: the stricter limit
        limit1, limitn = (
            max(
                _run_child("inproc", path, str(batch), "3", str(callers))["examples_per_sec"]
                for callers in (1, os.cpu_count() or 1)
            )
            for batch in (1, a.clients)
        )
        print(
            f"{model.upper()} in-process limit: {limit1:,.0f} examples/s at batch 1, "
            f"{limitn:,.0f} at batch {a.clients}"
        )
        results = {}
        for batch_on in (False, True):
            proc, target, url = _start_server(
                root, model, batching if batch_on else None, tuple(a.server_flags.split())
            )
            try:
                for api in a.apis.split(","):
                    r = load(api, target, url, model)
                    results[(api, batch_on)] = r
                    print(
                        f"  {api:4} batching {'on ' if batch_on else 'off'}: "
                        f"{r['requests_per_sec']:8,.0f} requests/s  p50 {r['p50_ms']:7.1f} ms"
                        f"  p99 {r['p99_ms']:7.1f} ms  = {r['requests_per_sec'] / limitn:.0%} "
                        f"of the batch-{a.clients} limit",
                        flush=True,
                    )
                errors = _not_ok(url)
                if errors:
                    sys.exit(f"{model}: the server answered {errors} requests with an error status")
            finally:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=60)
        for api in a.apis.split(","):
            on, off = results[(api, True)], results[(api, False)]
            bound = 1 / (1 / echo[api] + 1 / limitn)
            print(
                f"  {api}: batching / no batching = "
                f"{on['requests_per_sec'] / off['requests_per_sec']:.2f}x; bound from the "
                f"echo and the limit: {bound:,.0f} requests/s = {bound / limitn:.0%} of the "
                f"limit; batching reached {on['requests_per_sec'] / bound:.0%} of that bound"
            )
        print(flush=True)


if __name__ == "__main__":
    main()
