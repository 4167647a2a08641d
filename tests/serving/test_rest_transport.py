"""serving.rest_transport and the REST body bounds, on both HTTP parsers (h11 on asyncio,
httptools on uvloop): idle and slow connections are cut, the connection cap answers 503 and
frees itself, bodies are bounded in time and in bytes held at once, and a bug answers a plain
500 with one log line. In-process, with a stub service (no model): each parser in ~10 s."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time

import httpx
import pytest
import uvicorn

from mirrorfit.serving.errors import not_found
from mirrorfit.serving.metrics import ServerMetrics
from mirrorfit.serving.rest import RestApi
from mirrorfit.serving.rest_transport import HEAD_BYTES, RestLimits, run, uvicorn_config

LIMITS = dict(
    max_connections=8,
    keepalive_timeout_s=0.5,
    header_timeout_s=0.6,
    body_timeout_s=0.6,
    max_buffered_bytes=1000,
)


class _Repository:
    @staticmethod
    def ready() -> bool:
        return True


class _Service:
    """Enough of ModelService for requests that end before a model runs."""

    repository = _Repository()

    def resolve_signature(self, spec, **_):
        if spec.name == "bug":
            raise RuntimeError("boom")  # stands for a bug in the server
        raise not_found(f"Servable not found for request: Latest({spec.name})")


@pytest.fixture(
    scope="module",
    params=[("h11", "asyncio"), ("httptools", "uvloop")],
    ids=["h11-asyncio", "httptools-uvloop"],
)
def url(request):
    http_impl, loop = request.param
    limits = RestLimits(http_impl=http_impl, **LIMITS)
    api = RestApi(_Service(), ServerMetrics(), metrics_path=None, max_body_bytes=600, limits=limits)
    server = uvicorn.Server(
        uvicorn_config(api.app(), host="127.0.0.1", port=0, limits=limits, graceful_shutdown_s=1)
    )
    thread = threading.Thread(target=run, args=(server.serve(), loop), daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "server did not start"
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    return sock


def _read_until_closed(sock: socket.socket) -> tuple[bytes, float]:
    """Everything the server sends until it closes, and how long that took."""
    start, data = time.monotonic(), b""
    while chunk := sock.recv(65536):
        data += chunk
    return data, time.monotonic() - start


def test_requests_keep_alive_and_pipelining_still_work(url):
    with httpx.Client(timeout=10) as client:
        for _ in range(3):  # one connection, three requests
            assert client.get(f"{url}/readyz").json() == {"ready": True}
        r = client.post(f"{url}/v1/models/m:predict", json={"instances": [1]})
        assert r.status_code == 404 and "Latest(m)" in r.json()["error"]
    sock = _connect(url)
    sock.sendall(b"GET /readyz HTTP/1.1\r\nhost: x\r\n\r\n" * 2)  # two requests at once
    data, _ = _read_until_closed(sock)  # closed by the idle timeout after both answers
    assert data.count(b"HTTP/1.1 200") == 2


def test_an_idle_connection_is_closed_quietly(url):
    sock = _connect(url)  # connects, never sends a byte
    data, elapsed = _read_until_closed(sock)
    assert data == b"" and 0.3 < elapsed < 5


def test_headers_sent_a_byte_at_a_time_are_cut_with_408(url):
    sock = _connect(url)
    start = time.monotonic()
    try:
        for byte in b"GET /readyz HTTP/1.1\r\nhost: x\r\nx-slow: " + b"a" * 100:
            sock.sendall(bytes([byte]))
            time.sleep(0.05)
    except OSError:  # closed under our feet: that is the point
        pass
    data, _ = _read_until_closed(sock)
    assert data.startswith(b"HTTP/1.1 408"), data[:200]
    assert b"--rest_api_header_timeout_in_ms" in data
    assert time.monotonic() - start < 5


def test_a_head_over_the_size_cap_is_refused(url):
    sock = _connect(url)
    try:
        sock.sendall(b"GET /readyz HTTP/1.1\r\nx-big: " + b"a" * (HEAD_BYTES + 1024))
    except OSError:
        pass
    data, elapsed = _read_until_closed(sock)
    # both parsers: 431 in TF Serving's JSON (h11 answered its own plain-text 400)
    assert data.startswith(b"HTTP/1.1 431"), data[:200]
    assert json.loads(data.partition(b"\r\n\r\n")[2])["error"].startswith("Request head is")
    assert elapsed < 0.5  # at once, not at the header timeout


def _one_read(url: str, head: bytes) -> tuple[int, bytes]:
    """Send a whole request head in one write; the status and body of the answer."""
    sock = _connect(url)
    sock.sendall(head)
    data, _ = _read_until_closed(sock)
    status, _, body = data.partition(b"\r\n\r\n")
    return int(status.split()[1]), body


@pytest.mark.parametrize(
    "head, status",
    [
        # issue 27 item 4: a head that arrives whole in one read was not counted (200)
        (b"GET /readyz HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 100_000 + b"\r\n\r\n", 431),
        (
            b"GET /readyz HTTP/1.1\r\nhost: x\r\n"
            + b"".join(b"x-h%04d: %s\r\n" % (i, b"a" * 12) for i in range(3500))
            + b"\r\n",
            431,
        ),
        # a long URL: the parser's plain-text 400 (httptools) / 431 (h11), now 414 in JSON
        (b"GET /v1/models/" + b"m" * 70_000 + b" HTTP/1.1\r\nhost: x\r\n\r\n", 414),
        # behind a small request on the same connection (pipelined)
        (
            b"GET /readyz HTTP/1.1\r\nhost: x\r\n\r\nGET /readyz HTTP/1.1\r\nhost: x\r\nx-big: "
            + b"a" * 100_000
            + b"\r\n\r\n",
            431,
        ),
    ],
    ids=["one-header", "3500-headers", "long-url", "pipelined"],
)
def test_the_whole_head_counts_however_it_arrives(url, head, status):
    sock = _connect(url)
    sock.sendall(head)
    data, _ = _read_until_closed(sock)
    answers = data.split(b"HTTP/1.1 ")[1:]
    assert answers[-1].startswith(b"%d " % status), data[:300]
    assert "bytes" in json.loads(answers[-1].partition(b"\r\n\r\n")[2])["error"]
    # before it, at most the answer to the small request (the 431 may close the connection
    # before that request has run)
    assert all(a.startswith(b"200 ") for a in answers[:-1]) and len(answers) <= 2


def test_a_head_under_the_cap_is_served_and_a_malformed_one_gets_json(url):
    status, body = _one_read(
        url,
        b"GET /readyz HTTP/1.1\r\nhost: x\r\nx-big: "
        + b"a" * 60_000
        + b"\r\nconnection: close\r\n\r\n",
    )
    assert status == 200 and json.loads(body) == {"ready": True}
    status, body = _one_read(url, b"NOT HTTP\r\n\r\n")
    assert status == 400 and json.loads(body) == {"error": "Invalid HTTP request received."}


def test_a_slow_body_is_cut_with_408_and_the_connection_closed(url):
    sock = _connect(url)
    sock.sendall(
        b"POST /v1/models/m:predict HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n" + b"{" * 10
    )  # 10 of the 100 bytes, then nothing
    data, elapsed = _read_until_closed(sock)
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), data[:300]
    assert "--rest_api_body_timeout_in_ms" in json.loads(body)["error"]
    assert 0.3 < elapsed < 5


def test_connections_beyond_the_limit_get_503_and_the_server_recovers(url):
    idle = [_connect(url) for _ in range(LIMITS["max_connections"])]
    time.sleep(0.2)
    assert httpx.get(f"{url}/readyz", timeout=10).status_code == 503
    time.sleep(LIMITS["header_timeout_s"] + 0.5)  # the server closes the idle ones itself
    assert httpx.get(f"{url}/readyz", timeout=10).status_code == 200
    for sock in idle:
        assert sock.recv(10) == b""
        sock.close()


def test_bodies_held_at_once_are_bounded(url):
    holder = _connect(url)  # declares 600 bytes (the budget is 1000) and sends them slowly
    holder.sendall(b"POST /v1/models/m:predict HTTP/1.1\r\nhost: x\r\ncontent-length: 600\r\n\r\n{")
    time.sleep(0.1)
    r = httpx.post(f"{url}/v1/models/m:predict", content=b"[" * 500, timeout=10)
    assert r.status_code == 503 and "--rest_api_max_buffered_bytes" in r.json()["error"]
    _read_until_closed(holder)  # its body timeout gives its bytes back
    r = httpx.post(f"{url}/v1/models/m:predict", content=b"[" * 500, timeout=10)
    assert r.status_code == 400  # read and parsed: JSON Parse error


def test_a_bug_answers_500_with_one_log_line_and_no_details(url, caplog):
    with caplog.at_level(logging.ERROR, logger="mirrorfit.serving"):
        r = httpx.post(f"{url}/v1/models/bug:predict", json={"instances": [1]}, timeout=10)
    assert r.status_code == 500 and r.json() == {"error": "Internal error; see the server log"}
    [record] = [r for r in caplog.records if r.getMessage() == "internal error"]
    assert record.error == "RuntimeError: boom" and "resolve_signature" in record.where
    assert record.exc_info is None  # no traceback for the log to print
