"""--data through `mirrorfit train`: a file-based run on 2 replicas sees every example once per
epoch; bad input is one line and exit 2 (no traceback), from the flag checks (before TensorFlow
loads) to a corrupt image met while training; a resume on changed files is refused naming
--data."""

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import run_cli, run_isolated
from data_fixtures import mnist, png, write_png_folder

HERE = Path(__file__).parent


def _one_line_error(proc, *needles):
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("mirrorfit: error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    for needle in needles:
        assert needle in errors[0], errors[0]


@pytest.mark.parametrize(
    "args, needles",
    [
        (["--data", "/nonexistent/imgs"], ["--data /nonexistent/imgs: no such file or folder"]),
        (["--data", "{tmp}/*.tfrecord"], ["the pattern matches no file"]),
        (["--data", "{tmp}", "--image-size", "28"], ["--image-size 28: expected 2 positive"]),
        (["--data", "{tmp}", "--image-size", "0,28"], ["--image-size 0,28"]),
        (["--data", "synthetic", "--input-shape", "a,b"], ["--input-shape a,b"]),
        (
            ["--data", "synthetic", "--input-shape", "1048576,1048576,3"],
            [
                "--input-shape 1048576,1048576,3: 3,298,534,883,328 elements per example, at most "
                "67,108,864"
            ],
        ),
        (["--data", "synthetic", "--num-classes", "1"], ["--num-classes must be an integer >= 2"]),
        (
            ["--data", "{tmp}", "--validation-split", "1.5"],
            ["--validation-split must be a fraction"],
        ),
        (["--validation-split", "0.1"], ["--data mnist has its own validation split"]),
        (["--data", "{tmp}", "--cache", "{tmp}/file"], ["--cache {tmp}/file is a file"]),
        (["--cache", "memory"], ["--data mnist is already in memory: drop --cache"]),
        (["--data", "{tmp}", "--data-dir", "{tmp}"], ["--data-dir says where MNIST is"]),
        (["--dataset", "mnist", "--data", "{tmp}"], ["--dataset mnist and --data", "disagree"]),
    ],
)
def test_bad_data_flags_are_one_line_before_tensorflow_loads(tmp_path, args, needles):
    (tmp_path / "file").write_text("x")
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    proc = run_cli("train", "--epochs", "1", "--no-progress", *args, timeout=120)
    _one_line_error(proc, *[n.replace("{tmp}", str(tmp_path)) for n in needles])


@pytest.mark.slow
def test_bad_data_met_while_loading_or_training_is_one_line(tmp_path):
    """One interpreter runs `mirrorfit train` (cli.main) on each bad source: every one exits 2
    with one line on stderr, no traceback. A corrupt image in the middle of a folder is met by
    the decoder while training: the line names the file."""
    x, y = mnist(300)
    write_png_folder(tmp_path / "corrupt", x, y)
    bad = sorted((tmp_path / "corrupt" / "7").glob("*.png"))[3]
    bad.write_bytes(bad.read_bytes()[:60])  # a truncated PNG: its header is still fine
    write_png_folder(tmp_path / "sizes", x[:20], y[:20])
    big = np.zeros((30, 28), np.uint8)
    (tmp_path / "sizes" / "4" / "tall.png").write_bytes(png(big))
    (tmp_path / "empty").mkdir()
    x10, y10 = mnist(64)
    y10[5] = 12
    np.savez(tmp_path / "labels.npz", x_train=x10, y_train=y10)
    cases = {
        "corrupt": ["--data", str(tmp_path / "corrupt")],
        "sizes": ["--data", str(tmp_path / "sizes")],
        "empty": ["--data", str(tmp_path / "empty")],
        "labels": ["--data", str(tmp_path / "labels.npz"), "--num-classes", "10"],
        "model": [
            "--data",
            str(tmp_path / "sizes"),
            "--image-size",
            "28,28",
            "--model",
            "user_models:tiny",
        ],
        "module": ["--data", "data_fixtures:raising_source"],
    }
    out = run_isolated(HERE / "bad_train_runs_driver.py", json.dumps(cases), timeout=600)
    needles = {
        "corrupt": [f"cannot decode {bad}", "remove or replace it"],
        "sizes": ["tall.png is 30x28 pixels, not the size of the first image", "--image-size H,W"],
        "empty": ["no class subfolders in"],
        "labels": ["train label 12 (example 5) is out of range for --num-classes 10"],
        "model": ["the --model takes examples of shape (28, 28);", "images are (28, 28, 1)"],
        "module": ["raised RuntimeError: the bucket is not reachable"],
    }
    for name, (rc, err) in out.items():
        errors = [line for line in err.splitlines() if line.startswith("mirrorfit: error:")]
        assert rc == 2 and len(errors) == 1 and "Traceback" not in err, (name, err[-2000:])
        for needle in needles[name]:
            assert needle in errors[0], (name, errors[0])


@pytest.mark.slow
def test_image_folder_on_two_replicas_sees_every_example_once_per_epoch(tmp_path):
    """The trainer's own input path (Distribution.distribute over 2 logical CPU replicas) for
    an image folder (read by index) and TFRecords (streamed): over both replicas every image
    once per epoch; then `train --replicas 2` on the folder trains every example, and a
    resume at an epoch's end after the files changed trains on what the folder holds now (as
    Keras's fit takes new data between epochs; inside an epoch it is refused:
    tests/fitting)."""
    x, y = mnist(600)
    write_png_folder(tmp_path / "png", x, y)
    from data_fixtures import write_tfrecords

    write_tfrecords(tmp_path / "tfr", x, y, shards=3)
    out = run_isolated(
        HERE / "two_replica_feed_driver.py",
        tmp_path / "png",
        tmp_path / "tfr" / "*.tfrecord",
        tmp_path / "ck",
        timeout=600,
    )
    import hashlib

    everything = sorted(hashlib.blake2b(a.tobytes(), digest_size=8).hexdigest() for a in x)
    for key in ("folder 0", "folder 1", "tfrecord 0", "tfrecord 1"):
        steps, digests = out[key]
        assert steps == 30 and digests == everything, key
    assert out["run"][:3] == [2, 27, 540] and out["run"][3] > 0.5
    (tmp_path / "png" / "3" / "extra.png").write_bytes(png(x[0]))
    proc = run_cli(
        "train",
        "--data",
        str(tmp_path / "png"),
        "--replicas",
        "2",
        "--epochs",
        "2",
        "--global-batch-size",
        "20",
        "--validation-split",
        "0.1",
        "--no-progress",
        "--optimizer",
        "adam",
        "--lr",
        "0.003",
        "--checkpoint-dir",
        str(tmp_path / "ck"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "(541 train, 60 val images" in proc.stderr and "resuming from" in proc.stderr
    assert json.dumps(out)  # the subprocess's summary was plain JSON
