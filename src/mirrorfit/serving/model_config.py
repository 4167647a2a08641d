"""Which models to serve and how: TF Serving's flags and its text-format config files.

``--model_config_file`` is parsed with TF Serving's own ModelServerConfig proto (from
tensorflow-serving-api). The batching and monitoring protos are not in that package, so their
schemas are declared here with the same field names and parsed by protobuf's text format.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from google.protobuf import descriptor_pb2, descriptor_pool, text_format
from google.protobuf import message_factory, wrappers_pb2
from tensorflow_serving.config import model_server_config_pb2

from mirrorfit.errors import ConfigError


@dataclass(frozen=True)
class VersionPolicy:
    """``latest`` N versions (TF Serving's default, N=1), ``all``, or ``specific`` versions."""

    kind: str = "latest"
    num_versions: int = 1
    versions: tuple[int, ...] = ()

    def select(self, available: list[int]) -> list[int]:
        """The versions to serve out of those on disk."""
        if self.kind == "all":
            return sorted(available)
        if self.kind == "specific":
            return sorted(v for v in available if v in self.versions)
        return sorted(available)[-self.num_versions :]


@dataclass(frozen=True)
class ModelConfig:
    """One served model: its name, the folder of numeric versions, policy and labels."""

    name: str
    base_path: str
    policy: VersionPolicy = VersionPolicy()
    labels: dict[str, int] = field(default_factory=dict)


def from_flags(model_name: str, model_base_path: str) -> list[ModelConfig]:
    """``--model_name`` / ``--model_base_path``: one model, the latest version."""
    return [ModelConfig(name=model_name, base_path=_absolute(model_base_path))]


def _absolute(path: str) -> str:
    """A base path as TF Serving reads it: relative to the working directory. Links are not
    resolved here: each poll follows them, so a deploy that repoints a link is seen."""
    return os.path.abspath(path)


def read_model_config_file(path: str) -> list[ModelConfig]:
    """Parse a text-format ModelServerConfig (``model_config_list { config { ... } }``)."""
    proto = _parse(path, model_server_config_pb2.ModelServerConfig(), "--model_config_file")
    if not proto.HasField("model_config_list"):
        raise ConfigError(
            f"--model_config_file {path}: needs a model_config_list "
            "(custom_model_config is not supported)"
        )
    out, names = [], set()
    for cfg in proto.model_config_list.config:
        if not cfg.name or not cfg.base_path:
            raise ConfigError(
                f"--model_config_file {path}: every config needs a name and a base_path"
            )
        if cfg.name in names:
            raise ConfigError(f"--model_config_file {path}: model {cfg.name!r} is listed twice")
        names.add(cfg.name)
        if cfg.model_platform not in ("", "tensorflow"):
            raise ConfigError(
                f"--model_config_file {path}: model_platform "
                f"{cfg.model_platform!r} is not supported; use 'tensorflow'"
            )
        which = cfg.model_version_policy.WhichOneof("policy_choice")
        if which == "all":
            policy = VersionPolicy(kind="all")
        elif which == "specific":
            policy = VersionPolicy(
                kind="specific", versions=tuple(cfg.model_version_policy.specific.versions)
            )
        else:
            n = cfg.model_version_policy.latest.num_versions if which == "latest" else 0
            policy = VersionPolicy(kind="latest", num_versions=n or 1)
        out.append(
            ModelConfig(
                name=cfg.name,
                base_path=_absolute(cfg.base_path),
                policy=policy,
                labels=dict(cfg.version_labels),
            )
        )
    if not out:
        raise ConfigError(f"--model_config_file {path}: no models in model_config_list")
    return out


def _message(name: str, fields: list[tuple[str, int, int, str]]):
    """A protobuf message class from (name, number, type, type_name) field tuples."""
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(
        descriptor_pb2.FileDescriptorProto.FromString(
            wrappers_pb2.DESCRIPTOR.serialized_pb
        ).SerializeToString()
    )
    proto = descriptor_pb2.FileDescriptorProto(
        name=f"mirrorfit_{name}.proto",
        package="mirrorfit",
        dependency=["google/protobuf/wrappers.proto"],
    )
    msg = proto.message_type.add(name=name)
    for fname, number, ftype, type_name in fields:
        repeated = ftype < 0
        f = msg.field.add(name=fname, number=number, type=abs(ftype), label=3 if repeated else 1)
        if type_name:
            f.type_name = type_name
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"mirrorfit.{name}"))


