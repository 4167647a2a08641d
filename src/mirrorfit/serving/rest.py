"""TF Serving's REST API on Starlette (model_servers/http_rest_api_handler.cc): every
``/v1/...`` path through TF Serving's two regexes, plus the Prometheus page and ``/readyz``.
Errors are ``{"error": message}`` with TF Serving's HTTP codes; nothing a client sends is a
500. Bodies are bounded in size, arrival time and bytes held at once; large ones are decoded
off the event loop, which gRPC shares.
"""

from __future__ import annotations

import asyncio
import gzip
import io
import json
import logging
import re
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from urllib.parse import unquote

import grpc

from google.protobuf import json_format
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route
from tensorflow_serving.apis import get_model_metadata_pb2

from mirrorfit.serving import json_codec
from mirrorfit.serving.errors import INTERNAL_MESSAGE, ServingError, invalid, log_internal_error
from mirrorfit.serving.log_limit import LogLimiter
from mirrorfit.serving.metrics import CONTENT_TYPE, ServerMetrics
from mirrorfit.serving.rest_transport import RestLimits
from mirrorfit.serving.service import ModelService, Spec

log = logging.getLogger("mirrorfit.serving")

_POST = re.compile(
    r"/v1/models/([^/:]+)(?:(?:/versions/([0-9]+))|(?:/labels/([^/:]+)))?:"
    r"(classify|regress|predict)",
    re.IGNORECASE,
)
_GET = re.compile(
    r"/v1/models(?:/([^/:]+))?(?:(?:/versions/([0-9]+))|(?:/labels/([^/:]+)))?"
    r"(?:/(metadata))?",
    re.IGNORECASE,
)
# Bodies (and outputs) up to this size are decoded (encoded) on the event loop: it costs less
# than the hop to a thread; larger ones (up to 64 MiB of JSON, seconds of parsing) go to a thread
# so gRPC and the other REST connections keep being served meanwhile.
OFF_LOOP_BYTES = 64 * 1024


def _json(data, status: int = 200, indent: int | None = 4) -> Response:
    body = json.dumps(data, indent=indent, allow_nan=True)
    return Response(body, status_code=status, media_type="application/json")


def _error(e: ServingError) -> Response:
    return _json({"error": e.message}, e.http_status)


def _spec(name: str, version: str | None, label: str | None) -> Spec:
    if version is not None:
        try:
            number = int(version)
            if number >= 2**63:
                raise ValueError
        except ValueError:
            raise invalid(f"Failed to convert version: {version} to numeric.") from None
        return Spec(unquote(name), version=number)
    return Spec(unquote(name), label=unquote(label) if label else None)


