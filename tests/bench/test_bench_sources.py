"""`mirrorfit bench --data SOURCE` on files: a source that cannot be read, or a model that
cannot take its examples, is one line and exit code 2 before any process starts; a good one
is trained on by both sides of every point from its own pipeline, tested on its test split
(none: no accuracy), and described in bench.json."""

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import run_cli, run_isolated
from data_fixtures import mnist, write_png_folder, write_tfrecords

HERE = Path(__file__).parent


def _one_line(rc: int, err: str, needle: str) -> None:
    errors = [ln for ln in err.splitlines() if ln.startswith("mirrorfit: error:")]
    assert rc == 2 and len(errors) == 1 and "Traceback" not in err, err[-2000:]
    assert needle in errors[0], errors[0]


@pytest.mark.slow
def test_sources_that_cannot_be_read_fail_before_any_process_starts(tmp_path):
    """One interpreter runs `mirrorfit bench` (cli.main) on each bad source; starting a point's
    process (even the matmul peak's) fails the test."""
    x, y = mnist(40)
    write_png_folder(tmp_path / "imgs", x, y)
    np.savez(tmp_path / "small.npz", x_train=x, y_train=y)
    negative = y.copy()
    negative[3] = -1
    np.savez(tmp_path / "negative.npz", x_train=x, y_train=negative)
    imgs, small = str(tmp_path / "imgs"), str(tmp_path / "small.npz")
    (tmp_path / "damaged").mkdir()
    (tmp_path / "damaged" / "mnist.npz").write_bytes(b"PK\x03\x04 not a zip")
    (tmp_path / "empty").mkdir()
    # MNIST cases first: refused before any framework loads (checked below)
    cases = {
        "no mnist": (["--env"], "MNIST not found; tried $MIRRORFIT_DATA"),
        "damaged mnist": (
            ["--data-dir", str(tmp_path / "damaged")],
            "is not a valid MNIST npz file",
        ),
        "mnist batch": (
            ["--train-examples", "50"],
            "--data mnist: the global batch 64 is "
            "larger than the 50 training examples; lower --batch-size or "
            "--global-batch-size",
        ),
        "mnist examples": (
            ["--train-examples", "60000"],
            "--train-examples 60000 is more than the 55000 training images",
        ),
        "batch": (["--data", small], "the global batch 64 is larger than the 40 training"),
        "examples": (
            ["--data", small, "--train-examples", "500"],
            "--train-examples 500 is more than the 40 training examples",
        ),
        "labels": (
            ["--data", str(tmp_path / "negative.npz"), "--global-batch-size", "8"],
            "train label -1 (example 3) is negative",
        ),
        "application": (
            ["--data", imgs, "--model", "ResNet50", "--global-batch-size", "8"],
            "--model ResNet50 takes height x width x channels images of at least "
            "32x32 pixels: pass --image-size 32,32",
        ),
        "user model": (
            ["--data", imgs, "--model", "user_models:tiny", "--global-batch-size", "8"],
            "gives examples of shape 28x28x1 but --model user_models:tiny takes 28x28",
        ),
        "shape": (
            ["--data", imgs, "--input-shape", "32,32,1", "--global-batch-size", "8"],
            "--input-shape 32,32,1 is not the shape of --data",
        ),
    }
    out = run_isolated(
        HERE / "bad_sources_driver.py",
        json.dumps({name: args for name, (args, _) in cases.items()}),
        tmp_path / "out",
        tmp_path / "empty",
        timeout=300,
        fresh=True,  # it reports whether TensorFlow loaded
    )
    for name, (_, needle) in cases.items():
        rc, err, tensorflow_loaded = out[name]
        _one_line(rc, err, needle)
        if "mnist" in name:
            assert not tensorflow_loaded, name
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_bench_on_an_image_folder_tests_both_sides_on_its_test_split(tmp_path):
    x, y = mnist(1600)
    write_png_folder(tmp_path / "imgs" / "train", x, y)
    write_png_folder(tmp_path / "imgs" / "test", *mnist(300, split="test"))
    out = tmp_path / "out"
    proc = run_cli(
        "bench",
        "--data",
        str(tmp_path / "imgs"),
        "--replicas",
        "1",
        "--precision",
        "fp32",
        "--repeats",
        "1",
        "--epochs",
        "3",
        "--global-batch-size",
        "32",
        "--steps-per-execution",
        "10",
        "--out",
        str(out),
        "--recommend",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    meta = json.loads((out / "bench.json").read_text())
    assert meta["data"] == str(tmp_path / "imgs")
    assert (
        meta["data_description"].startswith("image folder")
        and "300 test" in meta["data_description"]
    )
    assert meta["input_shape"] == [28, 28, 1] and meta["num_classes"] == 10
    ours, book = meta["rows"]
    assert (ours["kind"], book["kind"]) == ("mirrorfit", "textbook")
    for row in (ours, book):  # both learnt from the decoded, scaled images: chance is 0.1
        assert row["examples_per_sec"] > 0 and row["test_accuracy"] > 0.4, row
    # the same batches, the same seed, the same 300 test images: near-equal accuracy (equal
    # here); another order or scale on one side would part them
    assert ours["test_accuracy"] == pytest.approx(book["test_accuracy"], abs=0.05)
    assert "recommended: x1 fp32 spe10" in proc.stdout and "test accuracy" in proc.stdout


@pytest.mark.slow
def test_bench_on_tfrecords_without_a_test_split_has_no_accuracy(tmp_path):
    x, y = mnist(320)
    write_tfrecords(tmp_path / "rec", x, y, shards=2)
    out = tmp_path / "out"
    proc = run_cli(
        "bench",
        "--data",
        str(tmp_path / "rec" / "*.tfrecord"),
        "--replicas",
        "1",
        "--precision",
        "fp32",
        "--repeats",
        "1",
        "--epochs",
        "2",
        "--global-batch-size",
        "32",
        "--steps-per-execution",
        "5",
        "--out",
        str(out),
        "--recommend",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    meta = json.loads((out / "bench.json").read_text())
    assert "TFRecord file(s)" in meta["data_description"]
    assert [(r["kind"], r["test_accuracy"]) for r in meta["rows"]] == [
        ("mirrorfit", None),
        ("textbook", None),
    ]
    assert all(r["examples_per_sec"] > 0 for r in meta["rows"])
    # One whole line, however long the path: not wrapped where no terminal is
    assert (
        f"--data {tmp_path / 'rec' / '*.tfrecord'} has no test split: no test accuracy "
        "(shown as -), and --recommend compares speed only\n"
    ) in proc.stderr
    assert "recommended: x1 fp32 spe5" in proc.stdout and "has no test split" in proc.stdout
