"""bench.grid: the points of a grid, and the alternating, repeated run order."""

import json

import numpy as np
import pytest

from data_fixtures import mnist, write_png_folder
from mirrorfit.bench.grid import Grid, run_grid
from mirrorfit.bench.point import Point
from mirrorfit.errors import MirrorfitError


def test_points_are_the_cross_product_plus_the_textbook_per_replica_count():
    grid = Grid(model="cnn", replicas=(1, 2), precisions=("fp32", "bf16"), xla=(False, True))
    points = grid.points()
    ours = [p for p in points if p.kind == "mirrorfit"]
    assert len(ours) == 8 and len(points) == 10
    assert {p.global_batch for p in points} == {100}  # the CNN workload's default
    assert [p.replicas for p in points if p.kind == "textbook"] == [1, 2]


def test_textbook_rows_at_each_requested_precision():
    points = Grid(
        replicas=(1, 2), precisions=("bf16",), textbook_precisions=("fp32", "bf16")
    ).points()
    book = [(p.replicas, p.precision) for p in points if p.kind == "textbook"]
    assert book == [(1, "fp32"), (2, "fp32"), (1, "bf16"), (2, "bf16")]
    assert points[-1].label == "textbook fit x2 bf16"


def test_runs_alternate_order_and_repeat():
    grid = Grid(replicas=(1, 2), precisions=("fp32",), repeats=3, textbook=False)
    order = []

    def runner(point):
        order.append(point.kind if point.kind == "peak" else point.replicas)
        return (
            {"float32": 1.0}
            if point.kind == "peak"
            else {"examples_per_sec": 1.0, "test_accuracy": 0.9}
        )

    peak, runs = run_grid(grid, runner=runner)
    assert order == ["peak", 1, 2, 2, 1, 1, 2, "peak"]
    assert [len(r) for _, r in runs] == [3, 3]


def test_bad_grids_are_refused_before_running():
    with pytest.raises(MirrorfitError, match="not divisible by 2 replicas x 4"):
        Grid(replicas=(2,), accum_steps=(4,), global_batch=100).points()
    with pytest.raises(MirrorfitError, match="--epochs 2 or more"):
        Grid(epochs=1).points()


def test_synthetic_points_carry_the_shape_and_classes():
    grid = Grid(
        model="ResNet50",
        data="synthetic",
        input_shape=(64, 64, 3),
        num_classes=10,
        replicas=(1, 2),
        precisions=("fp32",),
    )
    points = grid.points()
    assert {(p.data, p.input_shape, p.num_classes) for p in points} == {
        ("synthetic", (64, 64, 3), 10)
    }
    assert {(p.global_batch, p.train_examples, p.epochs) for p in points} == {(32, 160, 2)}
    assert [p.kind for p in points] == ["mirrorfit", "mirrorfit", "textbook", "textbook"]
    # an application's defaults on synthetic data: ImageNet's size and classes
    assert Grid(model="MobileNetV2", data="synthetic").shape_and_classes() == ((224, 224, 3), 1000)
    # a point goes to its process as JSON and back (the shape a tuple again: points are keys)
    from mirrorfit.bench.point import Point
    import json

    assert Point(**json.loads(points[0].to_json())) == points[0]


@pytest.mark.parametrize(
    "grid, match",
    [
        (
            Grid(data="imagenet"),
            "--data imagenet: no such file or folder; use mnist, synthetic, FILE.npz",
        ),
        (Grid(model="ResNet50"), "MNIST's are 28x28 grey: use --data synthetic"),
        (Grid(model="ResNet50", data="synthetic", input_shape=(16, 16, 3)), "at least 32x32"),
        (Grid(input_shape=(28, 28)), "--input-shape and --num-classes set the synthetic data"),
        (Grid(data="synthetic", num_classes=1), "--num-classes must be 2 or more"),
        (Grid(model="resnet50", data="synthetic"), "did you mean 'ResNet50'"),
        (Grid(train_examples=-5), "--train-examples must be 1 or more, got -5"),
        (Grid(global_batch=-8), "--global-batch-size must be 1 or more, got -8"),
        # 0 is a value given, not "the default" (it ran the workload's epochs without a word)
        (Grid(epochs=0), "bench needs --epochs 2 or more"),
        (Grid(train_examples=0), "--train-examples must be 1 or more, got 0"),
        (Grid(global_batch=0), "--global-batch-size must be 1 or more, got 0"),
    ],
)
def test_bad_data_models_and_shapes_are_refused_before_running(grid, match):
    with pytest.raises(MirrorfitError, match=match):
        grid.points()


