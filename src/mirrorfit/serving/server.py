"""``mirrorfit serve``: assemble repository -> loader -> batcher -> REST and gRPC, and run them
until SIGTERM/SIGINT, then finish the requests in flight and stop."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import signal
import sys
import threading
from functools import partial

from mirrorfit.errors import ConfigError
from mirrorfit.serving import model_config, rest_transport
from mirrorfit.serving.batcher import Batcher
from mirrorfit.serving.config_reload import ConfigReloader
from mirrorfit.serving.loader import load_version
from mirrorfit.serving.metrics import ServerMetrics
from mirrorfit.serving.repository import ModelRepository
from mirrorfit.serving.service import ModelService
from mirrorfit.serving.settings import MAX_THREADS, ServeConfig, model_configs

log = logging.getLogger("mirrorfit.serving")


class _JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, event and the record's extra fields."""

    _PLAIN = set(vars(logging.makeLogRecord({})))

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": round(record.created, 3),
            "level": record.levelname.lower(),
            "event": record.getMessage(),
        }
        entry.update({k: v for k, v in vars(record).items() if k not in self._PLAIN})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def build(config: ServeConfig, configs: list[model_config.ModelConfig] | None = None):
    """The repository, service and metrics for ``config``, with every model loaded once."""
    if configs is None:
        configs = model_configs(config)
    params = model_config.read_batching_parameters(
        config.batching_parameters_file,
        cpus=min(os.cpu_count() or 1, MAX_THREADS),
        max_threads=MAX_THREADS,
    )
    metrics_path = model_config.read_monitoring_config(config.monitoring_config_file)
    metrics = ServerMetrics(model_names=[c.name for c in configs])
    batcher = Batcher(params, on_batch=metrics.record_batch) if config.enable_batching else None
    repository = ModelRepository(
        configs,
        loader=partial(_load, tags=config.saved_model_tags, warmup=config.enable_model_warmup),
        max_load_retries=config.max_num_load_retries,
        retry_interval_s=config.load_retry_interval_micros / 1e6,
        versions_always_present=config.servable_versions_always_present,
        on_unload=partial(_unload, batcher),
    )
    repository.poll_once()
    service = ModelService(
        repository,
        batcher,
        timeout_s=config.rest_api_timeout_in_ms / 1e3,
        max_rows=config.max_rows_per_request,
        max_in_flight=config.max_unbatched_in_flight,
        max_bytes=config.max_request_bytes,
    )
    return repository, service, metrics, metrics_path


def _reconfigure(repository: ModelRepository, metrics: ServerMetrics, configs) -> None:
    repository.reconfigure(configs)
    metrics.serve_models([c.name for c in configs])


def _load(name, version, path, *, tags, warmup):
    loaded = load_version(name, version, path, tags=tags, warmup=warmup)
    _freeze_heap()
    return loaded


def _unload(batcher: Batcher | None, name: str, version: int) -> None:
    if batcher is not None:
        batcher.forget(name, version)
    gc.unfreeze()  # so the unloaded version's reference cycles can be collected
    _freeze_heap()


def _freeze_heap() -> None:
    """Take everything alive now (TensorFlow and the loaded models: some 300k objects) out of
    the garbage collector's scans. Otherwise each full collection walks them all, a pause of
    100-200 ms for every request in flight: under load it doubled p99 latency."""
    gc.collect()
    gc.freeze()


