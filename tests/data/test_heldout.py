"""A source's test split alone (mirrorfit.data.heldout, for `mirrorfit evaluate`): an image
folder of test/ alone is scored on its own class folders, a function source is read for its
test split only, and what a hostile folder or function holds is one DataError line. Tiny
data, this process: a few seconds."""

import os
import struct
import sys
import types
import zlib

import numpy as np
import pytest

from data_fixtures import mnist, png, write_png_folder
from mirrorfit.data.heldout import load_test
from mirrorfit.data.sources import load_data
from mirrorfit.errors import DataError


def _labels(test):
    return np.concatenate([y.numpy() for _, y in test.test])


def _one_line(error) -> str:
    message = str(error.value)
    assert "\n" not in message and "Traceback" not in message, message
    return message


def test_a_folder_of_test_alone_is_scored_on_its_own_class_folders(tmp_path):
    x, y = mnist(30, split="test")
    write_png_folder(tmp_path / "imgs" / "test", x, y)
    test = load_test(str(tmp_path / "imgs"), batch=8)
    assert test.kind == "folder" and test.input_shape == (28, 28, 1)
    present = sorted(set(y.tolist()))  # the first 30 test images have no 8
    assert test.num_classes == len(present) == 9
    assert test.class_names == tuple(str(c) for c in present)
    # Listed by class, then file name; label i is the i-th class folder present.
    assert np.array_equal(_labels(test), np.searchsorted(present, np.sort(y)))
    assert "test/ alone" in test.description
    assert "30 test images" in test.description
    write_png_folder(tmp_path / "imgs" / "val", x, y)  # val/ beside it changes nothing
    assert load_test(str(tmp_path / "imgs"), batch=8).num_classes == 9


def test_test_beside_train_takes_train_class_indices(tmp_path):
    """test/ lacking a class keeps train/'s indices (label i = train/'s i-th class folder)."""
    x, y = mnist(40)
    write_png_folder(tmp_path / "imgs" / "train", x, y)
    keep = y >= 5
    write_png_folder(tmp_path / "imgs" / "test", x[keep], y[keep])
    test = load_test(str(tmp_path / "imgs"), batch=8)
    assert test.num_classes == 10 and np.array_equal(_labels(test), np.sort(y[keep]))


def test_an_npz_is_read_for_x_test_and_y_test_only(tmp_path):
    """A file of the test split alone is scored; so is one whose x_train could not be read
    (here it declares more bytes than it holds: read_npz refuses the whole file)."""
    x, y = mnist(12, split="test")
    np.savez(tmp_path / "test_only.npz", x_test=x, y_test=y)
    test = load_test(str(tmp_path / "test_only.npz"), batch=5)
    assert test.num_classes == int(y.max()) + 1 and np.array_equal(_labels(test), y)
    np.savez(
        tmp_path / "both.npz",
        x_train=np.zeros((1000, 28, 28), np.uint8),
        y_train=np.zeros(1000, np.int64),
        x_test=x,
        y_test=y,
    )
    data = (tmp_path / "both.npz").read_bytes()
    at = data.index(b"(1000, 28, 28)")  # the header of x_train: same length, 9x the rows
    (tmp_path / "both.npz").write_bytes(data[:at] + b"(9000, 28, 28)" + data[at + 14 :])
    with pytest.raises(DataError, match="x_train declares shape"):
        load_data(str(tmp_path / "both.npz"), global_batch=2)
    assert len(_labels(load_test(str(tmp_path / "both.npz"), batch=5))) == 12


_CALLS = {"train": 0, "test": 0}


def _counting(split, n):
    import tensorflow as tf

    x, y = mnist(n)

    def gen():
        _CALLS[split] += 1
        yield from zip(x, y)

    return tf.data.Dataset.from_generator(
        gen, output_signature=(tf.TensorSpec((28, 28), tf.uint8), tf.TensorSpec((), tf.int64))
    )