class RestApi:
    """The REST handlers over a :class:`ModelService`."""

    def __init__(
        self,
        service: ModelService,
        metrics: ServerMetrics,
        *,
        metrics_path: str | None,
        max_body_bytes: int,
        cors: bool = False,
        limits: RestLimits = RestLimits(),
    ) -> None:
        self.service, self.metrics = service, metrics
        self.metrics_path = metrics_path
        self.max_body_bytes = max_body_bytes
        self.cors = cors
        self.limits = limits
        self.budget = BodyBudget(limits.max_buffered_bytes)
        self._client_faults = LogLimiter(60.0)
        # two threads: decoding holds the GIL, more would only add memory in flight
        self._decoder = ThreadPoolExecutor(max_workers=2, thread_name_prefix="rest-decode")

    def app(self) -> Starlette:
        routes = [Route("/readyz", self.readyz, methods=["GET"])]
        if self.metrics_path:
            routes.append(Route(self.metrics_path, self.prometheus, methods=["GET"]))
        routes.append(
            Route(
                "/{path:path}",
                self.dispatch,
                methods=["GET", "POST", "OPTIONS", "PUT", "DELETE", "PATCH"],
            )
        )
        return Starlette(routes=routes)

    async def readyz(self, request: Request) -> Response:
        ready = self.service.repository.ready()
        return _json({"ready": ready}, 200 if ready else 503)

    async def prometheus(self, request: Request) -> Response:
        return Response(self.metrics.exposition(), media_type=CONTENT_TYPE)

    async def dispatch(self, request: Request) -> Response:
        # TF Serving matches its regexes on the path as sent and then percent-decodes the name
        # and label once (_spec): on the decoded path, %2F in a name would split it and %2541
        # would be decoded twice.
        raw = request.scope.get("raw_path")
        path = raw.decode("utf-8", "replace") if raw is not None else request.url.path
        method = request.method
        if not re.fullmatch(r"(?i)/v1/.*", path):
            return Response(status_code=404)  # TF Serving: a bare 404 outside /v1/
        try:
            response = await self._dispatch(request, path, method)
        except Exception as e:  # noqa: BLE001 - a bug, never the client's: no traceback out
            log_internal_error(e, entrypoint="REST", method=method, path=path[:200])
            response = _json({"error": INTERNAL_MESSAGE}, 500)
        if self.cors:
            response.headers.update(
                {
                    "Access-Control-Allow-Origin": "*",
                    "Access-Control-Allow-Methods": "POST, GET",
                    "Access-Control-Allow-Headers": "Content-Type",
                }
            )
        return response

    async def _dispatch(self, request: Request, path: str, method: str) -> Response:
        if method == "OPTIONS":
            if re.match(r"https?://", request.headers.get("origin", "")):
                return _json({})
            return _error(invalid("Origin header is missing in CORS preflight"))
        if method == "GET":
            m = _GET.fullmatch(path)
            if m and m.group(1) is None:
                return _error(invalid("Missing model name in request."))
            if m:
                return await self._get(*m.groups())
        elif method == "POST":
            m = _POST.fullmatch(path)
            if m:
                return await self._post(request, *m.groups())
        return _error(invalid(f"Malformed request: {method} {path}"))

    async def _get(self, name, version, label, metadata) -> Response:
        api = "metadata" if metadata else "status"
        start = time.perf_counter()
        try:
            spec = _spec(name, version, label)
            if metadata:
                body = self._metadata(spec)
            else:
                # TF Serving's status endpoint does not resolve labels: every version is listed
                statuses = self.service.status(Spec(spec.name, spec.version))
                body = {
                    "model_version_status": [
                        {
                            "version": str(s.version),
                            "state": s.state,
                            "status": {
                                "error_code": s.error_code,
                                "error_message": s.error_message,
                            },
                        }
                        for s in statuses
                    ]
                }
            self._record(name, api, "OK", start)
            return _json(body, indent=1 if not metadata else 4)
        except ServingError as e:
            self._record(name, api, e.code.name, start)
            return _error(e)

    def _metadata(self, spec: Spec) -> dict:
        servable = self.service.metadata(spec)
        defs = get_model_metadata_pb2.SignatureDefMap()
        for key, sdef in servable.signature_defs.items():
            defs.signature_def[key].CopyFrom(sdef)
        body = {
            "model_spec": {
                "name": servable.name,
                "signature_name": "",
                "version": str(servable.version),
            },
            "metadata": {
                "signature_def": json_format.MessageToDict(defs, preserving_proto_field_name=True)
            },
        }
        if servable.class_names is not None:  # mirrorfit's export: label i's name at i
            body["metadata"]["class_names"] = list(servable.class_names)
        return body

    async def _post(self, request: Request, name, version, label, method) -> Response:
        method = method.lower()
        start = time.perf_counter()
        examples = 0
        try:
            with self.budget.hold() as held:
                spec = _spec(name, version, label)
                body = await self._body(request, held)
                gzipped = request.headers.get("content-encoding", "").lower() == "gzip"
                # decoded as predict bodies are; waits for the model without holding a thread
                handler = self._predict if method == "predict" else partial(self._examples, method)
                response, examples, spec = await handler(spec, body, gzipped, held)
            self._record(spec.name, method, "OK", start, examples)
            return response
        except ServingError as e:
            self._record(unquote(name), method, e.code.name, start, examples)
            if e.code == grpc.StatusCode.CANCELLED:  # the client's doing, not ours: counted
                self._client_faults.log(
                    "disconnect",
                    logging.INFO,
                    "client disconnected",
                    entrypoint="REST",
                    model=unquote(name)[:200],
                    error=e.message,
                )
            response = _error(e)
            if e.http_status in (408, 413):  # the rest of the body is not worth reading
                response.headers["connection"] = "close"
            return response

    async def _predict(
        self, spec: Spec, body: bytes, gzipped: bool, held: "_Held"
    ) -> tuple[Response, int, Spec]:
        servable, sig, inputs, rows, spec = await self._maybe_off_loop(
            _big(body, gzipped), self._predict_inputs, spec, body, gzipped, held
        )
        outputs = await self.service.predict_async(servable, sig, inputs)
        n = next(iter(inputs.values())).shape[0] if rows else 0
        size = sum(v.size for v in outputs.values())
        response = await self._maybe_off_loop(
            size * 8 > OFF_LOOP_BYTES, _predict_response, outputs, rows
        )
        return response, n, spec

    def _predict_inputs(self, spec: Spec, body: bytes, gzipped: bool, held: "_Held"):
        doc, spec = self._decode(spec, body, gzipped, held)
        servable, sig = self.service.resolve_signature(spec, entrypoint="REST")
        inputs, rows = json_codec.predict_inputs(doc, sig)
        return servable, sig, inputs, rows, spec

    async def _examples(
        self, method: str, spec: Spec, body: bytes, gzipped: bool, held: "_Held"
    ) -> tuple[Response, int, Spec]:
        servable, sig, context, items, spec = await self._maybe_off_loop(
            _big(body, gzipped), self._examples_input, method, spec, body, gzipped, held
        )
        if method == "classify":
            results = await self.service.classify_async(
                servable, sig, context, items, json_codec.example
            )
            result = {"results": [[[label, score] for label, score in r] for r in results]}
        else:
            result = {
                "results": await self.service.regress_async(
                    servable, sig, context, items, json_codec.example
                )
            }
        return _json(result), len(items), spec

    def _examples_input(self, method: str, spec: Spec, body: bytes, gzipped: bool, held: "_Held"):
        doc, spec = self._decode(spec, body, gzipped, held)
        servable, sig = self.service.resolve_signature(spec, api=method, entrypoint="REST")
        context, items = json_codec.examples(doc, method)  # still JSON: converted by the service
        return servable, sig, context, items, spec

    def _decode(self, spec: Spec, body: bytes, gzipped: bool, held: "_Held") -> tuple:
        """The JSON document of a body, and the spec with its signature name."""
        if gzipped:
            try:
                body = _gunzip(body, self.max_body_bytes)
            except (OSError, EOFError, zlib.error):
                raise invalid("Failed to decompress gzip request body") from None
            held.take(len(body))
        doc = json_codec.parse_body(body, yielding=_big(body, gzipped))
        signature = doc.get("signature_name", "") if isinstance(doc, dict) else ""
        if not isinstance(signature, str):
            raise invalid(
                f"JSON Value: {json_codec.debug_json(doc)} not formatted correctly. "
                "'signature_name' key must be a string value."
            )
        return doc, Spec(spec.name, spec.version, spec.label, signature)

    async def _maybe_off_loop(self, big: bool, fn, *args):
        if not big:
            return fn(*args)
        return await asyncio.get_running_loop().run_in_executor(self._decoder, fn, *args)

    async def _body(self, request: Request, held: "_Held") -> bytes:
        """The body, within --max_request_bytes, the body timeout and the shared budget."""
        declared = request.headers.get("content-length")
        if declared and re.fullmatch("[0-9]+", declared):
            if int(declared) > self.max_body_bytes:
                raise _too_large(
                    f"Request body of {declared} bytes is larger than the limit "
                    f"of {self.max_body_bytes} bytes (--max_request_bytes)"
                )
            held.take(int(declared))  # refused before a byte of it is read
        try:
            return await asyncio.wait_for(
                self._read(request, held, counted=bool(held.bytes)), self.limits.body_timeout_s
            )
        except asyncio.TimeoutError:
            raise ServingError(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                (
                    f"Request body not received within {self.limits.body_timeout_s * 1e3:.0f} ms "
                    "(--rest_api_body_timeout_in_ms)"
                ),
                http=408,
            ) from None

    async def _read(self, request: Request, held: "_Held", counted: bool) -> bytes:
        chunks, size = [], 0
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if size > self.max_body_bytes:
                    raise _too_large(
                        f"Request body is larger than the limit of "
                        f"{self.max_body_bytes} bytes (--max_request_bytes)"
                    )
                if not counted:  # chunked: no length declared up front
                    held.take(len(chunk))
                chunks.append(chunk)
        except ClientDisconnect:  # it hung up: TF Serving's code for a cancelled request
            raise ServingError(
                grpc.StatusCode.CANCELLED,
                f"Client disconnected after {size} bytes of the request body",
                http=499,
            ) from None
        return b"".join(chunks)

    def _record(self, model: str, api: str, status: str, start: float, examples: int = 0):
        elapsed = time.perf_counter() - start
        self.metrics.record(
            model=model,
            api=api,
            entrypoint="REST",
            status=status,
            seconds=elapsed,
            examples=examples,
        )
        log.debug(
            "request",
            extra={
                "entrypoint": "REST",
                "model": model,
                "api": api,
                "status": status,
                "latency_ms": round(elapsed * 1e3, 3),
            },
        )


