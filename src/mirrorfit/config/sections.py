"""The six sections of :class:`~mirrorfit.config.TrainConfig` (distribution, data, optimisation,
checkpoints, model, outputs), each a frozen dataclass that checks its own fields when built on
its own (``check()``). Helpers are module functions, not methods: TrainConfig inherits every
section, where two methods of one name would shadow each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from mirrorfit.config.checks import (
    CLUSTER_STRATEGIES,
    COMMUNICATIONS,
    CROSS_DEVICE_OPS,
    DATASETS,
    LR_SCALINGS,
    MAX_IMAGE_SIDE,
    MAX_REPLICAS,
    OPTIMIZERS,
    OPTIONAL_TEXT,
    PRECISIONS,
    STRATEGIES,
    check_choice,
    check_float,
    check_positive,
    flag,
)
from mirrorfit.data.spec import (
    MAX_CLASSES,
    MAX_INPUT_ELEMENTS,
    Kind,
    check_cache,
    kind_of,
    parse_ints,
)
from mirrorfit.distribute.cluster import DEFAULT_COLLECTIVE_TIMEOUT_S
from mirrorfit.engine import backends
from mirrorfit.errors import ConfigError
from mirrorfit.models.names import check_model_name


class Section:
    """What every section does when built: paths to text, then its own ``check()``."""

    def __post_init__(self) -> None:
        for name in OPTIONAL_TEXT:
            if isinstance(getattr(self, name, None), PurePath):
                object.__setattr__(self, name, str(getattr(self, name)))
        self.check()

    def check(self) -> None:
        """ConfigError, one line, for a value this section cannot take."""


@dataclass(frozen=True)
class DistributionSettings(Section):
    """Where it runs: the engine (--backend), its devices, strategy and processes."""

    # tensorflow or jax; None: $KERAS_BACKEND, else tensorflow (mirrorfit.engine.backends)
    backend: str | None = None
    replicas: int | None = None  # None: every local device (all GPUs, else the one CPU)
    devices: tuple[str, ...] = ()  # explicit device names, e.g. ("/gpu:0", "/gpu:2")
    visible_devices: str | None = None  # GPU indices, like CUDA_VISIBLE_DEVICES
    memory_growth: bool = True
    gpu_memory_limit: int | None = None  # MB per GPU
    strategy: str = "auto"
    cross_device_ops: str = "auto"
    communication: str = "auto"  # multi-worker all-reduce implementation
    threads_per_worker: int | None = None  # TF intra/inter-op threads of this process
    collective_timeout: float = DEFAULT_COLLECTIVE_TIMEOUT_S  # seconds: start-up, collectives
    shard: str = "none"  # JAX: none, optimizer (ZeRO-1) or all (FSDP): what is split over devices
    model_parallel: int = 1  # JAX: the devices each weight is split over (a data x model mesh)
    sync_batchnorm: bool = False  # BatchNormalization's statistics over every replica's share
    profile: bool = False  # break down the step (one process)

    def check(self) -> None:
        backend = backends.resolve(self.backend)
        object.__setattr__(self, "backend", backend)
        check_choice("strategy", self.strategy, STRATEGIES)
        check_choice("cross_device_ops", self.cross_device_ops, CROSS_DEVICE_OPS)
        check_choice("communication", self.communication, COMMUNICATIONS)
        _check_collective_timeout(self.collective_timeout)
        # The engine's own refusals first: the checks below advise TensorFlow's settings
        # (--strategy mirrored, --communication), which a JAX run would then refuse too.
        backends.check_settings(
            backend,
            strategy=self.strategy,
            cross_device_ops=self.cross_device_ops,
            communication=self.communication,
            shard=self.shard,
            model_parallel=self.model_parallel,
        )
        _check_strategy_flags(self)
        _check_device_counts(self)


def _check_collective_timeout(seconds: Any) -> None:
    check_float("collective_timeout", seconds, minimum=0.0, example="300", inclusive=False)
    if seconds > 86400:
        raise ConfigError(
            f"--collective-timeout {seconds:g} s is more than "
            "a day; a hung worker would go unnoticed that long (e.g. 300)"
        )


def _check_strategy_flags(s: DistributionSettings) -> None:
    """The flags that one --strategy uses and another would ignore."""
    if s.communication != "auto" and s.strategy != "multi-worker":
        raise ConfigError(
            f"--communication {s.communication} sets multi-worker's "
            f"all-reduce; --strategy {s.strategy} does not use it: drop it "
            "or use --strategy multi-worker"
        )
    if s.cross_device_ops != "auto" and s.strategy in CLUSTER_STRATEGIES:
        raise ConfigError(
            f"--cross-device-ops {s.cross_device_ops} is for one process "
            f"with several devices; with --strategy {s.strategy} use "
            "--communication (multi-worker) or drop it"
        )
    if s.profile and s.strategy in CLUSTER_STRATEGIES:
        raise ConfigError(
            f"--profile times one process's devices; it cannot run with "
            f"--strategy {s.strategy}: profile with --strategy mirrored"
        )


def _check_device_counts(s: DistributionSettings) -> None:
    for name in ("replicas", "gpu_memory_limit", "threads_per_worker", "model_parallel"):
        if getattr(s, name) is not None:
            check_positive(name, getattr(s, name))
    if s.threads_per_worker is not None and s.threads_per_worker > 1024:
        # Each thread costs a stack (what 100,000 took: docs/benchmarks.md#figures-behind-the-code).
        raise ConfigError(
            f"--threads-per-worker {s.threads_per_worker} is more threads "
            "than any host runs well; use at most 1024 (typically the "
            "cores of the host divided by its workers)"
        )
    if s.replicas is not None and s.replicas > MAX_REPLICAS:
        # Each logical device costs threads and memory before any check of the data can
        # run: 100,000 of them hung both engines' start-up for minutes.
        raise ConfigError(
            f"--replicas {s.replicas} is more devices than one process "
            f"drives; use at most {MAX_REPLICAS} (a host's GPUs, or a few "
            "logical CPU devices)"
        )
    if s.replicas is not None and s.strategy == "single" and s.replicas != 1:
        raise ConfigError(
            f"--strategy single runs on one device but {s.replicas} "
            "replicas were asked for; use --replicas 1 or --strategy "
            "mirrored"
        )


@dataclass(frozen=True)
class DataSettings(Section):
    """What it is trained on: --data and the flags that go with it, checked for their values
    and for the kind of source (a flag that would be ignored is refused, not dropped)."""

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
    train_examples: int | None = None

    def check(self) -> None:
        kind = _check_source(self)
        if self.image_size is not None:
            _check_image_size(self, kind)
        _check_features(self, kind)
        _check_split_and_cache(self, kind)
        _check_shape_and_classes(self)
        if self.train_examples is not None:
            check_positive("train_examples", self.train_examples)


def _check_source(s: DataSettings) -> Kind:
    """--data (or its alias --dataset) and --data-dir; the kind of source they name."""
    if s.dataset is not None:  # the alias: same value as --data, or --data left out
        check_choice("dataset", s.dataset, DATASETS)
        if s.data not in ("mnist", s.dataset):
            raise ConfigError(
                f"--dataset {s.dataset} and --data {s.data} disagree; "
                "--dataset is the older name of --data: give only --data"
            )
        object.__setattr__(s, "data", s.dataset)
    kind = kind_of(s.data)
    if s.data_dir is not None and kind.name != "mnist":
        raise ConfigError(
            f"--data-dir says where MNIST is; it does not apply to --data {s.data}: drop --data-dir"
        )
    if s.data_dir is not None and not isinstance(s.data_dir, str):
        raise ConfigError(
            f"--data-dir must be a path, got {s.data_dir!r}; e.g. "
            "--data-dir data (the folder holding mnist.npz)"
        )
    if s.data_dir is not None and not s.data_dir:  # "" would mean "look anywhere"
        raise ConfigError(
            "--data-dir is empty; give the folder holding mnist.npz (or the "
            "file), or leave --data-dir out to look in $MIRRORFIT_DATA and "
            "the Keras cache"
        )
    if s.data_dir:  # like --data paths: a wrong one fails before TensorFlow loads
        from mirrorfit.data.mnist import locate_mnist  # (numpy: only when it is needed)

        locate_mnist(s.data_dir, download=False)
    return kind


def _check_image_size(s: DataSettings, kind: Kind) -> None:
    size = parse_ints("--image-size", s.image_size, count=2, example="224,224")
    object.__setattr__(s, "image_size", size)
    if max(size) > MAX_IMAGE_SIDE:
        raise ConfigError(
            f"--image-size {size[0]},{size[1]}: at most {MAX_IMAGE_SIDE} pixels a side; "
            "e.g. --image-size 224,224"
        )
    values = size[0] * size[1] * 3  # decoded to 3 channels at most
    if values > MAX_INPUT_ELEMENTS:
        raise ConfigError(
            f"--image-size {size[0]},{size[1]}: {values:,} values per example at 3 channels, "
            f"more than {MAX_INPUT_ELEMENTS:,}; e.g. --image-size 224,224"
        )
    if not kind.files:
        raise ConfigError(
            f"--image-size resizes images read from files (an image folder or TFRecords), "
            f"not --data {s.data}: drop it"
        )


def _check_features(s: DataSettings, kind: Kind) -> None:
    for name, default in (
        ("image_feature", "image/encoded"),
        ("label_feature", "image/class/label"),
    ):
        value = getattr(s, name)
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{flag(name)} must name a feature, got {value!r}")
        if value != default and not kind.features:
            raise ConfigError(
                f"{flag(name)} names a TFRecord feature; --data {s.data} "
                "is not TFRecord files: drop it"
            )


def _check_split_and_cache(s: DataSettings, kind: Kind) -> None:
    if s.validation_split is not None:
        v = s.validation_split
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
    if s.cache is not None:
        if kind.in_memory:
            raise ConfigError(
                f"--cache keeps decoded examples of files or of a "
                f"package.module:function's datasets; --data {s.data} is "
                "already in memory: drop --cache"
            )
        check_cache(s.cache)


def _check_shape_and_classes(s: DataSettings) -> None:
    if s.input_shape is not None:
        shape = parse_ints(
            "--input-shape", s.input_shape, lengths=(1, 2, 3, 4), example="224,224,3"
        )
        object.__setattr__(s, "input_shape", shape)
    n = s.num_classes
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 2):
        raise ConfigError(
            f"--num-classes must be an integer >= 2, got {n!r}; e.g. --num-classes 10"
        )
    if n is not None and n > MAX_CLASSES:
        raise ConfigError(f"--num-classes {n}: at most {MAX_CLASSES:,}; e.g. --num-classes 10")


@dataclass(frozen=True)
class OptimisationSettings(Section):
    """How it trains: batches, epochs, the optimizer and its rate, each step's arithmetic."""

    batch_size: int = 32  # per replica
    global_batch_size: int | None = None  # instead of batch_size
    eval_batch_size: int | None = None  # global; None: the training global batch
    epochs: int = 10
    optimizer: str = "sgd"
    lr: float = 1e-2
    lr_scaling: str = "none"
    base_batch: int = 32  # the global batch --lr was chosen for (linear scaling)
    warmup_epochs: float = 0.0
    steps_per_execution: int = 50
    accum_steps: int = 1  # micro-batches per replica per optimizer step
    precision: str = "fp32"
    xla: bool = False
    seed: int = 42
    allow_nan: bool = False  # train on through a non-finite loss; save and export NaN weights

    def check(self) -> None:
        check_choice("optimizer", self.optimizer.lower(), OPTIMIZERS)
        check_choice("precision", self.precision, PRECISIONS)
        check_choice("lr_scaling", self.lr_scaling, LR_SCALINGS)
        check_float("warmup_epochs", self.warmup_epochs, minimum=0.0, example="1")
        check_float("lr", self.lr, minimum=0.0, example="0.01", inclusive=False)
        for name in ("batch_size", "epochs", "steps_per_execution", "accum_steps", "base_batch"):
            check_positive(name, getattr(self, name))
        for name in ("global_batch_size", "eval_batch_size"):
            if getattr(self, name) is not None:
                check_positive(name, getattr(self, name))
        if self.warmup_epochs > self.epochs:  # e.g. 1e300: the rate would stay ~0 all run
            raise ConfigError(
                f"--warmup-epochs {self.warmup_epochs:g} is more than --epochs "
                f"{self.epochs}; the warm-up must end within the run (e.g. "
                f"--warmup-epochs {min(1, self.epochs)})"
            )
        _check_seed(self.seed)

    def batch_sizes(self, replicas: int) -> tuple[int, int]:
        """(per-replica micro-batch, effective global batch) in examples for ``replicas``.

        Effective global batch = per-replica batch x replicas x accumulation steps.
        """
        k = self.accum_steps
        if self.global_batch_size is None:
            return self.batch_size, self.batch_size * replicas * k
        return (backends.split_batch(self.global_batch_size, replicas, k), self.global_batch_size)


