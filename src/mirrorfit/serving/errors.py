"""TF Serving's error model: a status code and a message; HTTP codes as its REST server maps
them (model_servers/http_server.cc), gRPC codes as they are."""

from __future__ import annotations

import logging
import traceback

import grpc

_HTTP = {
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNKNOWN: 500,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DATA_LOSS: 500,
    grpc.StatusCode.UNAUTHENTICATED: 401,
}
MAX_MESSAGE = 1024  # TF Serving cuts longer messages and marks them
INTERNAL_MESSAGE = "Internal error; see the server log"  # all a client learns of a bug


def log_internal_error(error: BaseException, **fields) -> None:
    """One JSON log line for an unexpected error (a bug, never the client's): its type, text
    and where it was raised, plus ``fields``; no traceback on stderr, nothing to the client."""
    frame = traceback.extract_tb(error.__traceback__)[-1]
    logging.getLogger("mirrorfit.serving").error(
        "internal error",
        extra={
            **fields,
            "error": f"{type(error).__name__}: {error}"[:500],
            "where": f"{frame.filename}:{frame.lineno} in {frame.name}",
        },
    )


class ServingError(Exception):
    """A request that cannot be served: ``code`` (a grpc.StatusCode) and a message."""

    def __init__(self, code: grpc.StatusCode, message: str, http: int | None = None) -> None:
        if len(message) > MAX_MESSAGE:
            message = message[:MAX_MESSAGE] + "...TRUNCATED"
        super().__init__(message)
        self.code = code
        self.message = message
        self._http = http  # only where HTTP has a better code than TF Serving's mapping

    @property
    def http_status(self) -> int:
        return self._http or _HTTP.get(self.code, 500)


def invalid(message: str) -> ServingError:
    return ServingError(grpc.StatusCode.INVALID_ARGUMENT, message)


def not_found(message: str) -> ServingError:
    return ServingError(grpc.StatusCode.NOT_FOUND, message)


__all__ = ["ServingError", "invalid", "not_found"]
