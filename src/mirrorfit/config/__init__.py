"""Training settings: one frozen TrainConfig, resolved and checked when built (defaults < TOML
file ``--config`` < flags / keyword arguments); every check a user can fail is here.
TrainConfig inherits the six sections of ``sections.py`` (its fields flat: ``config.lr``) and
runs their ``check()``, then those spanning two (``TrainConfig.check``); ``checks.py``: the
values they allow, shared checks; ``load_config``: a TOML file and flags into a TrainConfig.
(why: docs/architecture.md#the-configuration)
"""

from __future__ import annotations

import dataclasses
import difflib
import tomllib
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any, Mapping

from mirrorfit.artifacts import output_paths
from mirrorfit.engine import backends
from mirrorfit.config.checks import (
    CLUSTER_STRATEGIES,
    COMMUNICATIONS,
    CROSS_DEVICE_OPS,
    DATASETS,
    LR_SCALINGS,
    MAX_IMAGE_SIDE,
    MAX_REPLICAS,
    MODELS,
    OPTIMIZERS,
    OPTIONAL_TEXT,
    PRECISIONS,
    STRATEGIES,
    flag,
)
from mirrorfit.config.sections import (
    SECTIONS,
    CheckpointSettings,
    DataSettings,
    DistributionSettings,
    ModelSettings,
    OptimisationSettings,
    OutputSettings,
)
from mirrorfit.data.spec import MAX_CLASSES
from mirrorfit.errors import ConfigError


# The bases are SECTIONS reversed: a dataclass takes the fields of its last base first, so the
# fields come in SECTIONS' order (distribution, data, ..., outputs).
@dataclass(frozen=True)
class TrainConfig(
    OutputSettings,
    ModelSettings,
    CheckpointSettings,
    OptimisationSettings,
    DataSettings,
    DistributionSettings,
):
    """Everything ``mirrorfit train`` needs: the sections' fields, flat. Field names are the
    TOML keys and the flag names (``steps_per_execution`` <-> ``--steps-per-execution``)."""

    def check(self) -> None:
        """Each section's own check, in SECTIONS' order; then the checks that span two."""
        for section in SECTIONS:
            section.check(self)
        if self.xla and self.strategy == "parameter-server":
            # The check compiles the step against variables that live on the ps: it can only
            # fail, and it would blame the model.
            raise ConfigError(
                "--xla cannot compile steps whose variables live on parameter "
                "servers; drop --xla or use --strategy multi-worker"
            )
        if self.model_parallel > 1 and ":" not in self.model:
            raise ConfigError(
                f"--model-parallel {self.model_parallel} splits the weights of a compiled "
                f"--model package.module:function (trained as compiled); the built-in "
                f"{self.model} trains data-parallel: drop --model-parallel"
            )
        if self.backend is not None:  # an engine that writes no SavedModel
            backends.check_settings(self.backend, export_dir=self.export_dir, model=self.model)
        if self.replicas is not None:  # the batch against an explicit --replicas, no devices
            self.batch_sizes(self.replicas)


_FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}


def _coerce(name: str, value: Any) -> Any:
    """Check a TOML value's type against the field (TOML has no None, ints are not floats)."""
    default = _FIELDS[name].default
    if name in ("image_size", "input_shape"):  # "224,224" or [224, 224]; parsed in the checks
        if not isinstance(value, (str, list, tuple)):
            raise ConfigError(
                f"{flag(name)} must be numbers separated by commas or a list, got {value!r}"
            )
        return value if isinstance(value, str) else tuple(value)
    if name == "validation_split":  # an optional float: the generic check below takes int/str
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"config key {name!r} has the wrong type: {value!r}")
        return float(value)
    if name == "devices":
        if isinstance(value, str):
            value = [v for v in value.split(",") if v]
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"devices must be a list of device names, got {value!r}")
        return tuple(value)
    if (
        name in ("lr", "warmup_epochs", "collective_timeout")
        and isinstance(value, int)
        and not isinstance(value, bool)
    ):
        return float(value)
    want = type(default) if default is not None else None
    if want is None:  # optional fields: int or str (or a Path, kept as text by TrainConfig)
        ok = (
            isinstance(value, (str, PurePath))
            if name in OPTIONAL_TEXT
            else (isinstance(value, int) and not isinstance(value, bool))
        )
    else:
        ok = isinstance(value, want) and not (want is int and isinstance(value, bool))
    if not ok:
        raise ConfigError(f"config key {name!r} has the wrong type: {value!r}")
    return value