def _check_seed(seed: Any) -> None:
    # NumPy's and Keras's global seeds are 32-bit: a larger seed passes here and fails at
    # keras.utils.set_random_seed, after the data was loaded.
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise ConfigError(
            f"{flag('seed')} must be an integer from 0 to 2**32 - 1 "
            f"(4294967295), got {seed!r}; e.g. {flag('seed')} 42"
        )


@dataclass(frozen=True)
class CheckpointSettings(Section):
    """What a rerun resumes from."""

    checkpoint_dir: str | None = None
    checkpoint_every: int = 0  # steps; 0: at epoch ends only
    keep_checkpoints: int = 3
    fresh: bool = False  # move existing checkpoints aside instead of resuming

    def check(self) -> None:
        every = self.checkpoint_every
        if isinstance(every, bool) or not isinstance(every, int) or every < 0:
            raise ConfigError(f"--checkpoint-every must be >= 0 steps, got {every!r}")
        check_positive("keep_checkpoints", self.keep_checkpoints)
        if self.checkpoint_dir is None and (every or self.fresh):
            given = f"--checkpoint-every {every}" if every else "--fresh"
            raise ConfigError(
                f"{given} needs --checkpoint-dir DIR (where the checkpoints go); give one, "
                "or leave it out"
            )