@pytest.fixture
def sources(tmp_path):
    """An npz, a PNG folder and a (never opened) TFRecord file: plain Python checks only."""
    x, y = mnist(40)
    np.savez(tmp_path / "d.npz", x_train=x, y_train=y)
    write_png_folder(tmp_path / "imgs", x, y)
    (tmp_path / "a.tfrecord").write_bytes(b"")
    return tmp_path


def test_file_source_points_carry_the_source_and_the_train_flags(sources):
    npz = str(sources / "d.npz")
    points = Grid(model="cnn", data=npz, replicas=(1, 2), precisions=("fp32",)).points()
    # the CNN's MNIST batch and epochs, but all of the source's examples (not MNIST's 12,800)
    assert {
        (p.data, p.global_batch, p.train_examples, p.epochs, p.input_shape, p.image_size)
        for p in points
    } == {(npz, 100, None, 2, None, None)}
    assert [p.kind for p in points] == ["mirrorfit", "mirrorfit", "textbook", "textbook"]
    folder = str(sources / "imgs")
    grid = Grid(
        data=folder,
        image_size="32,32",
        cache="memory",
        validation_split=0.25,
        num_classes=12,
        train_examples=30,
        replicas=(1,),
        precisions=("fp32",),
    )
    points = grid.points()
    assert {
        (p.image_size, p.cache, p.validation_split, p.num_classes, p.train_examples) for p in points
    } == {((32, 32), "memory", 0.25, 12, 30)}
    assert Point(**json.loads(points[0].to_json())) == points[0]  # image_size a tuple again
    records = Grid(
        data=str(sources / "a.tfrecord"),
        image_feature="img",
        label_feature="cls",
        replicas=(1,),
        precisions=("fp32",),
    ).points()
    assert {(p.image_feature, p.label_feature) for p in records} == {("img", "cls")}
    # bench has always ignored --data-dir with synthetic data (train refuses it): still runs
    assert Grid(data="synthetic", data_dir="/elsewhere").points()
    with pytest.raises(ValueError, match="known once it is opened"):
        Grid(data=npz).shape_and_classes()


@pytest.mark.parametrize(
    "changes, match",
    [
        (dict(data="{tmp}/missing.npz"), "--data {tmp}/missing.npz: no such file"),
        (dict(data="{tmp}/*.tfrec"), "the pattern matches no file"),
        (dict(data="{tmp}/imgs", image_size="28"), "--image-size 28: expected 2 positive integers"),
        (dict(image_size="32,32"), "--image-size resizes images read from files"),
        (dict(data="{tmp}/d.npz", cache="memory"), "is already in memory: drop --cache"),
        (dict(data="{tmp}/imgs", cache="{tmp}/d.npz"), "is a file, not a folder"),
        (dict(data="{tmp}/d.npz", image_feature="img"), "--image-feature names a TFRecord feature"),
        (dict(data="synthetic", validation_split=0.1), "--data synthetic has its own validation"),
        (dict(data="{tmp}/imgs", validation_split=1.5), "--validation-split must be a fraction"),
        (dict(data="{tmp}/imgs", data_dir="{tmp}"), "--data-dir says where MNIST is"),
    ],
)
def test_file_source_flags_are_checked_as_train_checks_them(sources, changes, match):
    values = {
        k: v.replace("{tmp}", str(sources)) if isinstance(v, str) else v for k, v in changes.items()
    }
    with pytest.raises(MirrorfitError) as info:
        Grid(**values).points()
    assert match.replace("{tmp}", str(sources)) in str(info.value)


def test_a_grid_over_both_backends_has_each_ones_rows_and_keras_fit_yardsticks():
    points = Grid(
        backends=("tensorflow", "jax"),
        replicas=(1, 2),
        precisions=("fp32",),
        xla=(False, True),
        steps_per_execution=(25,),
    ).points()
    mine = [p.label for p in points if p.kind == "mirrorfit"]
    # JAX compiles every step: no separate "xla" rows for it
    assert mine == [
        "x1 fp32 spe25",
        "x1 fp32 xla spe25",
        "x2 fp32 spe25",
        "x2 fp32 xla spe25",
        "jax x1 fp32 spe25",
        "jax x2 fp32 spe25",
    ]
    yardsticks = [(p.label, p.steps_per_execution) for p in points if p.kind == "textbook"]
    assert yardsticks == [
        ("textbook fit x1", 50),
        ("textbook fit x2", 50),
        ("jax keras fit x1", 25),
        ("jax keras fit x2", 25),
    ]


