"""TF Serving's REST API on Starlette (model_servers/http_rest_api_handler.cc).

Every ``/v1/...`` path goes through TF Serving's two regexes; the Prometheus page (when enabled)
and ``/readyz`` are the only other paths. Errors are ``{"error": message}`` with TF Serving's
HTTP codes; nothing a client sends produces a 500.
"""

from __future__ import annotations

import gzip
import io
import json
import logging
import re
import time
import zlib

import grpc
from urllib.parse import unquote

from google.protobuf import json_format
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from tensorflow_serving.apis import get_model_metadata_pb2

from mirrorfit.serving import json_codec
from mirrorfit.serving.errors import ServingError, invalid
from mirrorfit.serving.metrics import CONTENT_TYPE, ServerMetrics
from mirrorfit.serving.service import ModelService, Spec, merge_context

log = logging.getLogger("mirrorfit.serving")

_POST = re.compile(r"/v1/models/([^/:]+)(?:(?:/versions/(\d+))|(?:/labels/([^/:]+)))?:"
                   r"(classify|regress|predict)", re.IGNORECASE)
_GET = re.compile(r"/v1/models(?:/([^/:]+))?(?:(?:/versions/(\d+))|(?:/labels/([^/:]+)))?"
                  r"(?:/(metadata))?", re.IGNORECASE)


def _json(data, status: int = 200, indent: int | None = 4) -> Response:
    body = json.dumps(data, indent=indent, allow_nan=True)
    return Response(body, status_code=status, media_type="application/json")


def _error(e: ServingError) -> Response:
    return _json({"error": e.message}, e.http_status)


def _spec(name: str, version: str | None, label: str | None) -> Spec:
    if version is not None:
        try:
            number = int(version)
            if number >= 2 ** 63:
                raise ValueError
        except ValueError:
            raise invalid(f"Failed to convert version: {version} to numeric.") from None
        return Spec(unquote(name), version=number)
    return Spec(unquote(name), label=unquote(label) if label else None)


class RestApi:
    """The REST handlers over a :class:`ModelService`."""

    def __init__(self, service: ModelService, metrics: ServerMetrics, *,
                 metrics_path: str | None, max_body_bytes: int, cors: bool = False) -> None:
        self.service, self.metrics = service, metrics
        self.metrics_path = metrics_path
        self.max_body_bytes = max_body_bytes
        self.cors = cors

    def app(self) -> Starlette:
        routes = [Route("/readyz", self.readyz, methods=["GET"])]
        if self.metrics_path:
            routes.append(Route(self.metrics_path, self.prometheus, methods=["GET"]))
        routes.append(Route("/{path:path}", self.dispatch,
                            methods=["GET", "POST", "OPTIONS", "PUT", "DELETE", "PATCH"]))
        return Starlette(routes=routes)

    async def readyz(self, request: Request) -> Response:
        ready = self.service.repository.ready()
        return _json({"ready": ready}, 200 if ready else 503)

    async def prometheus(self, request: Request) -> Response:
        return Response(self.metrics.exposition(), media_type=CONTENT_TYPE)

    async def dispatch(self, request: Request) -> Response:
        path, method = request.url.path, request.method
        if not re.fullmatch(r"(?i)/v1/.*", path):
            return Response(status_code=404)  # TF Serving: a bare 404 outside /v1/
        response = await self._dispatch(request, path, method)
        if self.cors:
            response.headers.update({"Access-Control-Allow-Origin": "*",
                                     "Access-Control-Allow-Methods": "POST, GET",
                                     "Access-Control-Allow-Headers": "Content-Type"})
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
                body = {"model_version_status": [
                    {"version": str(s.version), "state": s.state,
                     "status": {"error_code": s.error_code, "error_message": s.error_message}}
                    for s in statuses]}
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
        return {"model_spec": {"name": servable.name, "signature_name": "",
                               "version": str(servable.version)},
                "metadata": {"signature_def": json_format.MessageToDict(
                    defs, preserving_proto_field_name=True)}}

    async def _post(self, request: Request, name, version, label, method) -> Response:
        method = method.lower()
        start = time.perf_counter()
        examples = 0
        try:
            spec = _spec(name, version, label)
            body = await self._body(request)
            doc = json_codec.parse_body(body)
            signature = doc.get("signature_name", "") if isinstance(doc, dict) else ""
            if not isinstance(signature, str):
                raise invalid(f"JSON Value: {json.dumps(doc)[:256]} not formatted correctly. "
                              "'signature_name' key must be a string value.")
            spec = Spec(spec.name, spec.version, spec.label, signature)
            if method == "predict":  # waits for the model without holding a thread
                result, examples = await self._predict(spec, doc)
            else:
                result, examples = await run_in_threadpool(self._examples, method, spec, doc)
            self._record(spec.name, method, "OK", start, examples)
            return _json(result)
        except ServingError as e:
            self._record(unquote(name), method, e.code.name, start, examples)
            return _error(e)

    async def _predict(self, spec: Spec, doc) -> tuple[dict, int]:
        servable, sig = self.service.resolve_signature(spec, entrypoint="REST")
        inputs, rows = json_codec.predict_inputs(doc, sig)
        outputs = await self.service.predict_async(servable, sig, inputs)
        n = next(iter(inputs.values())).shape[0] if rows else 0
        return json_codec.predict_response(outputs, rows), n

    def _examples(self, method: str, spec: Spec, doc) -> tuple[dict, int]:
        servable, sig = self.service.resolve_signature(spec, api=method, entrypoint="REST")
        context, items = json_codec.examples(doc, method)
        serialized = merge_context(context, items)
        if method == "classify":
            results = self.service.classify(servable, sig, serialized)
            return {"results": [[[label, score] for label, score in r] for r in results]}, \
                len(items)
        return {"results": self.service.regress(servable, sig, serialized)}, len(items)

    async def _body(self, request: Request) -> bytes:
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > self.max_body_bytes:
            raise _too_large(f"Request body of {declared} bytes is larger than the limit of "
                             f"{self.max_body_bytes} bytes (--max_request_bytes)")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.max_body_bytes:
                raise _too_large(f"Request body is larger than the limit of "
                                 f"{self.max_body_bytes} bytes (--max_request_bytes)")
            chunks.append(chunk)
        body = b"".join(chunks)
        if request.headers.get("content-encoding", "").lower() == "gzip":
            try:
                body = _gunzip(body, self.max_body_bytes)
            except (OSError, EOFError, zlib.error):
                raise invalid("Failed to decompress gzip request body") from None
        return body

    def _record(self, model: str, api: str, status: str, start: float, examples: int = 0):
        elapsed = time.perf_counter() - start
        self.metrics.record(model=model, api=api, entrypoint="REST", status=status,
                            seconds=elapsed, examples=examples)
        log.debug("request", extra={"entrypoint": "REST", "model": model, "api": api,
                                    "status": status, "latency_ms": round(elapsed * 1e3, 3)})


def _too_large(message: str) -> ServingError:
    return ServingError(grpc.StatusCode.RESOURCE_EXHAUSTED, message, http=413)


def _gunzip(body: bytes, limit: int) -> bytes:
    with gzip.GzipFile(fileobj=io.BytesIO(body)) as f:
        out = f.read(limit + 1)
    if len(out) > limit:
        raise _too_large(f"Decompressed request body is larger than the limit of {limit} bytes "
                         "(--max_request_bytes)")
    return out


__all__ = ["RestApi"]