@dataclass(frozen=True)
class ModelSettings(Section):
    """What is trained: --model, and for a package.module:function how it is compiled."""

    model: str = "mlp"
    loss: str | None = None  # a Keras loss name, for an uncompiled --model function
    metrics: str | None = None  # comma-separated Keras metric names, with --loss
    callbacks: str | None = None  # package.module:function returning Keras callbacks
    remat: bool = False

    def check(self) -> None:
        check_model_name(self.model)  # plain Python: no TensorFlow to load
        user_model = ":" in self.model
        for name in ("loss", "metrics", "callbacks"):
            if getattr(self, name) is not None and not user_model:
                raise ConfigError(
                    f"{flag(name)} applies to a --model package.module:function "
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


@dataclass(frozen=True)
class OutputSettings(Section):
    """What the run writes and reports. Whether the paths can be written is
    mirrorfit.config.check_outputs's question, asked before a run."""

    logdir: str | None = None  # TensorBoard scalars
    metrics_out: str | None = None
    progress: bool = True
    export_dir: str | None = None  # models/NAME: the next numeric version is written there
    export_preprocessing: bool = False
    save_keras: str | None = None

    def check(self) -> None:
        if self.export_preprocessing and not self.export_dir:
            raise ConfigError(
                "--export-preprocessing shapes the SavedModel that --export-dir writes; give "
                "--export-dir models/NAME, or leave it out"
            )


# TrainConfig's order: its fields section by section, and its checks in this order too (the
# order they ran in before the split: the engine's first, as it may refuse what others advise).
SECTIONS = (
    DistributionSettings,
    DataSettings,
    OptimisationSettings,
    CheckpointSettings,
    ModelSettings,
    OutputSettings,
)
