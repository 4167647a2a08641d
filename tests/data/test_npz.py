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
