"""Image folders opened for training (mirrorfit.data.folders): a folder of splits without
train/ says so (it used to be "only one class folder (test)", or test/ and val/ trained as two
classes), and a layout that cannot be trained or scored is one DataError line, never a
traceback. Tiny folders, this process."""

import numpy as np
import pytest

from data_fixtures import mnist, png, write_png_folder
from mirrorfit.data.sources import load_data
from mirrorfit.errors import ConfigError, DataError


def _image():
    return png(np.zeros((28, 28), np.uint8))


@pytest.mark.parametrize(
    "case, needles",
    [
        (
            "test alone",
            ["has test/ but no train/ subfolder", "`mirrorfit evaluate` scores test/ alone"],
        ),
        ("val and test", ["has test/, val/ but no train/ subfolder"]),
        ("val alone", ["has val/ but no train/ subfolder; training reads train/"]),
        (
            "loose images",
            ["no class subfolders in", "(its images must be in one subfolder per class)"],
        ),
        ("loose images in train", ["no class subfolders in", "/train (its images must be"]),
        (
            "empty test",
            [
                "/test holds no class subfolders of images; add them (named as in "
                "train/) or remove it"
            ],
        ),
        ("empty validation", ["/validation holds no class subfolders of images"]),
        ("test is a file", ["/test is a file, not a folder"]),
    ],
)
def test_folder_layouts_that_cannot_train_are_one_line(tmp_path, case, needles):
    x, y = mnist(20)
    if case in ("test alone", "val and test", "val alone"):
        for split in {
            "test alone": ["test"],
            "val and test": ["val", "test"],
            "val alone": ["val"],
        }[case]:
            write_png_folder(tmp_path / split, x, y)
    elif case.startswith("loose images"):
        top = tmp_path / "train" if case.endswith("train") else tmp_path
        top.mkdir(exist_ok=True)
        (top / "1.png").write_bytes(_image())  # was an AttributeError traceback
    else:
        write_png_folder(tmp_path / "train", x, y)
        if case == "test is a file":
            (tmp_path / "test").write_text("")
        else:
            (tmp_path / case.split()[1]).mkdir()
    with pytest.raises(DataError) as e:
        load_data(str(tmp_path), global_batch=2)
    message = str(e.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, message


@pytest.mark.parametrize(
    "case, needles",
    [
        (
            "loose images",
            [
                "--data {root}: no class subfolders in {root} (its images must be in one "
                "subfolder per class)"
            ],
        ),
        ("dangling link", ["--data {root}: cannot read {root}/1/ghost.png (", "fix or remove it"]),
    ],
)
def test_listing_says_loose_images_and_dangling_links_in_one_line(tmp_path, case, needles):
    """files.py itself (not only its callers): loose images were an AttributeError
    (os.DirEntry has no .suffix), a dangling link a FileNotFoundError."""
    import os

    from mirrorfit.data.files import list_image_folder

    if case == "loose images":
        (tmp_path / "1.png").write_bytes(_image())
    else:
        write_png_folder(tmp_path, mnist(4)[0], np.array([0, 1, 0, 1]))
        os.symlink(tmp_path / "nowhere.png", tmp_path / "1" / "ghost.png")
    with pytest.raises(DataError) as e:
        list_image_folder(tmp_path, str(tmp_path))
    for needle in needles:
        assert needle.replace("{root}", str(tmp_path)) in str(e.value), str(e.value)


def test_a_folder_with_glob_characters_in_its_name_trains(tmp_path):
    """It was taken for a TFRecord pattern and refused: "the pattern matches no file"."""
    x, y = mnist(20)
    write_png_folder(tmp_path / "imgs[1]", x, y)
    data = load_data(str(tmp_path / "imgs[1]"), global_batch=2)
    assert data.num_classes == len(set(y.tolist())) and data.input_shape == (28, 28, 1)


def _two_class_folder(root):
    for c in ("0", "1"):
        (root / c).mkdir(parents=True)
        (root / c / "x.png").write_bytes(_image())


@pytest.mark.parametrize(
    "link, target, reaches",
    [
        ("a/up", "..", "{root}"),  # issue 24: b's images were listed again under a/up/b, label 0
        ("a/again", ".", "{root}/a"),  # a loop: was skipped without a word
        ("a/b", "../b", "{root}/b"),  # another class's folder: its images got a's label
        ("a/top", "../..", "{parent}"),  # above the data: walked the whole parent
    ],
)
def test_a_folder_reached_twice_is_refused_in_one_line(tmp_path, link, target, reaches):
    """A folder walk must never visit a folder twice: a link back up or across would list
    images again under another class (wrong labels, exit 0). Refused, naming the link."""
    import os

    from mirrorfit.data.files import list_image_folder

    root = tmp_path / "photos"
    for c in ("a", "b"):
        (root / c).mkdir(parents=True)
        (root / c / "x.png").write_bytes(_image())
    os.symlink(target, root / link)
    with pytest.raises(DataError) as e:
        list_image_folder(root, "photos")
    message = str(e.value)
    assert "\n" not in message and message.startswith("--data photos: "), message
    where = reaches.format(root=root, parent=tmp_path)
    assert f"{root / link} leads to {where}, a folder this listing already reads" in message
    assert "remove the link" in message


def test_two_class_folders_that_are_one_folder_are_refused(tmp_path):
    """`ln -s a c` beside the class folders made class c a copy of class a, labelled 2."""
    import os

    from mirrorfit.data.files import list_image_folder

    _two_class_folder(tmp_path)
    os.symlink("0", tmp_path / "2")
    with pytest.raises(DataError) as e:
        list_image_folder(tmp_path, "f")
    assert f"{tmp_path / '2'} is the same folder as {tmp_path / '0'}" in str(e.value)


def test_a_linked_folder_outside_the_data_is_read_once(tmp_path):
    """A link to a folder elsewhere is followed (its images are the class's), once."""
    import os

    from mirrorfit.data.files import list_image_folder

    _two_class_folder(tmp_path / "data")
    (tmp_path / "more").mkdir()
    (tmp_path / "more" / "y.png").write_bytes(_image())
    os.symlink(tmp_path / "more", tmp_path / "data" / "0" / "more")
    folder = list_image_folder(tmp_path / "data", "f6")
    assert sorted(folder.splits["train"].paths) == sorted(
        [
            str(tmp_path / "data" / "0" / "more" / "y.png"),
            str(tmp_path / "data" / "0" / "x.png"),
            str(tmp_path / "data" / "1" / "x.png"),
        ]
    )
    assert folder.splits["train"].labels.tolist() == [0, 0, 1]


@pytest.mark.parametrize("case", ["fifo", "link to /dev/zero", "link to itself"])
def test_an_image_name_that_is_no_regular_file_is_refused_in_one_line(tmp_path, case):
    """A FIFO named x.png hung training and evaluate for ever; a link to /dev/zero read
    without end. Like a dangling link, it is refused naming the entry."""
    import os

    from mirrorfit.data.files import list_image_folder

    _two_class_folder(tmp_path)
    bad = tmp_path / "1" / "y.png"
    if case == "fifo":
        os.mkfifo(bad)
    elif case == "link to /dev/zero":
        os.symlink("/dev/zero", bad)
    else:
        os.symlink("y.png", bad)  # ELOOP: neither a folder nor a file
    with pytest.raises(DataError) as e:
        list_image_folder(tmp_path, "flagval")
    message = str(e.value)
    assert "\n" not in message and str(bad) in message, message
    assert message.startswith("--data flagval: ")
    assert ("cannot read" if case == "link to itself" else "not a regular file") in message
    assert "remove it" in message


def test_a_link_to_itself_beside_the_class_folders_is_no_class(tmp_path):
    """`ln -s x x` at the top refused the whole folder as unreadable (ELOOP from is_dir)."""
    import os

    _two_class_folder(tmp_path)
    os.symlink("x", tmp_path / "x")
    data = load_data(str(tmp_path), global_batch=2)
    assert data.num_classes == 2


def test_decoding_into_memory_more_than_it_holds_is_one_line(tmp_path, monkeypatch):
    """--cache memory (and a compiled --model's images, decoded once) is checked against the
    memory available before any image is decoded: one line naming the size and the fix."""
    import psutil

    write_png_folder(tmp_path / "digits", *mnist(40))
    small = psutil.virtual_memory()._replace(available=40 * 28 * 28)  # 40 images' bytes
    monkeypatch.setattr(psutil, "virtual_memory", lambda: small)
    with pytest.raises(DataError, match=r"more than this machine's memory can hold .* --cache F"):
        load_data(str(tmp_path / "digits"), global_batch=10, cache="memory")
    monkeypatch.undo()
    data = load_data(str(tmp_path / "digits"), global_batch=10, cache="memory")
    assert data.train.store.shape == (40, 28, 28, 1)


def test_a_cache_folder_that_cannot_be_made_is_one_line(tmp_path):
    """/proc refuses a folder even to root, whom os.access lets through (on 078ee79: a
    FileNotFoundError traceback)."""
    write_png_folder(tmp_path / "digits", *mnist(20))
    with pytest.raises(Exception) as raised:
        load_data(str(tmp_path / "digits"), global_batch=10, cache="/proc/mirrorfit-cache")
    assert isinstance(raised.value, (DataError, ConfigError)), repr(raised.value)
    assert "--cache /proc/mirrorfit-cache" in str(raised.value)


def test_a_damaged_cache_is_decoded_again_with_a_warning(tmp_path):
    """A cache .npy whose pixels were overwritten (its header intact) was trained on as zeros
    (found at 078ee79); its CRC, written beside it, now sends it back to the decoder."""
    write_png_folder(tmp_path / "digits", *mnist(40))
    cache = tmp_path / "cache"
    first = load_data(str(tmp_path / "digits"), global_batch=10, cache=str(cache))
    decoded = np.array(first.train.store)
    (stored,) = cache.glob("mirrorfit-cache-*.npy")
    pixels = np.load(stored, mmap_mode="r+")
    pixels[:] = 0
    pixels.flush()
    del pixels
    with pytest.warns(UserWarning, match=r"does not match its checksum .*decoding the images"):
        again = load_data(str(tmp_path / "digits"), global_batch=10, cache=str(cache))
    assert decoded.any() and np.array_equal(np.asarray(again.train.store), decoded)


def test_a_folder_where_the_cache_checksum_goes_is_one_line(tmp_path):
    """A folder named like the store's .crc32 file was an IsADirectoryError traceback."""
    write_png_folder(tmp_path / "digits", *mnist(20))
    cache = tmp_path / "cache"
    load_data(str(tmp_path / "digits"), global_batch=10, cache=str(cache))
    (sums,) = cache.glob("*.crc32")
    sums.unlink()
    sums.mkdir()
    with pytest.warns(UserWarning), pytest.raises(DataError, match=r"cannot write .*\.crc32"):
        load_data(str(tmp_path / "digits"), global_batch=10, cache=str(cache))
