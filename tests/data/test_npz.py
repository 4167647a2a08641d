"""--data FILE.npz: the arrays np.load would give, checked before they are read."""

import zipfile

import numpy as np
import pytest

from mirrorfit.data.npz import read_npz
from mirrorfit.errors import DataError


def _save(path, **arrays):
    np.savez(path, **arrays)
    return str(path)


def test_only_the_named_splits_are_read(tmp_path):
    x, y = np.zeros((4, 3, 3), np.uint8), np.arange(4)
    path = _save(tmp_path / "d.npz", x_test=x, y_test=y)
    assert set(read_npz(path, splits=("test",))) == {"test"}
    with pytest.raises(DataError, match="needs x_train and y_train"):
        read_npz(path)


def test_arrays_in_a_subfolder_of_the_archive_are_not_the_splits(tmp_path):
    # np.load keys them "a/x_test": taking them for x_test was a KeyError traceback.
    path = tmp_path / "sub.npz"
    with zipfile.ZipFile(path, "w") as z:
        for name, a in (("a/x_test.npy", np.zeros((2, 3, 3))), ("a/y_test.npy", np.arange(2))):
            with z.open(name, "w") as f:
                np.lib.format.write_array(f, a)
    assert read_npz(str(path), splits=("test",)) == {}
    with pytest.raises(DataError, match="has 'a/x_test', 'a/y_test'; it needs x_train"):
        read_npz(str(path))


def test_a_file_of_many_arrays_is_named_in_a_few(tmp_path):
    path = _save(tmp_path / "many.npz", **{f"w{i}": np.zeros(1) for i in range(500)})
    with pytest.raises(DataError) as e:
        read_npz(path)
    assert "and 494 more" in str(e.value) and len(str(e.value)) < 400


@pytest.mark.parametrize(
    "arrays, needle",
    [
        ({"x_train": np.zeros((8, 0)), "y_train": np.arange(8)}, "x_train has shape (8, 0)"),
        ({"x_train": np.float32(1), "y_train": np.arange(8)}, "x_train is a single value"),
        ({"x_train": np.zeros((8, 2)), "y_train": np.int64(3)}, "y_train is a single value"),
        (
            {"x_train": np.zeros((8, 2)), "y_train": np.arange(8).astype("m8[s]")},
            "y_train has shape (8,) and dtype timedelta64[s]",
        ),
        (
            {"x_train": np.zeros((8, 2), "m8[s]"), "y_train": np.arange(8)},
            "x_train has shape (8, 2) and dtype timedelta64[s]",
        ),
        ({"x_train": np.zeros((8, 2)), "y_train": np.ones(8, bool)}, "dtype bool"),
    ],
)
def test_arrays_that_are_no_examples_or_labels_are_one_line(tmp_path, arrays, needle):
    """(N, 0) examples were a ZeroDivisionError in the JAX step, a 0-d array a TypeError
    (len() of unsized object), and timedelta64 labels trained: NumPy counts them as
    integers."""
    path = _save(tmp_path / "d.npz", **arrays)
    with pytest.raises(DataError) as e:
        read_npz(path)
    assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)


@pytest.mark.parametrize(
    "split, label, num_classes, needle",
    [
        (
            "train",
            2**32 + 1,
            None,
            "train label 4294967297 (example 5) would make 4,294,967,298 "
            "classes, more than 1,000,000",
        ),
        (
            "train",
            2**32 + 1,
            10,
            "train label 4294967297 (example 5) is out of range for --num-classes 10",
        ),
        ("train", -(2**40), None, "train label -1099511627776 (example 5) is negative"),
        ("val", 10**12, None, "val label 1000000000000 (example 5) would make"),
    ],
)
def test_labels_are_checked_before_they_are_cast(tmp_path, split, label, num_classes, needle):
    """Labels were cast to int32 first: 2**32 + 1 trained as class 1, 10**12 was called
    negative (-727379968), and a y_val of 10**12 built a model of 10**12 classes (an
    out-of-memory traceback: the largest label was not capped)."""
    from mirrorfit.data.sources import load_data

    y = {s: np.arange(16, dtype=np.int64) % 10 for s in ("train", "val")}
    y[split][5] = label
    path = _save(
        tmp_path / "d.npz",
        x_train=np.zeros((16, 2, 2), np.uint8),
        y_train=y["train"],
        x_val=np.zeros((16, 2, 2), np.uint8),
        y_val=y["val"],
    )
    with pytest.raises(DataError) as e:
        load_data(path, global_batch=4, num_classes=num_classes)
    assert needle in str(e.value), str(e.value)
