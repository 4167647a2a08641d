"""data.mnist: find mnist.npz (flag, $MIRRORFIT_DATA, Keras cache, download), split it, and
reject missing or malformed files with a clear DataError."""

import numpy as np
import pytest

from mirrorfit.data.mnist import load_mnist, locate_mnist
from mirrorfit.errors import DataError


def test_real_mnist_splits_as_in_the_chapter(mnist_dir):
    s = load_mnist(str(mnist_dir), download=False)
    assert s.x_val.shape == (5000, 28, 28) and s.x_train.shape == (55000, 28, 28)
    assert s.x_test.shape == (10000, 28, 28) and s.x_train.dtype == np.uint8
    with np.load(mnist_dir / "mnist.npz") as f:  # validation = the first 5,000 images
        np.testing.assert_array_equal(s.x_val, f["x_train"][:5000])
        np.testing.assert_array_equal(s.y_train[:10], f["y_train"][5000:5010])


def test_train_examples_takes_the_first_n(mnist_dir):
    s = load_mnist(str(mnist_dir), train_examples=1000, download=False)
    assert len(s.x_train) == 1000 and len(s.x_val) == 5000


def test_train_examples_too_many(mnist_dir):
    with pytest.raises(DataError, match="--train-examples 60000 is more than the 55000"):
        load_mnist(str(mnist_dir), train_examples=60000, download=False)


def test_env_var_then_keras_cache_order(tmp_path, monkeypatch, mnist_dir):
    monkeypatch.setenv("MIRRORFIT_DATA", str(mnist_dir))
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras"))
    assert locate_mnist(download=False) == mnist_dir / "mnist.npz"
    monkeypatch.delenv("MIRRORFIT_DATA")
    cache = tmp_path / "keras" / "datasets"
    cache.mkdir(parents=True)
    (cache / "mnist.npz").write_bytes((mnist_dir / "mnist.npz").read_bytes())
    assert locate_mnist(download=False) == cache / "mnist.npz"


def test_nothing_found_lists_what_was_tried(tmp_path, monkeypatch):
    monkeypatch.delenv("MIRRORFIT_DATA", raising=False)
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    with pytest.raises(DataError, match=r"MNIST not found; tried Keras cache .* --data-dir"):
        locate_mnist(download=False)


def test_wrong_data_dir_is_an_error_not_a_fallback(tmp_path):
    with pytest.raises(DataError, match=f"no mnist.npz at --data-dir {tmp_path}"):
        locate_mnist(str(tmp_path), download=False)


def test_corrupt_file(tmp_path):
    (tmp_path / "mnist.npz").write_bytes(b"not a zip at all")
    with pytest.raises(DataError, match="is not a valid MNIST npz file"):
        load_mnist(str(tmp_path), download=False)


def test_wrong_layout(tmp_path):
    np.savez(tmp_path / "mnist.npz", x_train=np.zeros((10, 32, 32), np.uint8),
             y_train=np.zeros(10), x_test=np.zeros((2, 28, 28)), y_test=np.zeros(2))
    with pytest.raises(DataError, match=r"x_train has shape \(10, 32, 32\)"):
        load_mnist(str(tmp_path), download=False)


def test_missing_key(tmp_path):
    np.savez(tmp_path / "mnist.npz", x_train=np.zeros((10, 28, 28), np.uint8))
    with pytest.raises(DataError, match="is not a valid MNIST npz file"):
        load_mnist(str(tmp_path), download=False)