_T = descriptor_pb2.FieldDescriptorProto
_BatchingParameters = _message(
    "BatchingParameters",
    [
        ("max_batch_size", 1, _T.TYPE_MESSAGE, ".google.protobuf.Int64Value"),
        ("batch_timeout_micros", 2, _T.TYPE_MESSAGE, ".google.protobuf.Int64Value"),
        ("max_enqueued_batches", 3, _T.TYPE_MESSAGE, ".google.protobuf.Int64Value"),
        ("num_batch_threads", 4, _T.TYPE_MESSAGE, ".google.protobuf.Int64Value"),
        ("thread_pool_name", 5, _T.TYPE_MESSAGE, ".google.protobuf.StringValue"),
        ("allowed_batch_sizes", 6, -_T.TYPE_INT64, ""),
        ("pad_variable_length_inputs", 7, _T.TYPE_BOOL, ""),
        ("enable_large_batch_splitting", 8, _T.TYPE_MESSAGE, ".google.protobuf.BoolValue"),
        ("max_execution_batch_size", 9, _T.TYPE_MESSAGE, ".google.protobuf.Int64Value"),
    ],
)


@dataclass(frozen=True)
class BatchingParameters:
    """TF Serving's batching knobs, with its defaults."""

    max_batch_size: int = 1000
    batch_timeout_micros: int = 0
    max_enqueued_batches: int = 10
    num_batch_threads: int = 2
    allowed_batch_sizes: tuple[int, ...] = ()


def read_batching_parameters(
    path: str | None, *, cpus: int, max_threads: int = 1024
) -> BatchingParameters:
    """Parse ``--batching_parameters_file`` (or TF Serving's defaults when None). At most
    ``max_threads`` batch threads: each is started up front."""
    if path is None:
        return BatchingParameters(num_batch_threads=cpus)
    p = _parse(path, _BatchingParameters(), "--batching_parameters_file")
    get = lambda name, default: getattr(p, name).value if p.HasField(name) else default  # noqa
    params = BatchingParameters(
        max_batch_size=get("max_batch_size", 1000),
        batch_timeout_micros=get("batch_timeout_micros", 0),
        max_enqueued_batches=get("max_enqueued_batches", 10),
        num_batch_threads=get("num_batch_threads", cpus),
        allowed_batch_sizes=tuple(p.allowed_batch_sizes),
    )
    for name in ("max_batch_size", "max_enqueued_batches", "num_batch_threads"):
        if getattr(params, name) < 1:
            raise ConfigError(f"--batching_parameters_file {path}: {name} must be >= 1")
    if params.num_batch_threads > max_threads:
        raise ConfigError(
            f"--batching_parameters_file {path}: num_batch_threads must be at "
            f"most {max_threads}, got {params.num_batch_threads}"
        )
    sizes = params.allowed_batch_sizes
    if sizes:
        if list(sizes) != sorted(set(sizes)) or sizes[0] < 1:
            raise ConfigError(
                f"--batching_parameters_file {path}: allowed_batch_sizes must be "
                "positive and increasing"
            )
        if sizes[-1] != params.max_batch_size:
            raise ConfigError(
                f"--batching_parameters_file {path}: Last entry in "
                f"allowed_batch_sizes must match max_batch_size; last entry was "
                f"{sizes[-1]}; expected {params.max_batch_size}"
            )
    return params


_PrometheusConfig = _message(
    "PrometheusConfig", [("enable", 1, _T.TYPE_BOOL, ""), ("path", 2, _T.TYPE_STRING, "")]
)
DEFAULT_METRICS_PATH = "/monitoring/prometheus/metrics"


def read_monitoring_config(path: str | None) -> str | None:
    """The Prometheus path from ``--monitoring_config_file`` (``prometheus_config { enable:
    true path: ... }``), or None when monitoring is off."""
    if path is None:
        return None
    body = _read(path, "--monitoring_config_file").strip()
    if body.startswith("prometheus_config"):
        body = body[len("prometheus_config") :].strip().lstrip(":").strip()
        if body.startswith("{") and body.endswith("}"):
            body = body[1:-1]
    try:
        proto = text_format.Parse(body, _PrometheusConfig())
    except text_format.ParseError as e:
        raise ConfigError(f"--monitoring_config_file {path}: not valid text format: {e}") from None
    return (proto.path or DEFAULT_METRICS_PATH) if proto.enable else None


def _read(path: str, flag: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"{flag} {path}: cannot read it ({e.strerror})") from None
    except UnicodeDecodeError as e:  # a binary file, or another encoding
        raise ConfigError(
            f"{flag} {path}: not valid text format: byte {e.start} is not "
            "UTF-8; give a text-format protobuf file"
        ) from None


def _parse(path: str, message, flag: str):
    text = _read(path, flag)
    try:
        return text_format.Parse(text, message)
    except text_format.ParseError as e:
        raise ConfigError(f"{flag} {path}: not valid text format: {e}") from None


__all__ = [
    "BatchingParameters",
    "ModelConfig",
    "VersionPolicy",
    "from_flags",
    "read_batching_parameters",
    "read_model_config_file",
    "read_monitoring_config",
    "DEFAULT_METRICS_PATH",
]
