"""Prometheus metrics under TF Serving's names (``/`` -> ``:``), in a registry of the server's
own: request counts by model and status, request latency (µs) by model, API and entrypoint
(REST or GRPC), processed batch sizes, and example counts. Unknown models all count as
UNKNOWN_MODEL, so a client naming a new model per request cannot grow the page.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Collection

from prometheus_client import CollectorRegistry, Histogram, generate_latest

LATENCY_BUCKETS_US = (
    100,
    250,
    500,
    1e3,
    2.5e3,
    5e3,
    1e4,
    2.5e4,
    5e4,
    1e5,
    2.5e5,
    5e5,
    1e6,
    2.5e6,
    5e6,
    1e7,
)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
UNKNOWN_MODEL = "<unknown>"  # the model_name label of every name the server does not serve


def _labels(**labels: str) -> str:
    esc = {
        k: v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        for k, v in labels.items()
    }
    return "{" + ",".join(f'{k}="{v}"' for k, v in esc.items()) + "}"


class ServerMetrics:
    """Everything the server counts; ``exposition()`` is the Prometheus text page."""

    def __init__(self, model_names: Collection[str] | None = None) -> None:
        """``model_names``: the models served; others are recorded as UNKNOWN_MODEL (None:
        every name as given)."""
        self.model_names = frozenset(model_names) if model_names is not None else None
        self.registry = CollectorRegistry()
        # Counters are written by hand: prometheus_client renames counters to NAME_total,
        # and dashboards for TF Serving query its exact names.
        self._lock = threading.Lock()
        self._requests: Counter = Counter()  # (model, status) -> n
        self._examples: Counter = Counter()  # model -> n
        self.latency = Histogram(
            ":tensorflow:serving:request_latency",
            "Distribution of wall time (in microseconds) for Tensorflow Serving request.",
            ["model_name", "API", "entrypoint"],
            buckets=LATENCY_BUCKETS_US,
            registry=self.registry,
        )
        self.batch_size = Histogram(
            ":tensorflow:serving:batching_session:processed_batch_size",
            "Distribution of the batch sizes the model ran (padded).",
            ["model_name"],
            buckets=BATCH_BUCKETS,
            registry=self.registry,
        )
        self.runtime = Histogram(
            ":tensorflow:serving:runtime_latency",
            "Distribution of wall time (in microseconds) for the model call of a batch.",
            ["model_name", "API", "runtime"],
            buckets=LATENCY_BUCKETS_US,
            registry=self.registry,
        )

    def serve_models(self, model_names: Collection[str]) -> None:
        """The models served from now on (a reloaded config file)."""
        self.model_names = frozenset(model_names)

    def record(
        self,
        *,
        model: str,
        api: str,
        entrypoint: str,
        status: str,
        seconds: float,
        examples: int = 0,
    ) -> None:
        """One finished request: its model, API (predict, classify, ...), REST or GRPC, status
        code name (OK, INVALID_ARGUMENT, ...), wall time in seconds and example count."""
        if self.model_names is not None and model not in self.model_names:
            model = UNKNOWN_MODEL
        with self._lock:
            self._requests[(model, status)] += 1
            if examples:
                self._examples[model] += examples
        self.latency.labels(model, api, entrypoint).observe(seconds * 1e6)

    def record_batch(self, model: str, size: int, seconds: float) -> None:
        """One model call on a merged batch: its (padded) size and its run time."""
        self.batch_size.labels(model).observe(size)
        self.runtime.labels(model, "predict", "TF").observe(seconds * 1e6)

    def exposition(self) -> bytes:
        with self._lock:
            requests, examples = sorted(self._requests.items()), sorted(self._examples.items())
        lines = [
            "# HELP :tensorflow:serving:request_count The total number of requests.",
            "# TYPE :tensorflow:serving:request_count counter",
        ]
        lines += [
            f":tensorflow:serving:request_count{_labels(model_name=m, status=s)} {n}"
            for (m, s), n in requests
        ]
        lines += [
            "# HELP :tensorflow:serving:request_example_count_total The total number of examples.",
            "# TYPE :tensorflow:serving:request_example_count_total counter",
        ]
        lines += [
            f":tensorflow:serving:request_example_count_total{_labels(model=m)} {n}"
            for m, n in examples
        ]
        return ("\n".join(lines) + "\n").encode() + generate_latest(self.registry)


__all__ = ["ServerMetrics", "CONTENT_TYPE", "UNKNOWN_MODEL"]