def load_config(path: str | Path | None = None, **overrides: Any) -> TrainConfig:
    """Build a :class:`TrainConfig` from an optional TOML file and keyword overrides.

    Overrides whose value is ``None`` are ignored, so unset CLI flags keep the file's value.
    Raises :class:`ConfigError` for unknown keys (with a suggestion), wrong types, bad values.
    """
    values: dict[str, Any] = {}
    if path is not None:
        values.update(_read_toml(Path(path)))
    for key, value in overrides.items():
        if value is not None:
            values[_key(key, "argument")] = value
    values = {k: _coerce(k, v) for k, v in values.items()}
    return TrainConfig(**values)


def _read_toml(path: Path) -> Mapping[str, Any]:
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist; check the --config path") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"config file {path} is not valid TOML: {e}") from None
    except OSError as e:  # a folder, no permission
        raise ConfigError(
            f"cannot read config file {path} ({e.strerror}); check the --config path"
        ) from None
    # Top-level keys and a [train] table are both read: taking only the table used to drop the
    # top-level keys without a word. A key set in both places is ambiguous, so it is refused.
    train = raw.get("train", {})
    if not isinstance(train, dict):
        raise ConfigError(
            f"config file {path}: 'train' must be a [train] table of settings, got {train!r}"
        )
    values = {_key(k, f"key in {path}"): v for k, v in raw.items() if k != "train"}
    for key, value in train.items():
        name = _key(key, f"key in [train] of {path}")
        if name in values:
            raise ConfigError(
                f"config file {path} sets {key!r} both at the top level and under "
                "[train]; keep one of them"
            )
        values[name] = value
    return values


def _key(key: str, where: str) -> str:
    name = key.replace("-", "_")
    if name not in _FIELDS:
        close = difflib.get_close_matches(name, list(_FIELDS), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else f"; valid keys: {', '.join(_FIELDS)}"
        raise ConfigError(f"unknown config {where} {key!r}{hint}")
    return name


def check_outputs(config: TrainConfig) -> None:
    """ConfigError, one line, when a file or folder the run writes (``--metrics-out``,
    ``--save-keras``, ``--export-dir``, ``--checkpoint-dir``, ``--logdir``) cannot be written
    there, or two of its files are one. Plain file checks, no TensorFlow: the CLI runs them
    before it loads, so a bad path costs nothing; a multi-worker run checks on the chief."""
    for name, path in (("--metrics-out", config.metrics_out), ("--save-keras", config.save_keras)):
        output_paths.check_output_file(name, path)
    if config.save_keras:
        output_paths.check_keras_path(config.save_keras)
        if (
            config.metrics_out
            and Path(config.metrics_out).resolve() == Path(config.save_keras).resolve()
        ):
            raise ConfigError(
                f"--metrics-out and --save-keras are both {config.save_keras}: "
                "the summary would overwrite the model; give two files"
            )
    output_paths.check_output_folder("--export-dir", config.export_dir, example="models/mnist")
    output_paths.check_output_folder("--checkpoint-dir", config.checkpoint_dir, example="ckpt")
    output_paths.check_output_folder("--logdir", config.logdir, example="runs/mnist")


def to_dict(config: TrainConfig) -> dict[str, Any]:
    """The config as plain JSON-able values."""
    out = dataclasses.asdict(config)
    out["devices"] = list(config.devices)
    for name in ("image_size", "input_shape"):
        if out[name] is not None:
            out[name] = list(out[name])
    return out


__all__ = [
    "CLUSTER_STRATEGIES",
    "COMMUNICATIONS",
    "CROSS_DEVICE_OPS",
    "DATASETS",
    "LR_SCALINGS",
    "MAX_CLASSES",
    "MAX_IMAGE_SIDE",
    "MAX_REPLICAS",
    "MODELS",
    "OPTIMIZERS",
    "PRECISIONS",
    "SECTIONS",
    "STRATEGIES",
    "CheckpointSettings",
    "DataSettings",
    "DistributionSettings",
    "ModelSettings",
    "OptimisationSettings",
    "OutputSettings",
    "TrainConfig",
    "check_outputs",
    "load_config",
    "to_dict",
]
