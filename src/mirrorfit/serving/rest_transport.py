"""How the REST port accepts and bounds connections: uvicorn's own settings plus the two bounds
uvicorn lacks, a deadline and a size cap for each request head, on either parser (h11 or
httptools). (why: docs/architecture.md#serving)
"""

from __future__ import annotations

import json
from dataclasses import dataclass

HEAD_BYTES = 64 * 1024  # request line + headers; h11's own default is 16 KiB, httptools has none
HTTP_IMPLS = ("auto", "h11", "httptools")
EVENT_LOOPS = ("auto", "asyncio", "uvloop")


@dataclass(frozen=True)
class RestLimits:
    """The REST port's bounds; see the serving flags in docs/serving.md for why these defaults."""

    max_connections: int = 500
    keepalive_timeout_s: float = 5.0
    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    max_buffered_bytes: int = 256 * 1024 * 1024
    http_impl: str = "auto"


class _HeadLimits:
    """Mixed into uvicorn's H11Protocol / HttpToolsProtocol: a connection has ``head_timeout_s``
    (seconds) from opening, or from its previous response, to deliver a complete request head of
    at most HEAD_BYTES, else it is closed (408 / 431 if it sent part). Counted on incomplete heads
    and on each parsed head; parser refusals answered in TF Serving's JSON.
    """

    head_timeout_s: float

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._head_timer = None
        self._refusal: tuple[int, str, str] | None = None
        self._await_head()

    def connection_lost(self, exc) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        idle = self._idle()
        super().data_received(data)
        if idle and self._idle() and not self.transport.is_closing():  # still no whole head
            self._head_bytes += len(data)
            if self._head_bytes > HEAD_BYTES:
                self._refuse(
                    431,
                    "Request Header Fields Too Large",
                    f"Request head is larger than {HEAD_BYTES} bytes",
                )

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._await_head()

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to what its parser refused: ours, if a size check refused it."""
        self._refuse(*(self._refusal or (400, "Bad Request", msg)))

    def _over(self, size: int, url: bool = False) -> bool:
        """Whether a head (or its request target alone, ``url``) counted to ``size`` bytes
        is over the cap; if so, the answer to give is kept for send_400_response."""
        if size <= HEAD_BYTES:
            return False
        if url:  # TF Serving's JSON, not the parser's plain-text 400
            self._refusal = (414, "URI Too Long", f"Request URI is longer than {HEAD_BYTES} bytes")
        else:
            self._refusal = (
                431,
                "Request Header Fields Too Large",
                f"Request head is larger than {HEAD_BYTES} bytes",
            )
        return True

    def _idle(self) -> bool:
        """No request in progress: whatever arrives next is a request head."""
        return self.cycle is None or self.cycle.response_complete

    def _await_head(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
        self._head_bytes = 0
        self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_late)

    def _head_late(self) -> None:
        self._head_timer = None
        if not self._idle() or self.transport.is_closing():
            return  # a request arrived in time (its body has its own timeout, in rest.py)
        if self._head_bytes:
            self._refuse(
                408,
                "Request Timeout",
                f"Request head not received within "
                f"{self.head_timeout_s * 1e3:.0f} ms (--rest_api_header_timeout_in_ms)",
            )
        else:  # an idle connection: close it quietly, as a keep-alive timeout does
            self.transport.close()

    def _refuse(self, status: int, reason: str, message: str) -> None:
        if self.transport.is_closing():
            return
        body = json.dumps({"error": message}).encode()
        self.transport.write(
            b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\nconnection: close\r\n"
            b"content-length: %d\r\n\r\n%s" % (status, reason.encode(), len(body), body)
        )
        self.transport.close()


class _HeadTooLarge(Exception):
    """Raised in a httptools callback to stop parsing a head over the cap (uvicorn then
    answers through send_400_response)."""


# A request line's method, spaces and version, and each header line's ": " and CRLF: counted
# with the parsed target and headers, a head's size is within a few bytes of what was sent.
_REQUEST_LINE_BYTES, _HEADER_LINE_BYTES = len("OPTIONS  HTTP/1.1\r\n\r\n"), len(": \r\n")


class _HttpToolsHeadLimits(_HeadLimits):
    """httptools: the head counted as its callbacks deliver the target and each header."""

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._parsed_head = _REQUEST_LINE_BYTES

    def on_url(self, url: bytes) -> None:
        self._parsed_head += len(url)
        if self._over(self._parsed_head, url=True):  # before httptools.parse_url fails on it
            raise _HeadTooLarge
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._parsed_head += len(name) + len(value) + _HEADER_LINE_BYTES
        if self._over(self._parsed_head):
            raise _HeadTooLarge
        super().on_header(name, value)


class _H11HeadLimits(_HeadLimits):
    """h11: each parsed request counted before uvicorn starts it; h11's own cap on an
    incomplete head (the same HEAD_BYTES) answers 431 too."""

    def connection_made(self, transport) -> None:
        import h11

        super().connection_made(transport)
        next_event = self.conn.next_event

        def checked_next_event():
            try:
                event = next_event()
            except h11.RemoteProtocolError as e:
                if e.error_status_hint == 431:
                    self._over(HEAD_BYTES + 1)
                raise
            if isinstance(event, h11.Request):
                line = _REQUEST_LINE_BYTES + len(event.target)
                head = line + sum(
                    len(name) + len(value) + _HEADER_LINE_BYTES for name, value in event.headers
                )
                if self._over(line, url=True) or self._over(head):
                    raise h11.RemoteProtocolError(self._refusal[2])
            return event

        self.conn.next_event = checked_next_event


def protocol_class(http_impl: str, head_timeout_s: float) -> type:
    """uvicorn's protocol for ``http_impl`` (auto: httptools when installed) with head limits."""
    if http_impl == "auto":
        try:
            import httptools  # noqa: F401

            http_impl = "httptools"
        except ImportError:
            http_impl = "h11"
    if http_impl == "httptools":
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as base

        limits = _HttpToolsHeadLimits
    else:
        from uvicorn.protocols.http.h11_impl import H11Protocol as base

        limits = _H11HeadLimits
    return type(f"Bounded{base.__name__}", (limits, base), {"head_timeout_s": head_timeout_s})


def uvicorn_config(app, *, host: str, port: int, limits: RestLimits, graceful_shutdown_s: float):
    """uvicorn's Config for the REST port. ``limit_concurrency`` answers 503 to a request when
    this many connections or requests are open; logs go through the server's JSON handler."""
    import uvicorn

    return uvicorn.Config(
        app,
        host=host,
        port=port,
        http=protocol_class(limits.http_impl, limits.header_timeout_s),
        limit_concurrency=limits.max_connections,
        timeout_keep_alive=limits.keepalive_timeout_s,
        h11_max_incomplete_event_size=HEAD_BYTES,
        timeout_graceful_shutdown=graceful_shutdown_s,
        log_config=None,
        log_level="warning",
        access_log=False,
        lifespan="off",
        ws="none",
    )


def run(main, event_loop: str):
    """Run coroutine ``main`` to completion on ``event_loop`` (auto: uvloop when installed)."""
    import asyncio

    if event_loop in ("auto", "uvloop"):
        try:
            import uvloop
        except ImportError:
            if event_loop == "uvloop":
                raise
        else:
            return uvloop.run(main)
    return asyncio.run(main)


__all__ = ["RestLimits", "HTTP_IMPLS", "EVENT_LOOPS", "protocol_class", "uvicorn_config", "run"]
