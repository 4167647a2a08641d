"""bench.grid: the points of a grid, and the alternating, repeated run order."""

import pytest

from mirrorfit.bench.grid import Grid, run_grid
from mirrorfit.errors import MirrorfitError


def test_points_are_the_cross_product_plus_the_textbook_per_replica_count():
    grid = Grid(model="cnn", replicas=(1, 2), precisions=("fp32", "bf16"), xla=(False, True))
    points = grid.points()
    ours = [p for p in points if p.kind == "mirrorfit"]
    assert len(ours) == 8 and len(points) == 10
    assert {p.global_batch for p in points} == {100}  # the CNN workload's default
    assert [p.replicas for p in points if p.kind == "textbook"] == [1, 2]


def test_textbook_rows_at_each_requested_precision():
    points = Grid(replicas=(1, 2), precisions=("bf16",), textbook_precisions=("fp32", "bf16"))\
        .points()
    book = [(p.replicas, p.precision) for p in points if p.kind == "textbook"]
    assert book == [(1, "fp32"), (2, "fp32"), (1, "bf16"), (2, "bf16")]
    assert points[-1].label == "textbook fit x2 bf16"


def test_runs_alternate_order_and_repeat():
    grid = Grid(replicas=(1, 2), precisions=("fp32",), repeats=3, textbook=False)
    order = []

    def runner(point):
        order.append(point.kind if point.kind == "peak" else point.replicas)
        return ({"float32": 1.0} if point.kind == "peak"
                else {"examples_per_sec": 1.0, "test_accuracy": 0.9})

    peak, runs = run_grid(grid, runner=runner)
    assert order == ["peak", 1, 2, 2, 1, 1, 2]
    assert [len(r) for _, r in runs] == [3, 3]


def test_bad_grids_are_refused_before_running():
    with pytest.raises(MirrorfitError, match="not divisible by 2 replicas x 4"):
        Grid(replicas=(2,), accum_steps=(4,), global_batch=100).points()
    with pytest.raises(MirrorfitError, match="--epochs 2 or more"):
        Grid(epochs=1).points()


def test_synthetic_points_carry_the_shape_and_classes():
    grid = Grid(model="ResNet50", data="synthetic", input_shape=(64, 64, 3), num_classes=10,
                replicas=(1, 2), precisions=("fp32",))
    points = grid.points()
    assert {(p.data, p.input_shape, p.num_classes) for p in points} == {
        ("synthetic", (64, 64, 3), 10)}
    assert {(p.global_batch, p.train_examples, p.epochs) for p in points} == {(32, 160, 2)}
    assert [p.kind for p in points] == ["mirrorfit", "mirrorfit", "textbook", "textbook"]
    # an application's defaults on synthetic data: ImageNet's size and classes
    assert Grid(model="MobileNetV2", data="synthetic").shape_and_classes() == ((224, 224, 3), 1000)
    # a point goes to its process as JSON and back (the shape a tuple again: points are keys)
    from mirrorfit.bench.point import Point
    import json
    assert Point(**json.loads(points[0].to_json())) == points[0]


@pytest.mark.parametrize("grid, match", [
    (Grid(data="imagenet"), "bench measures on mnist or synthetic"),
    (Grid(model="ResNet50"), "MNIST's are 28x28 grey: use --data synthetic"),
    (Grid(model="ResNet50", data="synthetic", input_shape=(16, 16, 3)), "at least 32x32"),
    (Grid(input_shape=(28, 28)), "--input-shape and --num-classes set the synthetic data"),
    (Grid(data="synthetic", num_classes=1), "--num-classes must be 2 or more"),
    (Grid(model="resnet50", data="synthetic"), "did you mean 'ResNet50'"),
])
def test_bad_data_models_and_shapes_are_refused_before_running(grid, match):
    with pytest.raises(MirrorfitError, match=match):
        grid.points()
