"""The server's settings (TF Serving's flag names) and their checks. No TensorFlow here: a bad
flag is refused at once, before the seconds it takes to load it."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from mirrorfit.errors import ConfigError


@dataclass(frozen=True)
class ServeConfig:
    """The server's settings; field names are TF Serving's flag names."""

    port: int = 8500
    rest_api_port: int = 8501
    host: str = "127.0.0.1"
    model_name: str = "default"  # TF Serving's
    model_base_path: str | None = None
    model_config_file: str | None = None
    file_system_poll_wait_seconds: float = 1.0
    model_config_file_poll_wait_seconds: float = 0.0  # TF Serving's default: read it once
    # TF Serving's default: a base path with no versions unloads them all (see repository.py)
    servable_versions_always_present: bool = False
    enable_batching: bool = False
    batching_parameters_file: str | None = None
    monitoring_config_file: str | None = None
    rest_api_timeout_in_ms: int = 30000
    max_num_load_retries: int = 5
    load_retry_interval_micros: int = 60_000_000  # TF Serving's default: 60 s between tries
    enable_model_warmup: bool = True
    saved_model_tags: str = "serve"
    rest_api_enable_cors_support: bool = False
    # gRPC requests in progress at once (more get RESOURCE_EXHAUSTED); as many as unbatched
    # model calls may run or wait: more would only hold more messages, not be served sooner
    grpc_max_threads: int = 64
    max_request_bytes: int = 64 * 1024 * 1024  # REST bodies and gRPC messages
    max_rows_per_request: int = 1000  # see serving.validation.MAX_ROWS
    max_unbatched_in_flight: int = 64  # model calls without batching, running or waiting
    rest_api_max_connections: int = 500  # these six: see rest_transport.RestLimits
    rest_api_keepalive_timeout_in_ms: int = 5000
    rest_api_header_timeout_in_ms: int = 10000
    rest_api_body_timeout_in_ms: int = 60000
    rest_api_max_buffered_bytes: int = 256 * 1024 * 1024
    rest_api_http_impl: str = "auto"  # h11 or httptools (auto: httptools when installed)
    event_loop: str = "auto"  # asyncio or uvloop (auto: uvloop when installed)
    shutdown_grace_seconds: float = 10.0
    tensorflow_intra_op_parallelism: int = 0  # 0: TensorFlow's default (all cores)
    tensorflow_inter_op_parallelism: int = 0
    log_level: str = "info"

    def __post_init__(self) -> None:
        check_config(self)  # a ServeConfig is a checked one: one place checks serve's settings


# Threads a flag may ask for: far beyond any host's cores, and each is started up front.
MAX_THREADS = 1024
# Timeouts and waits past a day are no limit at all, and absurd values overflow event-loop timers.
MAX_SECONDS = 24 * 3600
_POSITIVE = (
    "max_rows_per_request",
    "max_unbatched_in_flight",
    "grpc_max_threads",
    "rest_api_max_connections",
)
_MILLISECONDS = (
    "rest_api_timeout_in_ms",
    "rest_api_keepalive_timeout_in_ms",
    "rest_api_header_timeout_in_ms",
    "rest_api_body_timeout_in_ms",
)


def check_config(config: ServeConfig) -> None:
    """Every numeric setting in its range, before anything starts: a ConfigError (exit 2)
    naming the flag. A negative byte limit, for one, would mean 'unlimited' to gRPC."""

    def bad(flag: str, want: str):
        return ConfigError(f"--{flag} must be {want}, got {getattr(config, flag)}")

    for flag in ("port", "rest_api_port"):
        if not 0 <= getattr(config, flag) < 65536:
            raise ConfigError(f"--{flag}={getattr(config, flag)}: a port is 0-65535")
    if config.port == config.rest_api_port:
        raise ConfigError(
            f"--port and --rest_api_port are both {config.port}; give them different ports"
        )
    if config.model_base_path and not os.path.isdir(config.model_base_path):
        raise ConfigError(
            f"--model_base_path {config.model_base_path} is not a folder; point it "
            "at models/NAME holding 0001, 0002, ..."
        )

    for flag in _POSITIVE:
        if getattr(config, flag) < 1:
            raise bad(flag, "positive")
    for flag in _MILLISECONDS:
        if not 1 <= getattr(config, flag) <= MAX_SECONDS * 1000:
            raise bad(flag, f"1-{MAX_SECONDS * 1000} (a day)")
    if not 1 <= config.max_request_bytes < 2**31:  # gRPC's own ceiling
        raise bad("max_request_bytes", f"1-{2**31 - 1} (2 GiB, gRPC's limit)")
    if config.rest_api_max_buffered_bytes < config.max_request_bytes:
        raise ConfigError("--rest_api_max_buffered_bytes must be at least --max_request_bytes")
    for flag in ("max_num_load_retries", "load_retry_interval_micros"):
        if getattr(config, flag) < 0:
            raise bad(flag, ">= 0")
    for flag in ("tensorflow_intra_op_parallelism", "tensorflow_inter_op_parallelism"):
        if not 0 <= getattr(config, flag) <= MAX_THREADS:
            raise bad(flag, f"0 (TensorFlow's default) to {MAX_THREADS}")
    if not (
        math.isfinite(config.file_system_poll_wait_seconds)
        and config.file_system_poll_wait_seconds <= MAX_SECONDS
    ):
        raise bad(
            "file_system_poll_wait_seconds",
            f"a number of seconds up to {MAX_SECONDS} (0: load once; < 0: never poll)",
        )
    if not (
        math.isfinite(config.model_config_file_poll_wait_seconds)
        and config.model_config_file_poll_wait_seconds <= MAX_SECONDS
    ):
        raise bad(
            "model_config_file_poll_wait_seconds",
            f"a number of seconds up to {MAX_SECONDS} (<= 0: read the file once)",
        )
    if config.model_config_file_poll_wait_seconds > 0 and not config.model_config_file:
        raise ConfigError("--model_config_file_poll_wait_seconds needs --model_config_file")
    if not 0 <= config.shutdown_grace_seconds <= MAX_SECONDS:  # (NaN fails this too)
        raise bad("shutdown_grace_seconds", f"0-{MAX_SECONDS} seconds")
    if not (config.model_config_file or config.model_base_path):
        raise ConfigError("give --model_base_path (with --model_name) or --model_config_file")
    if config.batching_parameters_file and not config.enable_batching:
        raise ConfigError("--batching_parameters_file needs --enable_batching")


def model_configs(config: ServeConfig) -> list:
    """The models to serve (a list of ModelConfig), checked against
    --servable_versions_always_present: before TensorFlow loads too."""
    from mirrorfit.serving import disk, model_config

    if config.model_config_file:
        configs = model_config.read_model_config_file(config.model_config_file)
    else:
        configs = model_config.from_flags(config.model_name or "default", config.model_base_path)
    if config.servable_versions_always_present:
        disk.check_versions_present(configs)
    return configs


__all__ = ["MAX_SECONDS", "MAX_THREADS", "ServeConfig", "check_config", "model_configs"]
