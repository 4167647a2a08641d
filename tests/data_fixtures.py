"""Small data fixtures written from the real MNIST: PNG folders, TFRecords, npz files, and
``--data package.module:function`` sources (tests/ is on PYTHONPATH in subprocesses too).

PNGs are written by hand (zlib, no TensorFlow): a few thousand take well under a second.
"""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

import numpy as np

from conftest import mnist_folder

IMAGE = "image/encoded"
LABEL = "image/class/label"


def mnist(n: int, *, offset: int = 0, split: str = "train") -> tuple[np.ndarray, np.ndarray]:
    """``n`` real MNIST images (uint8 28x28) and labels from ``offset`` of the split."""
    folder = mnist_folder()
    if folder is None:
        raise FileNotFoundError("real MNIST not found (tests/conftest.py's mnist_folder)")
    with np.load(folder / "mnist.npz") as f:
        return (
            f[f"x_{split}"][offset : offset + n],
            f[f"y_{split}"][offset : offset + n].astype(np.int64),
        )


def png(image: np.ndarray) -> bytes:
    """A grayscale 8-bit PNG of a (H, W) uint8 image."""
    h, w = image.shape
    raw = b"".join(b"\0" + image[r].tobytes() for r in range(h))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data))
            + kind
            + data
            + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
        )

    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(raw, 1))
        + chunk(b"IEND", b"")
    )


def write_png_folder(root: Path, x: np.ndarray, y: np.ndarray) -> list[Path]:
    """One subfolder per class (``0`` .. ``9``), file names by index: ``root/3/00007.png``.
    Returns the files in the folder source's order (by class, then name)."""
    paths = []
    for i, (image, label) in enumerate(zip(x, y)):
        folder = root / str(int(label))
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{i:05d}.png"
        path.write_bytes(png(image))
        paths.append(path)
    return sorted(paths)


def folder_order(y: np.ndarray) -> np.ndarray:
    """The indices of the examples in the order an image folder lists them (class, index)."""
    return np.lexsort((np.arange(len(y)), y))


def write_tfrecords(
    folder: Path,
    x: np.ndarray,
    y: np.ndarray,
    shards: int,
    *,
    image_feature: str = IMAGE,
    label_feature: str = LABEL,
    labels: np.ndarray | None = None,
) -> list[Path]:
    """Example i goes to shard i % shards, in order; ``labels`` replaces ``y`` as written."""
    import tensorflow as tf

    folder.mkdir(parents=True, exist_ok=True)
    written = y if labels is None else labels
    files = []
    for s in range(shards):
        path = folder / f"train-{s:03d}-of-{shards:03d}.tfrecord"
        with tf.io.TFRecordWriter(str(path)) as w:
            for i in range(s, len(x), shards):
                feature = {}
                if image_feature:
                    feature[image_feature] = tf.train.Feature(
                        bytes_list=tf.train.BytesList(value=[png(x[i])])
                    )
                if label_feature:
                    feature[label_feature] = tf.train.Feature(
                        int64_list=tf.train.Int64List(value=[int(written[i])])
                    )
                example = tf.train.Example(features=tf.train.Features(feature=feature))
                w.write(example.SerializeToString())
        files.append(path)
    return files


# --data data_fixtures:FUNCTION sources; DATA_FIXTURE_N sets how many examples.
def _n() -> int:
    return int(os.environ.get("DATA_FIXTURE_N", "2000"))


def arrays_source():
    x, y = mnist(_n())
    return {"train": (x, y), "test": mnist(500, split="test")}


def sorted_arrays_source():
    """Training arrays in label order (all 0s, then all 1s, ...), no validation split."""
    x, y = mnist(_n())
    order = np.argsort(y, kind="stable")
    return {"train": (x[order], y[order]), "test": mnist(500, split="test")}


def sorted_dataset_source():
    """sorted_arrays_source's examples as a dataset of single examples."""
    import tensorflow as tf

    found = sorted_arrays_source()
    return {**found, "train": tf.data.Dataset.from_tensor_slices(found["train"])}


def test_read_stops_source():
    """Training arrays, and a test dataset whose first read sends this process SIGTERM (once:
    the file $STOP_MARK is written then), as a preemption during the final evaluation."""
    import signal

    import tensorflow as tf

    x, y = mnist(_n())
    tx, ty = mnist(200, split="test")
    mark = Path(os.environ["STOP_MARK"])

    def examples():
        if not mark.exists():
            mark.write_text("stopped")
            os.kill(os.getpid(), signal.SIGTERM)
        yield from zip(tx, ty)

    spec = (tf.TensorSpec(tx.shape[1:], tx.dtype), tf.TensorSpec((), ty.dtype))
    return {
        "train": (x, y),
        "test": tf.data.Dataset.from_generator(examples, output_signature=spec),
    }