def test_run_grid_measures_each_backends_peak():
    seen = []

    def runner(point):
        seen.append((point.kind, point.backend))
        return (
            {"float32": 1.0}
            if point.kind == "peak"
            else {"examples_per_sec": 1.0, "test_accuracy": 0.9}
        )

    grid = Grid(
        backends=("tensorflow", "jax"),
        replicas=(1,),
        precisions=("fp32",),
        repeats=1,
        textbook=False,
    )
    peak, _ = run_grid(grid, runner=runner)
    assert set(peak) == {"tensorflow", "jax"}
    assert seen[:2] == seen[-2:] == [("peak", "tensorflow"), ("peak", "jax")]


@pytest.mark.parametrize(
    "precisions, textbook, dtypes",
    [
        (("fp32",), (), ("float32",)),
        (("bf16", "fp32"), (), ("float32", "bfloat16")),
        (("fp32",), ("fp16",), ("float32", "float16")),
    ],
)
def test_the_peak_measures_the_dtypes_the_points_compute_in(precisions, textbook, dtypes):
    """Each dtype's matmul takes seconds to measure: none that no row's MFU divides by."""
    asked = []

    def runner(point):
        if point.kind == "peak":
            asked.append(point.dtypes)
            return dict.fromkeys(point.dtypes, 1.0)
        return {"examples_per_sec": 1.0, "test_accuracy": 0.9}

    grid = Grid(
        replicas=(1,),
        precisions=precisions,
        repeats=1,
        textbook=bool(textbook),
        textbook_precisions=textbook or ("fp32",),
    )
    peak, _ = run_grid(grid, runner=runner)
    assert asked == [dtypes, dtypes] and tuple(peak["tensorflow"]) == dtypes


def test_run_grid_keeps_the_best_of_two_peak_measurements():
    """A peak measured while the machine was busy is not the denominator of MFU."""
    peaks = iter([{"float32": 1.0, "bfloat16": 4.0}, {"float32": 3.0, "bfloat16": 2.0}])

    def runner(point):
        return (
            next(peaks) if point.kind == "peak" else {"examples_per_sec": 1.0, "test_accuracy": 0.9}
        )

    grid = Grid(replicas=(1,), precisions=("fp32",), repeats=1, textbook=False)
    peak, _ = run_grid(grid, runner=runner)
    assert peak == {"tensorflow": {"float32": 3.0, "bfloat16": 4.0}}


@pytest.mark.parametrize(
    "grid,message",
    [
        (Grid(backends=("torch",)), "unknown backend 'torch' in --backend"),
        (Grid(backends=("jax",), data="x.npz"), "bench's JAX rows read MNIST or synthetic data"),
        (Grid(precisions=("fp8",)), "unknown precision 'fp8' in --precision"),
        (Grid(replicas=(0,)), "--replicas needs positive integers"),
    ],
)
def test_bad_backends_and_values_are_refused_before_running(grid, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.npz").write_bytes(b"")
    with pytest.raises(MirrorfitError, match=message):
        grid.points()


def test_a_point_that_aborts_is_reported_by_its_fatal_line_not_its_stack():
    """XLA's fatal abort is one `F` line and a stack of addresses: the report showed only the
    last address (`@ 0x7f4def8a71f5 (unknown)`)."""
    from mirrorfit.bench.grid import failure_line

    stderr = (
        "mirrorfit cnn on mnist.npz\n"
        "F1201 19:43:48.874255    5311 rendezvous.cc:161] [id=0] Termination timeout for "
        "`all reduce` of 40 seconds exceeded.\n*** Check failure stack trace: ***\n"
        "    @     0x7fa095440634  absl::LogMessage::SendToLog()\n"
        "    @     0x7fa0aa0a71f5  (unknown)\n"
    )
    assert failure_line(stderr, -6) == (
        "[id=0] Termination timeout for `all reduce` of 40 seconds exceeded."
    )
    assert failure_line("a\nmirrorfit: error: bad\n", 2) == "mirrorfit: error: bad"
    assert failure_line("", 137) == "exit code 137"
