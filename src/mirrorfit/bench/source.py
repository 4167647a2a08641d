"""What a bench grid trains on, opened once in the bench's own process before any point runs.
MNIST and synthetic data need no framework (28x28 and 10 classes; the flags' or the model's);
MNIST's file is loaded once and checked as ``mirrorfit train`` checks it. Any other ``--data``
is opened with the arguments every point will use: a bad source or a model that cannot take its
examples is one line and exit 2 first. (why: docs/architecture.md#the-bench)
"""

from __future__ import annotations

from dataclasses import dataclass

from mirrorfit.bench.grid import DATA, Grid
from mirrorfit.bench.fit_point import load_source
from mirrorfit.bench.point import Point
from mirrorfit.data.spec import KINDS
from mirrorfit.errors import DataError, MirrorfitError
from mirrorfit.models.names import check_input_shape, is_application, min_size


@dataclass(frozen=True)
class BenchSource:
    """A grid's data: one example's ``input_shape`` (pixels: height, width, channels),
    ``num_classes``, a short ``label`` for the title line and the ``description`` of the
    source (:attr:`mirrorfit.data.sources.Data.description`), and whether it has a test split
    (else test accuracy is None in every row)."""

    input_shape: tuple[int, ...]
    num_classes: int
    label: str
    description: str
    has_test: bool


def open_source(grid: Grid, point: Point) -> BenchSource:
    """``grid``'s data as ``point`` (any point of the grid: they share the data arguments)
    reads it. MirrorfitError, one line, for a source that cannot be read or a keras.applications
    model too large for its examples."""
    if grid.data in DATA:
        if grid.data == "mnist":
            _check_mnist(point)
        shape, classes = grid.shape_and_classes()
        label = (
            "MNIST"
            if grid.data == "mnist"
            else f"synthetic {'x'.join(map(str, shape))}, {classes} classes"
        )
        return BenchSource(shape, classes, label, label, has_test=grid.data == "mnist")
    data = load_source(point)
    shape = tuple(data.input_shape)
    if is_application(grid.model):
        try:
            check_input_shape(grid.model, shape)
        except MirrorfitError:
            size = max(min_size(grid.model), 32)
            raise DataError(
                f"--data {grid.data} gives examples of shape {'x'.join(map(str, shape))}; "
                f"--model {grid.model} takes height x width x channels images of at least "
                f"{size}x{size} pixels"
                + (f": pass --image-size {size},{size}" if KINDS[data.kind].files else "")
                + " or use --model mlp/cnn"
            ) from None
    return BenchSource(
        shape, data.num_classes, grid.data, data.description, has_test=data.test is not None
    )


def _check_mnist(point: Point) -> None:
    """MNIST found, sound, and holding at least one global batch of ``point``'s training
    examples; else DataError, one line (each point would fail on its own, after the matmul
    peak, or divide by zero steps)."""
    from mirrorfit.data.mnist import load_mnist
    from mirrorfit.data.sources import check_one_batch

    check_one_batch(
        "mnist",
        point.global_batch,
        len(
            load_mnist(point.data_dir, train_examples=point.train_examples, download=False).x_train
        ),
    )


def check_model_fits(model, source: BenchSource, spec: str) -> None:
    """Refuse, in one line, a model (built for ``source``) whose input does not take its
    examples or whose outputs are fewer than its classes: a package.module:function model
    ignores the shape it is offered, and every point would fail the same way."""
    want = tuple(model.inputs[0].shape[1:])
    have = source.input_shape
    if len(want) != len(have) or any(w is not None and w != h for w, h in zip(want, have)):
        shown = "x".join("?" if w is None else str(w) for w in want)
        raise DataError(
            f"--data {source.label} gives examples of shape "
            f"{'x'.join(map(str, have))} but --model {spec} takes {shown}; give a "
            "model built for the data (a model function takes input_shape)"
        )
    outputs = model.outputs[0].shape[-1]
    if outputs is not None and outputs < source.num_classes:
        raise DataError(
            f"--data {source.label} has {source.num_classes} classes but --model "
            f"{spec} has {outputs} outputs; pass --num-classes "
            f"{source.num_classes} (a model function takes it as num_classes)"
        )


__all__ = ["BenchSource", "check_model_fits", "open_source"]