@pytest.fixture
def user_module(monkeypatch):
    """A module `heldout_fixture` whose functions are --data heldout_fixture:NAME sources."""
    module = types.ModuleType("heldout_fixture")
    monkeypatch.setitem(sys.modules, "heldout_fixture", module)
    _CALLS.update(train=0, test=0)
    return module


def test_a_function_source_is_read_for_its_test_split_only(user_module):
    """The train dataset (here counted; at scale huge or lazy) is never iterated, nor checked:
    evaluate used to read every training label first."""
    user_module.load = lambda: {
        "train": _counting("train", 50),
        "val": "not even data",
        "test": _counting("test", 12),
    }
    test = load_test("heldout_fixture:load", batch=5)
    assert test.input_shape == (28, 28) and test.num_classes is None  # checked while scored
    assert _CALLS == {"train": 0, "test": 0}
    assert len(_labels(test)) == 12 and _CALLS == {"train": 0, "test": 1}


def test_a_function_returning_a_test_split_alone_is_scored(user_module):
    """{"test": (x, y)} was refused for evaluate ("a dict with 'train'"); training still
    needs train."""
    x, y = mnist(7)
    user_module.load = lambda: {"test": (x, y)}
    test = load_test("heldout_fixture:load", batch=3)
    assert np.array_equal(_labels(test), y)
    user_module.load = lambda: {"test": _counting("test", 5)}
    assert len(_labels(load_test("heldout_fixture:load", batch=3))) == 5
    with pytest.raises(DataError) as e:
        load_data("heldout_fixture:load", global_batch=2)
    assert "returned a dict with keys ['test']" in _one_line(e)
    assert "a dict with 'train'," in str(e.value)


def test_an_endless_test_dataset_of_unknown_length_stops_with_one_line(user_module, monkeypatch):
    """A from_generator dataset that never ends was read for ever by evaluate, its results
    growing; past MAX_UNKNOWN_TEST examples (here 20) it is one DataError line."""
    import itertools

    import tensorflow as tf

    from mirrorfit.job.evaluate import _batches
    from mirrorfit.data import user

    assert user.MAX_UNKNOWN_TEST >= 1_000_000  # real test sets fit
    monkeypatch.setattr(user, "MAX_UNKNOWN_TEST", 20)
    x, y = mnist(1)

    def endless():
        return tf.data.Dataset.from_generator(
            lambda: itertools.repeat((x[0], y[0])),
            output_signature=(tf.TensorSpec((28, 28), tf.uint8), tf.TensorSpec((), tf.int64)),
        )

    user_module.load = lambda: {"test": endless()}
    test = load_test("heldout_fixture:load", batch=8)
    seen = []
    with pytest.raises(DataError) as e:
        for _, labels in _batches(test, "heldout_fixture:load"):
            seen.append(len(labels))
    assert sum(seen) <= 20
    message = _one_line(e)
    assert "reading its test split failed" in message
    assert "had not ended after 20 examples" in message, message
    # One that ends within the bound is read whole.
    user_module.load = lambda: {"test": _counting("test", 20)}
    assert len(_labels(load_test("heldout_fixture:load", batch=8))) == 20


def _la_png(image):
    """A grayscale + alpha PNG (colour type 4: two channels)."""
    h, w = image.shape
    pixels = np.stack([image, np.full_like(image, 255)], -1)
    raw = b"".join(b"\0" + pixels[r].tobytes() for r in range(h))

    def chunk(kind, data):
        return (
            struct.pack(">I", len(data))
            + kind
            + data
            + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
        )

    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 4, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(raw, 1))
        + chunk(b"IEND", b"")
    )


