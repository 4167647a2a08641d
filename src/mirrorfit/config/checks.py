"""The values the settings may take, and the checks the sections share (one-line
ConfigErrors that name the flag)."""

from __future__ import annotations

import math
from typing import Any

from mirrorfit.errors import ConfigError
from mirrorfit.models.names import REFERENCE

STRATEGIES = ("auto", "single", "mirrored", "central-storage", "multi-worker", "parameter-server")
CLUSTER_STRATEGIES = ("multi-worker", "parameter-server")  # several processes
COMMUNICATIONS = ("auto", "ring", "nccl")
CROSS_DEVICE_OPS = ("auto", "nccl", "hierarchical", "reduce-to-one")
OPTIMIZERS = ("sgd", "adam", "adamw", "rmsprop")
DATASETS = ("mnist",)
PRECISIONS = ("fp32", "bf16", "fp16")
LR_SCALINGS = ("none", "linear")
# Pixels a side --image-size may ask for: every image is resized to it, so one 2**20-pixel side
# (what parse_ints allows) makes each decoded example terabytes and the model's input as large.
MAX_IMAGE_SIDE = 8192
MAX_REPLICAS = 1024  # devices one process replicates over
# The keys of models.build.REFERENCE_MODELS; keras.applications names are models.names.APPLICATIONS
MODELS = REFERENCE
# The settings that take a path or a name: a Path from the Python API is kept as text (the
# config goes into the JSON summary); load_config's type check takes str or Path for them.
OPTIONAL_TEXT = frozenset(
    {
        "backend",
        "data_dir",
        "dataset",
        "cache",
        "visible_devices",
        "metrics_out",
        "checkpoint_dir",
        "export_dir",
        "save_keras",
        "logdir",
        "loss",
        "metrics",
        "callbacks",
    }
)


def flag(name: str) -> str:
    """The flag for a field: ``warmup_epochs`` -> ``--warmup-epochs`` (also its TOML key)."""
    return "--" + name.replace("_", "-")


def check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"unknown {name} {value!r}; choose one of: {', '.join(choices)}")


def check_positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{flag(name)} must be a positive integer, got {value!r}")


def check_float(
    name: str, value: Any, *, minimum: float, example: str, inclusive: bool = True
) -> None:
    """A finite number above ``minimum``: inf and NaN pass a plain ``>`` test one way or the
    other and only fail later (a warm-up of inf steps, a NaN loss)."""
    ok = (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and (value >= minimum if inclusive else value > minimum)
    )
    if not ok:
        bound = f"{'>=' if inclusive else '>'} {minimum:g}"
        raise ConfigError(
            f"{flag(name)} must be a finite number {bound}, got {value!r}; "
            f"e.g. {flag(name)} {example}"
        )
