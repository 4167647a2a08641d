"""Find and load MNIST in the ``keras.datasets.mnist`` npz layout.

Search order: ``data_dir`` argument (``--data-dir``), ``$MIRRORFIT_DATA``, the Keras cache
(``~/.keras/datasets/mnist.npz``), then Keras's download. Validation is the first 5,000
training images, as in the chapter.
"""

from __future__ import annotations

import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mirrorfit.errors import DataError

FILENAME = "mnist.npz"
VALIDATION_SIZE = 5000
_KEYS = {"x_train": (60000, 28, 28), "y_train": (60000,), "x_test": (10000, 28, 28),
         "y_test": (10000,)}


@dataclass(frozen=True)
class Splits:
    """uint8 images (N, 28, 28) and int labels (N,) for train, validation and test."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    source: str


def _candidates(data_dir: str | None) -> list[tuple[str, Path]]:
    out = []
    if data_dir:
        out.append(("--data-dir", Path(data_dir)))
    if os.environ.get("MIRRORFIT_DATA"):
        out.append(("$MIRRORFIT_DATA", Path(os.environ["MIRRORFIT_DATA"])))
    keras_home = Path(os.environ.get("KERAS_HOME", Path.home() / ".keras"))
    out.append(("Keras cache", keras_home / "datasets"))
    return out


def locate_mnist(data_dir: str | None = None, *, download: bool = True) -> Path:
    """Path of mnist.npz. A given ``data_dir`` may be the file itself or its folder."""
    tried = []
    for origin, path in _candidates(data_dir):
        file = path if path.suffix == ".npz" else path / FILENAME
        if file.is_file():
            return file
        tried.append(f"{origin} ({file})")
        if origin == "--data-dir":  # an explicit path that is wrong is an error, not a hint
            raise DataError(f"no {FILENAME} at --data-dir {data_dir}; point it at the folder "
                            f"holding {FILENAME} or at the file itself")
    if download:
        try:
            import keras

            return Path(keras.utils.get_file(FILENAME, origin="https://storage.googleapis.com/"
                                             "tensorflow/tf-keras-datasets/mnist.npz"))
        except Exception as e:  # no network here is the common case
            tried.append(f"download ({type(e).__name__})")
    raise DataError(f"MNIST not found; tried {'; '.join(tried)}. Pass --data-dir DIR or set "
                    f"MIRRORFIT_DATA to a folder with {FILENAME}")


def load_mnist(data_dir: str | None = None, *, train_examples: int | None = None,
               download: bool = True) -> Splits:
    """Load and split MNIST: validation = first 5,000 training images, train = the rest
    (the first ``train_examples`` of them, if given). Raises DataError if malformed."""
    path = locate_mnist(data_dir, download=download)
    try:
        with np.load(path) as f:
            arrays = {k: f[k] for k in _KEYS}
    except (KeyError, ValueError, OSError, zipfile.BadZipFile, EOFError) as e:
        raise DataError(f"{path} is not a valid MNIST npz file ({type(e).__name__}: {e}); "
                        "expected keras.datasets.mnist's layout (x_train, y_train, x_test, "
                        "y_test)") from None
    for key, shape in _KEYS.items():
        if arrays[key].shape[1:] != shape[1:] or len(arrays[key]) < 1:
            raise DataError(f"{path}: {key} has shape {arrays[key].shape}, expected "
                            f"{('N',) + shape[1:]}; is this keras.datasets.mnist's npz?")
    if len(arrays["x_train"]) != len(arrays["y_train"]):
        raise DataError(f"{path}: x_train and y_train differ in length")
    x, y = arrays["x_train"], arrays["y_train"].astype(np.int32)
    x_train, y_train = x[VALIDATION_SIZE:], y[VALIDATION_SIZE:]
    if train_examples is not None:
        if train_examples > len(x_train):
            raise DataError(f"--train-examples {train_examples} is more than the "
                            f"{len(x_train)} training images available")
        x_train, y_train = x_train[:train_examples], y_train[:train_examples]
    return Splits(x_train=x_train, y_train=y_train, x_val=x[:VALIDATION_SIZE],
                  y_val=y[:VALIDATION_SIZE], x_test=arrays["x_test"],
                  y_test=arrays["y_test"].astype(np.int32), source=str(path))