def test_odd_class_folder_names_and_two_channel_images_are_scored(tmp_path):
    names = ["-1", "a b", "chat é", "%s", "line\nbreak"]
    for i, name in enumerate(names):
        (tmp_path / "test" / name).mkdir(parents=True)
        image = np.full((28, 28), 40 * i, np.uint8)
        (tmp_path / "test" / name / "x.png").write_bytes(_la_png(image))
    test = load_test(str(tmp_path), batch=2)
    assert test.class_names == tuple(sorted(names)) and test.input_shape == (28, 28, 1)
    pixels = np.concatenate([x.numpy() for x, _ in test.test])
    assert pixels.shape == (5, 28, 28, 1)
    assert sorted(np.round(pixels[:, 0, 0, 0] * 255)) == [0, 40, 80, 120, 160]


def _two_classes(root):
    for c in ("a", "b"):
        (root / c).mkdir(parents=True)
        (root / c / "1.png").write_bytes(png(np.zeros((28, 28), np.uint8)))


@pytest.mark.parametrize(
    "case, needles",
    [
        ("no test folder", ["has no test split to evaluate on: the folder has no test/ subfolder"]),
        ("test is a file", ["/test is a file, not a folder"]),
        ("empty test beside train", ["/test holds no class subfolders of images"]),
        ("dangling link", ["cannot read", "ghost.png", "fix or remove it"]),
        ("loose images in test", ["no class subfolders in", "one subfolder per class"]),
        ("function without test", ["the function returns no test split"]),
        ("function negative label", ["test label -3 (example 2) is negative"]),
        ("function bad test", ["its test split is str"]),
        ("function infinite test", ["its test split is infinite"]),
        (
            "empty class folder in test alone",
            ["/test/b holds no PNG or JPEG image; add images", "renumbers the classes after it"],
        ),
        ("npz without test", ["the file has no x_test/y_test"]),
        ("npz without y_test", ["has x_test or y_test but not both"]),
        ("npz one-hot y_test", ["y_test has shape (3, 2)", "not one-hot"]),
    ],
)
def test_bad_test_splits_are_one_named_data_error(tmp_path, user_module, case, needles):
    root = tmp_path / "data"
    if case == "no test folder":
        _two_classes(root)
    elif case == "test is a file":
        _two_classes(root / "train")
        (root / "test").write_text("not a folder")
    elif case == "empty test beside train":
        _two_classes(root / "train")
        (root / "test").mkdir()
    elif case == "dangling link":
        _two_classes(root / "train")
        _two_classes(root / "test")
        os.symlink(tmp_path / "nowhere.png", root / "test" / "b" / "ghost.png")
    elif case == "empty class folder in test alone":
        _two_classes(root / "test")
        (root / "test" / "b" / "1.png").unlink()
    elif case == "loose images in test":
        (root / "test").mkdir(parents=True)
        (root / "test" / "1.png").write_bytes(png(np.zeros((28, 28), np.uint8)))
    elif case.startswith("npz"):
        root = tmp_path / "d.npz"
        one_hot = np.eye(3, 2, dtype=int)
        tests = {
            "npz without test": {},
            "npz without y_test": {"x_test": np.zeros((3, 4))},
            "npz one-hot y_test": {"x_test": np.zeros((3, 4)), "y_test": one_hot},
        }
        np.savez(root, x_train=np.zeros((3, 4), np.uint8), y_train=np.arange(3), **tests[case])
    else:
        x, y = mnist(5)
        y[2] = -3
        user_module.load = {
            "function without test": lambda: (x, y),
            "function negative label": lambda: ((x, y), None, (x, y)),
            "function bad test": lambda: {"train": "ignored", "test": "no data"},
            "function infinite test": lambda: {"test": _counting("test", 3).repeat()},
        }[case]
        root = "heldout_fixture:load"
    with pytest.raises(DataError) as e:
        load_test(str(root), batch=4)
    message = _one_line(e)
    for needle in needles:
        assert needle in message, message
    # Removing a class folder shifts every later label: never advised.
    assert "remove the folder" not in message
    if case == "dangling link":
        with pytest.raises(DataError) as e:  # training lists the same files
            load_data(str(root), global_batch=1)
        assert "ghost.png" in _one_line(e)
