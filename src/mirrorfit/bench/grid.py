"""Run a grid of bench points, each in its own process, alternating and repeating.

The machine is shared and noisy: each repeat runs every point once, in forward order on even
repeats and in reverse on odd ones, so slow spells spread over all points instead of hitting one.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, replace
from typing import Callable, Sequence

from mirrorfit.bench.point import Point
from mirrorfit.config import MAX_CLASSES, PRECISIONS, TrainConfig, load_config
from mirrorfit.data.spec import source_kind
from mirrorfit.engine.backends import BACKENDS, split_batch
from mirrorfit.errors import MirrorfitError
from mirrorfit.models.precision import COMPUTE_DTYPES
from mirrorfit.models.names import (
    IMAGENET_CLASSES,
    check_input_shape,
    check_model_name,
    default_input_shape,
    is_application,
)

# Per model on MNIST: (global batch, training images, epochs). The chapter's batch for the
# MLP; the CNN on a subset so one run takes tens of seconds here.
WORKLOADS = {"mlp": (64, None, 3), "cnn": (100, 12800, 2)}
# On synthetic data, any model: (global batch, examples per epoch, epochs): one compiling
# epoch and one timed epoch of 5 steps, sized for a ResNet on a CPU (seconds per step).
SYNTHETIC_WORKLOAD = (32, 160, 2)
# Sources with their own figures (above); any other --data (FILE.npz, an image FOLDER,
# 'GLOB.tfrecord', package.module:function) takes the model's MNIST batch and epochs, and all
# of its training examples unless --train-examples says.
DATA = ("mnist", "synthetic")


def _given(value, default):
    """A flag's value where it was given (0 too), else the workload's default."""
    return default if value is None else value


@dataclass(frozen=True)
class Grid:
    """The configurations to compare (the cross product) and how to run them."""

    model: str = "mlp"
    backends: Sequence[str] = ("tensorflow",)  # engines: tensorflow, jax
    replicas: Sequence[int] = (1, 2)
    precisions: Sequence[str] = ("fp32", "bf16", "fp16")
    xla: Sequence[bool] = (False,)
    accum_steps: Sequence[int] = (1,)
    steps_per_execution: Sequence[int] = (50,)
    global_batch: int | None = None
    train_examples: int | None = None
    epochs: int | None = None
    repeats: int = 3
    textbook: bool = True
    textbook_precisions: Sequence[str] = ("fp32",)
    data_dir: str | None = None
    data: str = "mnist"  # any --data of `mirrorfit train` (mirrorfit.data.spec.source_kind)
    input_shape: tuple[int, ...] | None = None  # synthetic; default: the model's own
    num_classes: int | None = None  # synthetic; default: the model's own
    # Shaping file sources, as `mirrorfit train`'s flags of the same names: resize to
    # (height, width) pixels ("H,W" or a tuple), TFRecord features, decoded-example cache,
    # share of training examples held out (validation is not measured, but it changes which
    # examples are trained on).
    image_size: tuple[int, int] | str | None = None
    image_feature: str = "image/encoded"
    label_feature: str = "image/class/label"
    cache: str | None = None
    validation_split: float | None = None
    # The --model function's model is compiled (run_bench sets it once it has built one):
    # every point trains it as compiled, through mirrorfit.fit or the model's own fit.
    compiled: bool = False

    @property
    def kind(self) -> str:
        """The kind of ``data`` (mirrorfit.data.spec.KINDS); ConfigError if it names none."""
        return source_kind(self.data)

    def shape_and_classes(self) -> tuple[tuple[int, ...], int]:
        """(one example's input shape, number of classes) the model is built for: MNIST's
        (28, 28) and 10, or on synthetic data the flags', else the model's defaults (an
        application's ImageNet size and 1000 classes). Other sources bring their own, known
        once opened (:func:`mirrorfit.bench.source.open_source`): ValueError here."""
        if self.data not in DATA:
            raise ValueError(f"--data {self.data}: its shape is known once it is opened")
        if self.data == "mnist":
            return (28, 28), 10
        app = is_application(self.model)
        shape = self.input_shape or (default_input_shape(self.model) if app else (28, 28))
        return tuple(shape), self.num_classes or (IMAGENET_CLASSES if app else 10)

    def check(self) -> None:
        """MirrorfitError, one line, for a data source, model or shape that cannot run:
        plain Python, before any process starts."""
        kind = self.kind  # a --data that names no source fails first
        _check_precisions(self)
        _check_counts(self)
        _check_backends(self, kind)
        if self.data == "mnist" and (self.input_shape or self.num_classes):
            raise MirrorfitError(
                "--input-shape and --num-classes set the synthetic data; MNIST "
                "is 28x28 with 10 classes (use --data synthetic)"
            )
        check_model_name(self.model)
        _check_sizes(self)
        self.source_config()  # the file flags, checked as `mirrorfit train` checks them
        if kind in DATA:  # other sources' shapes are checked against the model once opened
            _check_model_takes_data(self)

    def source_config(self) -> TrainConfig:
        """The data flags as `mirrorfit train` reads them: ConfigError, one line, for a source
        that does not exist or a flag that does not apply to it (``--image-size`` on MNIST,
        ``--cache`` on arrays, ...); ``image_size`` comes back as (height, width)."""
        # bench has always taken --data-dir alongside --data synthetic (and ignored it); train
        # refuses it there. Kept, so that existing bench command lines still run.
        data_dir = None if self.kind == "synthetic" else self.data_dir
        return load_config(
            model=self.model,
            data=self.data,
            data_dir=data_dir,
            image_size=self.image_size,
            image_feature=self.image_feature,
            label_feature=self.label_feature,
            cache=self.cache,
            validation_split=self.validation_split,
            input_shape=self.input_shape,
            num_classes=self.num_classes,
        )

    def points(self) -> list[Point]:
        """mirrorfit points (the cross product), then the textbook recipe (Keras ``fit`` under
        MirroredStrategy) at each replica count and each of ``textbook_precisions``."""
        self.check()
        base = _with_data(self, _workload_point(self))
        _check_workload(base, synthetic=self.data == "synthetic")
        out = _mirrorfit_points(self, base)
        if self.textbook:  # Keras's own fit on each backend: the yardstick rows
            out += _textbook_points(self, base)
        return out


# Grid.check's stages, in the order it runs them (the first problem found is the one reported).


def _check_precisions(grid: Grid) -> None:
    """MirrorfitError for a precision name that is not one of PRECISIONS."""
    for flag, names in (
        ("--precision", grid.precisions),
        ("--textbook-precision", grid.textbook_precisions),
    ):
        for name in names:
            if name not in PRECISIONS:
                raise MirrorfitError(
                    f"unknown precision {name!r} in {flag}; choose from {', '.join(PRECISIONS)}"
                )


def _check_counts(grid: Grid) -> None:
    """MirrorfitError for a count flag (replicas, accumulation, steps, repeats) below 1."""
    for flag, values in (
        ("--replicas", grid.replicas),
        ("--accum-steps", grid.accum_steps),
        ("--steps-per-execution", grid.steps_per_execution),
        ("--repeats", (grid.repeats,)),
    ):
        if not values or min(values) < 1:
            raise MirrorfitError(f"{flag} needs positive integers, got {tuple(values)}")


def _check_backends(grid: Grid, kind: str) -> None:
    """MirrorfitError for an unknown backend, none at all, or JAX rows on data they can't read."""
    for backend in grid.backends:
        if backend not in BACKENDS:
            raise MirrorfitError(
                f"unknown backend {backend!r} in --backend; choose from {', '.join(BACKENDS)}"
            )
    if not grid.backends:
        raise MirrorfitError("--backend needs at least one of tensorflow, jax")
    if "jax" in grid.backends and kind not in DATA:
        raise MirrorfitError(
            f"--data {grid.data}: bench's JAX rows read MNIST or synthetic "
            "data; use --backend tensorflow for other sources"
        )


def _check_sizes(grid: Grid) -> None:
    """MirrorfitError for a batch, example count, class count or input shape out of range."""
    for flag, value in (
        ("--global-batch-size", grid.global_batch),
        ("--train-examples", grid.train_examples),
    ):
        if value is not None and value < 1:  # -5 would slice x[:-5]; 0 would mean "all"
            raise MirrorfitError(f"{flag} must be 1 or more, got {value}; e.g. {flag} 64")
    if grid.num_classes is not None and grid.num_classes < 2:
        raise MirrorfitError(f"--num-classes must be 2 or more, got {grid.num_classes}")
    if grid.num_classes is not None and grid.num_classes > MAX_CLASSES:
        raise MirrorfitError(
            f"--num-classes {grid.num_classes}: at most {MAX_CLASSES:,}; e.g. --num-classes 10"
        )
    if grid.input_shape is not None and (not grid.input_shape or min(grid.input_shape) < 1):
        raise MirrorfitError(
            f"--input-shape must be positive sizes, e.g. 224,224,3; got "
            f"{','.join(map(str, grid.input_shape)) or 'nothing'}"
        )


def _check_model_takes_data(grid: Grid) -> None:
    """MirrorfitError where the model cannot take MNIST's or the synthetic examples."""
    if grid.data == "mnist" and is_application(grid.model):
        raise MirrorfitError(
            f"--model {grid.model} needs images with channels of at least "
            "32x32 pixels; MNIST's are 28x28 grey: use --data synthetic "
            "--input-shape 32,32,3 (or larger)"
        )
    check_input_shape(grid.model, grid.shape_and_classes()[0])


# Grid.points' stages.


def _workload_point(grid: Grid) -> Point:
    """The point every row starts from: the model's workload (batch, examples, epochs), where
    the flags do not set them."""
    synthetic, files = grid.data == "synthetic", grid.data not in DATA
    batch, n_train, epochs = (
        SYNTHETIC_WORKLOAD if synthetic else WORKLOADS.get(grid.model, (64, None, 2))
    )
    if files:  # the MNIST subsets are MNIST's; other data is used whole by default
        n_train = None
    return Point(
        kind="mirrorfit",
        model=grid.model,
        global_batch=_given(grid.global_batch, batch),
        train_examples=_given(grid.train_examples, n_train),
        epochs=_given(grid.epochs, epochs),
        data_dir=grid.data_dir,
        data=grid.data,
        compiled=grid.compiled,
    )


def _with_data(grid: Grid, base: Point) -> Point:
    """``base`` with the data's arguments: the synthetic shape and classes, or a file
    source's flags; MNIST's as they are."""
    if grid.data == "synthetic":
        shape, classes = grid.shape_and_classes()
        return replace(base, input_shape=shape, num_classes=classes)
    if grid.data in DATA:
        return base
    flags = grid.source_config()  # the flags as given: the point's process passes them on
    return replace(
        base,
        data_dir=None,
        input_shape=flags.input_shape,
        num_classes=flags.num_classes,
        image_size=flags.image_size,
        image_feature=flags.image_feature,
        label_feature=flags.label_feature,
        cache=flags.cache,
        validation_split=flags.validation_split,
    )


def _check_workload(base: Point, *, synthetic: bool) -> None:
    """MirrorfitError for a workload that times nothing: under one batch, or one epoch."""
    if synthetic and base.train_examples < base.global_batch:
        raise MirrorfitError(
            f"--train-examples {base.train_examples} (examples per "
            f"synthetic epoch) is less than one global batch of "
            f"{base.global_batch}"
        )
    if base.epochs < 2:
        raise MirrorfitError("bench needs --epochs 2 or more: epoch 1 compiles and is not timed")


def _mirrorfit_points(grid: Grid, base: Point) -> list[Point]:
    """mirrorfit's points: the cross product of the grid's settings, each once, each batch
    checked to split over its replicas and accumulation steps."""
    out = [
        replace(
            base,
            backend=b,
            replicas=r,
            precision=p,
            xla=x and not _compiles_every_step(b),
            accum_steps=k,
            steps_per_execution=s,
        )
        for b, r, p, x, k, s in itertools.product(
            grid.backends,
            grid.replicas,
            grid.precisions,
            # JAX compiles every step: one row, not an "xla" twin
            grid.xla,
            grid.accum_steps,
            grid.steps_per_execution,
        )
    ]
    out = list(dict.fromkeys(out))
    for p in out:
        split_batch(p.global_batch, p.replicas, p.accum_steps)
    return out


def _textbook_points(grid: Grid, base: Point) -> list[Point]:
    """Keras's own fit at each backend, textbook precision and replica count."""
    spe = grid.steps_per_execution[0]
    return [
        replace(
            base,
            kind="textbook",
            backend=b,
            replicas=r,
            precision=p,
            steps_per_execution=spe if b == "jax" else base.steps_per_execution,
        )
        for b in grid.backends
        for p in grid.textbook_precisions
        for r in grid.replicas
    ]


def failure_line(stderr: str, returncode: int) -> str:
    """What a failed point's report says: the native runtime's fatal line (``F1201 ...``, which
    a stack trace of addresses follows) where there is one, else the last line on stderr."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    fatal = [ln for ln in lines if re.match(r"F\d{4} ", ln)]
    if fatal:
        return fatal[0].split("] ", 1)[-1]
    return lines[-1] if lines else f"exit code {returncode}"


def spawn(point: Point, timeout_s: float = 1800) -> dict:
    """Run one point in a fresh interpreter; its measurements, or an ``error``."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "mirrorfit.bench.point", point.to_json()],
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout_s:.0f} s"}
    if proc.returncode:
        return {"error": failure_line(proc.stderr, proc.returncode)}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_grid(
    grid: Grid,
    *,
    on_run: Callable[[Point, dict], None] = lambda p, r: None,
    runner: Callable[[Point], dict] = spawn,
) -> tuple[dict, list[tuple[Point, list]]]:
    """Measure the matmul peak, then every point ``grid.repeats`` times, alternating the order,
    then the peak again.

    Returns (peak FLOP/s by backend and dtype, the best of the two measurements; [(point, [run
    results])]). ``on_run`` sees each result as it comes, the peaks' included (for progress).
    """
    # Twice, the best kept: a peak measured while the machine is busy would put MFU above 1.
    points = grid.points()
    peak = _measure_peaks(grid, points, runner, on_run)
    runs: dict[Point, list[dict]] = {p: [] for p in points}
    for rep in range(grid.repeats):
        for point in points if rep % 2 == 0 else points[::-1]:
            result = runner(point)
            runs[point].append(result)
            on_run(point, result)
    again = _measure_peaks(grid, points, runner, on_run)
    peak = {b: {d: max(v, again[b].get(d, 0.0)) for d, v in peak[b].items()} for b in peak}
    return peak, [(p, runs[p]) for p in points]


def _measure_peaks(
    grid: Grid,
    points: list[Point],
    runner: Callable[[Point], dict],
    on_run: Callable[[Point, dict], None],
) -> dict:
    """Each backend's matmul peak (FLOP/s by dtype, those its ``points`` compute in): its
    MFU's denominator."""
    peak = {}
    for backend in grid.backends:
        used = {COMPUTE_DTYPES[p.precision] for p in points if p.backend == backend}
        dtypes = tuple(d for d in COMPUTE_DTYPES.values() if d in used)
        peak_point = Point(kind="peak", backend=backend, dtypes=dtypes)
        peak[backend] = runner(peak_point)
        on_run(peak_point, peak[backend])
        if "error" in peak[backend]:
            raise MirrorfitError(
                f"measuring the matmul peak ({backend}) failed: {peak[backend]['error']}"
            )
    return peak


def _compiles_every_step(backend: str) -> bool:
    """Whether ``backend``'s engine compiles every step (no "xla" twin row for it)."""
    from mirrorfit.engine.backends import capabilities

    return capabilities(backend).compiles_every_step


__all__ = ["Grid", "WORKLOADS", "SYNTHETIC_WORKLOAD", "DATA", "run_grid", "spawn"]