def counted_arrays_source():
    """arrays_source, counting its calls in the file $CALLS."""
    calls = Path(os.environ["CALLS"])
    calls.write_text(str(int(calls.read_text()) + 1 if calls.exists() else 1))
    return arrays_source()


def dataset_source():
    import tensorflow as tf

    x, y = mnist(_n())
    tx, ty = mnist(500, split="test")
    return (
        tf.data.Dataset.from_tensor_slices((x, y)),
        None,
        tf.data.Dataset.from_tensor_slices((tx, ty)),
    )


def shrinking_later_source():
    """A dataset of single examples that yields all of them on its first two passes, then a
    third of them."""
    import tensorflow as tf

    x, y = mnist(_n())
    passes = [0]

    def examples():
        passes[0] += 1
        n = len(x) if passes[0] <= 2 else len(x) // 3
        yield from zip(x[:n], y[:n])

    return tf.data.Dataset.from_generator(
        examples,
        output_signature=(tf.TensorSpec(x.shape[1:], tf.uint8), tf.TensorSpec((), tf.int64)),
    )


def batched_dataset_source():
    """Splits as tf.data datasets the function batched itself: 64 a batch, 100 for val/test."""
    import tensorflow as tf

    x, y = mnist(_n())
    cut = len(x) * 3 // 4
    return {
        "train": tf.data.Dataset.from_tensor_slices((x[:cut], y[:cut])).batch(64),
        "val": tf.data.Dataset.from_tensor_slices((x[cut:], y[cut:])).batch(100),
        "test": tf.data.Dataset.from_tensor_slices((x[cut:], y[cut:])).batch(100),
    }


def drop_batched_source():
    """The training split batched by the function with drop_remainder (its first axis fixed)."""
    import tensorflow as tf

    x, y = mnist(_n())
    return tf.data.Dataset.from_tensor_slices((x[:400], y[:400])).batch(64, drop_remainder=True)


def scalar_examples_source():
    """Examples that are single numbers: x of shape (N,)."""
    x = np.random.default_rng(0).random(64).astype(np.float32)
    return {"train": (x, (x > 0.5).astype(np.int64))}


def empty_examples_dataset_source():
    """A dataset whose examples hold no values: shape (0,)."""
    import tensorflow as tf

    return {
        "train": tf.data.Dataset.from_tensor_slices(
            (np.zeros((64, 0), np.float32), np.arange(64) % 3)
        )
    }


def raising_source():
    raise RuntimeError("the bucket is not reachable")


def exiting_source():
    raise SystemExit(0)  # issue 24: `mirrorfit train` exited 0, nothing trained, no line


def exiting_source_with_text():
    import sys

    sys.exit("no credentials")


def hanging_source():
    """Never returns (issue 24: SIGTERM was ignored, twice; SIGINT ended it after 642 s)."""
    import time

    Path(os.environ["MIRRORFIT_TEST_MARK"]).write_text("in the function")
    while True:
        time.sleep(3600)


def blocking_dataset_source():
    """A dataset whose first example never comes: counting it at start waits inside
    TensorFlow's C++ (the main thread runs no Python, so no signal handler)."""
    import time

    import tensorflow as tf

    def examples():
        Path(os.environ["MIRRORFIT_TEST_MARK"]).write_text("in the generator")
        time.sleep(3600)
        yield np.zeros((2,), np.float32), np.int64(0)

    return tf.data.Dataset.from_generator(
        examples, output_signature=(tf.TensorSpec((2,), tf.float32), tf.TensorSpec((), tf.int64))
    )


def signal_taking_source():
    """Takes SIGTERM for itself, as some data libraries do, and returns small arrays."""
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    x, y = mnist(256)
    return x, y


def wrong_source():
    return "not data"


def one_hot_source():
    x, y = mnist(100)
    return x, np.eye(10)[y]


def tensorflow_importing_source():
    """A source whose body imports TensorFlow (under --backend jax its start-up lines must not
    reach the screen)."""
    import tensorflow as tf  # noqa: F401

    return mnist(256)


def overflowing_source():
    """MNIST x 300: under fp16 every step's gradients overflow (the loss stays finite)."""
    x, y = mnist(640)
    return x.astype(np.float32) * 300.0, y


def one_nan_source():
    """640 MNIST images, one pixel of one of them NaN."""
    x, y = mnist(640)
    x = x.astype(np.float32)
    x[3, 10, 10] = np.nan
    return x, y


def one_nan_dataset_source():
    """:func:`one_nan_source` as a tf.data dataset of single examples (not read ahead)."""
    import tensorflow as tf

    return tf.data.Dataset.from_tensor_slices(one_nan_source())