def _big(body: bytes, gzipped: bool) -> bool:
    """Whether to decode off the event loop (a small gzip body may inflate to 64 MiB)."""
    return gzipped or len(body) > OFF_LOOP_BYTES


def _predict_response(outputs, rows: bool) -> Response:
    return _json(json_codec.predict_response(outputs, rows))


class BodyBudget:
    """The request-body bytes all REST requests hold at once (--rest_api_max_buffered_bytes).
    Each body may be up to --max_request_bytes; without a shared bound, many at once exhaust
    memory. A request that would go over answers 503 at once rather than wait."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self._lock = threading.Lock()  # taken on the event loop and in decode threads

    def hold(self) -> "_Held":
        return _Held(self)

    def _take(self, n: int) -> None:
        with self._lock:
            if self.held + n > self.limit:
                raise ServingError(
                    grpc.StatusCode.UNAVAILABLE,
                    (
                        f"Server busy: request bodies in progress already hold {self.held} of "
                        f"{self.limit} bytes (--rest_api_max_buffered_bytes); retry later"
                    ),
                )
            self.held += n

    def _give(self, n: int) -> None:
        with self._lock:
            self.held -= n


class _Held:
    """One request's share of a :class:`BodyBudget`, given back when the request ends."""

    def __init__(self, budget: BodyBudget) -> None:
        self.budget, self.bytes = budget, 0

    def take(self, n: int) -> None:
        self.budget._take(n)
        self.bytes += n

    def __enter__(self) -> "_Held":
        return self

    def __exit__(self, *exc) -> None:
        self.budget._give(self.bytes)


def _too_large(message: str) -> ServingError:
    return ServingError(grpc.StatusCode.RESOURCE_EXHAUSTED, message, http=413)


def _gunzip(body: bytes, limit: int) -> bytes:
    with gzip.GzipFile(fileobj=io.BytesIO(body)) as f:
        out = f.read(limit + 1)
    if len(out) > limit:
        raise _too_large(
            f"Decompressed request body is larger than the limit of {limit} bytes "
            "(--max_request_bytes)"
        )
    return out


__all__ = ["RestApi"]