def serve(config: ServeConfig) -> int:
    """Run the server until SIGTERM/SIGINT; returns the exit code."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JsonFormatter())
    log.addHandler(handler)
    log.setLevel(config.log_level.upper())
    log.propagate = False
    for name in ("uvicorn.error", "asyncio"):  # their warnings as JSON lines too
        logging.getLogger(name).addHandler(handler)
        logging.getLogger(name).propagate = False
    configs = model_configs(config)

    import tensorflow as tf

    # before any model loads: TF fixes its thread pools at the first op
    tf.config.threading.set_intra_op_parallelism_threads(config.tensorflow_intra_op_parallelism)
    tf.config.threading.set_inter_op_parallelism_threads(config.tensorflow_inter_op_parallelism)
    repository, service, metrics, metrics_path = build(config, configs)
    if config.rest_api_port:
        _check_port_free(config.host, config.rest_api_port, "--rest_api_port")
    repository.start_polling(config.file_system_poll_wait_seconds)
    reloader = None
    if config.model_config_file and config.model_config_file_poll_wait_seconds > 0:
        reloader = ConfigReloader(
            config.model_config_file,
            config.model_config_file_poll_wait_seconds,
            configs,
            partial(_reconfigure, repository, metrics),
        )
        reloader.start()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        # uvicorn re-raises the signal it handled once it has shut down, into the handler it
        # found: this one, so the gRPC side still gets its graceful stop.
        signal.signal(sig, lambda *_: stop.set())
    try:
        rest_transport.run(_serve(config, service, metrics, metrics_path, stop), config.event_loop)
    finally:
        if reloader is not None:
            reloader.stop()
        repository.stop()
        if service.batcher:
            service.batcher.close()
    return 0


async def _serve(
    config: ServeConfig,
    service: ModelService,
    metrics: ServerMetrics,
    metrics_path: str | None,
    stop: threading.Event,
) -> None:
    """gRPC (grpc.aio) and REST (uvicorn) on one event loop: no thread per waiting request."""
    import grpc
    import uvicorn

    from mirrorfit.serving.grpc_service import add_services
    from mirrorfit.serving.rest import RestApi

    # --max_request_bytes bounds gRPC messages too (TF Serving allows 2 GiB): a larger one is
    # refused by gRPC itself with RESOURCE_EXHAUSTED before it is read into memory. gRPC has
    # no shared byte budget as REST has: --grpc_max_threads bounds the requests in progress
    # (one more is refused with RESOURCE_EXHAUSTED), so the messages held at once.
    grpc_server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", config.max_request_bytes),
            ("grpc.max_send_message_length", 2**31 - 1),
        ],
        maximum_concurrent_rpcs=config.grpc_max_threads,
    )
    add_services(grpc_server, service, metrics)
    try:
        bound = grpc_server.add_insecure_port(f"{config.host}:{config.port}")
    except RuntimeError:
        bound = 0
    if not bound:
        raise ConfigError(
            f"--port={config.port}: cannot listen on {config.host}:{config.port}; "
            "pick another port with --port"
        )
    await grpc_server.start()
    rest = RestApi(
        service,
        metrics,
        metrics_path=metrics_path,
        max_body_bytes=config.max_request_bytes,
        cors=config.rest_api_enable_cors_support,
        limits=_rest_limits(config),
    )
    log.info(
        "serving",
        extra={
            "grpc": f"{config.host}:{config.port}",
            "rest": f"{config.host}:{config.rest_api_port}",
            "models": sorted(service.repository.configs),
            "batching": config.enable_batching,
            "metrics_path": metrics_path,
        },
    )
    if config.rest_api_port:
        # uvicorn handles SIGTERM/SIGINT: stops accepting, finishes requests in flight, returns.
        await uvicorn.Server(
            rest_transport.uvicorn_config(
                rest.app(),
                host=config.host,
                port=config.rest_api_port,
                limits=rest.limits,
                graceful_shutdown_s=config.shutdown_grace_seconds,
            )
        ).serve()
    else:  # TF Serving: --rest_api_port=0 turns REST off
        while not stop.is_set():
            await asyncio.sleep(0.2)
    log.info("shutting down", extra={"grace_s": config.shutdown_grace_seconds})
    await grpc_server.stop(grace=config.shutdown_grace_seconds)


def _rest_limits(config: ServeConfig) -> rest_transport.RestLimits:
    return rest_transport.RestLimits(
        max_connections=config.rest_api_max_connections,
        keepalive_timeout_s=config.rest_api_keepalive_timeout_in_ms / 1e3,
        header_timeout_s=config.rest_api_header_timeout_in_ms / 1e3,
        body_timeout_s=config.rest_api_body_timeout_in_ms / 1e3,
        max_buffered_bytes=config.rest_api_max_buffered_bytes,
        http_impl=config.rest_api_http_impl,
    )


def _check_port_free(host: str, port: int, flag: str) -> None:
    import socket

    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as e:
            raise ConfigError(
                f"{flag}={port}: cannot listen on {host}:{port} ({e.strerror}); "
                f"pick another port with {flag}"
            ) from None


__all__ = ["ServeConfig", "serve", "build"]
