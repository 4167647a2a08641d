"""Training settings: one frozen dataclass, resolved and validated in one place.

Precedence: defaults < TOML file (``--config``) < command-line flags / keyword arguments.
Every check a user can fail lives here, so the rest of the package may trust the values.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import tomllib
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any, Mapping

from mirrorfit.artifacts import output_paths
from mirrorfit.data.spec import MAX_CLASSES, MAX_INPUT_ELEMENTS, check_cache, kind_of, parse_ints
from mirrorfit.distribute.cluster import DEFAULT_COLLECTIVE_TIMEOUT_S
from mirrorfit.engine import backends
from mirrorfit.errors import ConfigError
from mirrorfit.models.names import REFERENCE, check_model_name

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


@dataclass(frozen=True)
class TrainConfig:
    """Everything ``mirrorfit train`` needs. Field names are the TOML keys and the flag names
    (``steps_per_execution`` <-> ``--steps-per-execution``)."""

    model: str = "mlp"
    # tensorflow or jax; None: $KERAS_BACKEND, else tensorflow (mirrorfit.engine.backends)
    backend: str | None = None
    # --data SOURCE: mnist, synthetic, FILE.npz, an image FOLDER, 'GLOB.tfrecord' or
    # package.module:function (mirrorfit.data.spec.kind_of tells which).
    data: str = "mnist"
    dataset: str | None = None  # the older name of --data, kept as an alias
    data_dir: str | None = None  # where MNIST is (--data mnist only)
    image_size: tuple[int, int] | None = None  # (height, width) pixels images are resized to
    image_feature: str = "image/encoded"  # TFRecord feature holding the encoded PNG/JPEG
    label_feature: str = "image/class/label"  # TFRecord feature holding the int64 label
    validation_split: float | None = None  # share of training examples held out (0 < F < 1)
    cache: str | None = None  # decoded examples kept in "memory" or in a folder
    input_shape: tuple[int, ...] | None = None  # one example's shape (synthetic data, models)
    num_classes: int | None = None  # classes of the labels (model outputs)
    replicas: int | None = None  # None: every local device (all GPUs, else the one CPU)
    devices: tuple[str, ...] = ()  # explicit device names, e.g. ("/gpu:0", "/gpu:2")
    visible_devices: str | None = None  # GPU indices, like CUDA_VISIBLE_DEVICES
    memory_growth: bool = True
    strategy: str = "auto"
    cross_device_ops: str = "auto"
    communication: str = "auto"  # multi-worker all-reduce implementation
    threads_per_worker: int | None = None  # TF intra/inter-op threads of this process
    collective_timeout: float = DEFAULT_COLLECTIVE_TIMEOUT_S  # seconds: start-up, collectives
    batch_size: int = 32  # per replica
    global_batch_size: int | None = None  # instead of batch_size
    epochs: int = 10
    optimizer: str = "sgd"
    lr: float = 1e-2
    steps_per_execution: int = 50
    accum_steps: int = 1  # micro-batches per replica per optimizer step
    precision: str = "fp32"
    xla: bool = False
    lr_scaling: str = "none"
    base_batch: int = 32  # the global batch --lr was chosen for (linear scaling)
    warmup_epochs: float = 0.0
    gpu_memory_limit: int | None = None  # MB per GPU
    remat: bool = False
    shard: str = "none"  # JAX: none, optimizer (ZeRO-1) or all (FSDP): what is split over devices
    logdir: str | None = None  # TensorBoard scalars
    profile: bool = False
    seed: int = 42
    train_examples: int | None = None
    eval_batch_size: int | None = None  # global; None: the training global batch
    metrics_out: str | None = None
    progress: bool = True
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0  # steps; 0: at epoch ends only
    keep_checkpoints: int = 3
    fresh: bool = False  # move existing checkpoints aside instead of resuming
    export_dir: str | None = None  # models/NAME: the next numeric version is written there
    export_preprocessing: bool = False
    allow_nan: bool = False  # train on through a non-finite loss; save and export NaN weights
    save_keras: str | None = None
    loss: str | None = None  # a Keras loss name, for an uncompiled --model function
    metrics: str | None = None  # comma-separated Keras metric names, with --loss
    callbacks: str | None = None  # package.module:function returning Keras callbacks

    def __post_init__(self) -> None:
        for name in _OPTIONAL_STR:  # a Path from the Python API is kept as text (JSON summary)
            if isinstance(getattr(self, name), PurePath):
                object.__setattr__(self, name, str(getattr(self, name)))
        backend = backends.resolve(self.backend)
        object.__setattr__(self, "backend", backend)
        _check_choice("strategy", self.strategy, STRATEGIES)
        _check_choice("cross_device_ops", self.cross_device_ops, CROSS_DEVICE_OPS)
        _check_choice("communication", self.communication, COMMUNICATIONS)
        _check_float(
            "collective_timeout",
            self.collective_timeout,
            minimum=0.0,
            example="300",
            inclusive=False,
        )
        if self.collective_timeout > 86400:
            raise ConfigError(
                f"--collective-timeout {self.collective_timeout:g} s is more than "
                "a day; a hung worker would go unnoticed that long (e.g. 300)"
            )
        # The engine's own refusals first: the checks below advise TensorFlow's settings
        # (--strategy mirrored, --communication), which a JAX run would then refuse too.
        backends.check_settings(
            backend,
            strategy=self.strategy,
            cross_device_ops=self.cross_device_ops,
            communication=self.communication,
            profile=self.profile,
            shard=self.shard,
        )
        if self.communication != "auto" and self.strategy != "multi-worker":
            raise ConfigError(
                f"--communication {self.communication} sets multi-worker's "
                f"all-reduce; --strategy {self.strategy} does not use it: drop it "
                "or use --strategy multi-worker"
            )
        if self.cross_device_ops != "auto" and self.strategy in CLUSTER_STRATEGIES:
            raise ConfigError(
                f"--cross-device-ops {self.cross_device_ops} is for one process "
                f"with several devices; with --strategy {self.strategy} use "
                "--communication (multi-worker) or drop it"
            )
        if self.xla and self.strategy == "parameter-server":
            # The check compiles the step against variables that live on the ps: it can only
            # fail, and it would blame the model.
            raise ConfigError(
                "--xla cannot compile steps whose variables live on parameter "
                "servers; drop --xla or use --strategy multi-worker"
            )
        if self.profile and self.strategy in CLUSTER_STRATEGIES:
            raise ConfigError(
                f"--profile times one process's devices; it cannot run with "
                f"--strategy {self.strategy}: profile with --strategy mirrored"
            )
        if self.backend == "jax" and self.export_dir:
            raise ConfigError(
                "--export-dir writes a TensorFlow SavedModel; with --backend jax "
                "save --checkpoint-dir DIR and export it where TensorFlow is "
                "installed: mirrorfit export --checkpoint-dir DIR --export-dir "
                f"{self.export_dir}"
            )
        self._check_data()
        _check_choice("optimizer", self.optimizer.lower(), OPTIMIZERS)
        _check_choice("precision", self.precision, PRECISIONS)
        _check_choice("lr_scaling", self.lr_scaling, LR_SCALINGS)
        _check_float("warmup_epochs", self.warmup_epochs, minimum=0.0, example="1")
        _check_float("lr", self.lr, minimum=0.0, example="0.01", inclusive=False)
        if (
            isinstance(self.checkpoint_every, bool)
            or not isinstance(self.checkpoint_every, int)
            or self.checkpoint_every < 0
        ):
            raise ConfigError(
                f"--checkpoint-every must be >= 0 steps, got {self.checkpoint_every!r}"
            )
        for name in (
            "batch_size",
            "epochs",
            "steps_per_execution",
            "keep_checkpoints",
            "accum_steps",
            "base_batch",
        ):
            _check_positive(name, getattr(self, name))
        for name in (
            "replicas",
            "global_batch_size",
            "train_examples",
            "eval_batch_size",
            "gpu_memory_limit",
            "threads_per_worker",
        ):
            if getattr(self, name) is not None:
                _check_positive(name, getattr(self, name))
        if self.threads_per_worker is not None and self.threads_per_worker > 1024:
            # Each thread costs a stack; 100,000 of them took ~19 GB before TF did any work.
            raise ConfigError(
                f"--threads-per-worker {self.threads_per_worker} is more threads "
                "than any host runs well; use at most 1024 (typically the "
                "cores of the host divided by its workers)"
            )
        if self.replicas is not None and self.replicas > MAX_REPLICAS:
            # Each logical device costs threads and memory before any check of the data can
            # run: 100,000 of them hung both engines' start-up for minutes.
            raise ConfigError(
                f"--replicas {self.replicas} is more devices than one process "
                f"drives; use at most {MAX_REPLICAS} (a host's GPUs, or a few "
                "logical CPU devices)"
            )
        if self.warmup_epochs > self.epochs:  # e.g. 1e300: the rate would stay ~0 all run
            raise ConfigError(
                f"--warmup-epochs {self.warmup_epochs:g} is more than --epochs "
                f"{self.epochs}; the warm-up must end within the run (e.g. "
                f"--warmup-epochs {min(1, self.epochs)})"
            )
        # What needs no devices is checked here, before TensorFlow loads (seconds): the model
        # name, and the batch and strategy against an explicit --replicas.
        check_model_name(self.model)  # plain Python: no TensorFlow to load
        user_model = ":" in self.model
        for name in ("loss", "metrics", "callbacks"):
            if getattr(self, name) is not None and not user_model:
                raise ConfigError(
                    f"{_flag(name)} applies to a --model package.module:function "
                    f"(trained as compiled, through mirrorfit.fit); --model "
                    f"{self.model} trains its own loss and metrics"
                )
        if self.metrics is not None and self.loss is None:
            raise ConfigError(
                "--metrics goes with --loss (an uncompiled --model function); "
                "a compiled model's metrics are its compile()'s"
            )
        if self.callbacks is not None and ":" not in self.callbacks:
            raise ConfigError(
                f"--callbacks {self.callbacks!r}: give package.module:function "
                "returning a list of keras.callbacks.Callback"
            )
        if self.replicas is not None:
            self.batch_sizes(self.replicas)
            if self.strategy == "single" and self.replicas != 1:
                raise ConfigError(
                    f"--strategy single runs on one device but {self.replicas} "
                    "replicas were asked for; use --replicas 1 or --strategy "
                    "mirrored"
                )
        # NumPy's and Keras's global seeds are 32-bit: a larger seed passes here and fails at
        # keras.utils.set_random_seed, after the data was loaded.
        if (
            isinstance(self.seed, bool)
            or not isinstance(self.seed, int)
            or not 0 <= self.seed < 2**32
        ):
            raise ConfigError(
                f"{_flag('seed')} must be an integer from 0 to 2**32 - 1 "
                f"(4294967295), got {self.seed!r}; e.g. {_flag('seed')} 42"
            )

    def _check_data(self) -> None:
        """--data and the flags that go with it: values, and whether they apply to the kind of
        source (a flag that would be ignored is refused rather than silently dropped)."""
        if self.dataset is not None:  # the alias: same value as --data, or --data left out
            _check_choice("dataset", self.dataset, DATASETS)
            if self.data not in ("mnist", self.dataset):
                raise ConfigError(
                    f"--dataset {self.dataset} and --data {self.data} disagree; "
                    "--dataset is the older name of --data: give only --data"
                )
            object.__setattr__(self, "data", self.dataset)
        kind = kind_of(self.data)
        if self.data_dir is not None and kind.name != "mnist":
            raise ConfigError(
                f"--data-dir says where MNIST is; it does not apply to --data "
                f"{self.data}: drop --data-dir"
            )
        if self.data_dir is not None and not isinstance(self.data_dir, str):
            raise ConfigError(
                f"--data-dir must be a path, got {self.data_dir!r}; e.g. "
                "--data-dir data (the folder holding mnist.npz)"
            )
        if self.data_dir is not None and not self.data_dir:  # "" would mean "look anywhere"
            raise ConfigError(
                "--data-dir is empty; give the folder holding mnist.npz (or the "
                "file), or leave --data-dir out to look in $MIRRORFIT_DATA and "
                "the Keras cache"
            )
        if self.data_dir:  # like --data paths: a wrong one fails before TensorFlow loads
            from mirrorfit.data.mnist import locate_mnist  # (numpy: only when it is needed)

            locate_mnist(self.data_dir, download=False)
        if self.image_size is not None:
            object.__setattr__(
                self,
                "image_size",
                parse_ints("--image-size", self.image_size, count=2, example="224,224"),
            )
            if max(self.image_size) > MAX_IMAGE_SIDE:
                raise ConfigError(
                    f"--image-size {self.image_size[0]},{self.image_size[1]}: at "
                    f"most {MAX_IMAGE_SIDE} pixels a side; e.g. --image-size "
                    "224,224"
                )
            values = self.image_size[0] * self.image_size[1] * 3  # decoded to 3 channels at most
            if values > MAX_INPUT_ELEMENTS:
                raise ConfigError(
                    f"--image-size {self.image_size[0]},{self.image_size[1]}: "
                    f"{values:,} values per example at 3 channels, more than "
                    f"{MAX_INPUT_ELEMENTS:,}; e.g. --image-size 224,224"
                )
            if not kind.files:
                raise ConfigError(
                    f"--image-size resizes images read from files (an image "
                    f"folder or TFRecords), not --data {self.data}: drop it"
                )
        for name, default in (
            ("image_feature", "image/encoded"),
            ("label_feature", "image/class/label"),
        ):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ConfigError(f"{_flag(name)} must name a feature, got {value!r}")
            if value != default and not kind.features:
                raise ConfigError(
                    f"{_flag(name)} names a TFRecord feature; --data {self.data} "
                    "is not TFRecord files: drop it"
                )
        if self.validation_split is not None:
            v = self.validation_split
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < 1:
                raise ConfigError(
                    f"--validation-split must be a fraction between 0 and 1 "
                    f"(exclusive), got {v!r}; e.g. --validation-split 0.1"
                )
            if kind.own_validation:
                raise ConfigError(
                    f"--data {kind.name} has its own validation split "
                    f"({kind.own_validation}): drop --validation-split"
                )
        if self.cache is not None:
            if kind.in_memory:
                raise ConfigError(
                    f"--cache keeps decoded examples of files or of a "
                    f"package.module:function's datasets; --data {self.data} is "
                    "already in memory: drop --cache"
                )
            check_cache(self.cache)
        if self.input_shape is not None:
            object.__setattr__(
                self,
                "input_shape",
                parse_ints(
                    "--input-shape", self.input_shape, lengths=(1, 2, 3, 4), example="224,224,3"
                ),
            )
        if self.num_classes is not None and (
            isinstance(self.num_classes, bool)
            or not isinstance(self.num_classes, int)
            or self.num_classes < 2
        ):
            raise ConfigError(
                f"--num-classes must be an integer >= 2, got "
                f"{self.num_classes!r}; e.g. --num-classes 10"
            )
        if self.num_classes is not None and self.num_classes > MAX_CLASSES:
            raise ConfigError(
                f"--num-classes {self.num_classes}: at most {MAX_CLASSES:,}; e.g. --num-classes 10"
            )

    def batch_sizes(self, replicas: int) -> tuple[int, int]:
        """(per-replica micro-batch, effective global batch) in examples for ``replicas``.

        Effective global batch = per-replica batch x replicas x accumulation steps.
        """
        k = self.accum_steps
        if self.global_batch_size is None:
            return self.batch_size, self.batch_size * replicas * k
        return (backends.split_batch(self.global_batch_size, replicas, k), self.global_batch_size)


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"unknown {name} {value!r}; choose one of: {', '.join(choices)}")


def _flag(name: str) -> str:
    """The flag for a field: ``warmup_epochs`` -> ``--warmup-epochs`` (also its TOML key)."""
    return "--" + name.replace("_", "-")


def _check_positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{_flag(name)} must be a positive integer, got {value!r}")


def _check_float(
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
            f"{_flag(name)} must be a finite number {bound}, got {value!r}; "
            f"e.g. {_flag(name)} {example}"
        )


_FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}
_OPTIONAL_STR = {
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


def _coerce(name: str, value: Any) -> Any:
    """Check a TOML value's type against the field (TOML has no None, ints are not floats)."""
    default = _FIELDS[name].default
    if name in ("image_size", "input_shape"):  # "224,224" or [224, 224]; parsed in the checks
        if not isinstance(value, (str, list, tuple)):
            raise ConfigError(
                f"{_flag(name)} must be numbers separated by commas or a list, got {value!r}"
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
            if name in _OPTIONAL_STR
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
    for flag, path in (("--metrics-out", config.metrics_out), ("--save-keras", config.save_keras)):
        output_paths.check_output_file(flag, path)
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


__all__ = ["TrainConfig", "load_config", "to_dict"]
