"""Find and load MNIST in the ``keras.datasets.mnist`` npz layout.

Search order: ``data_dir`` argument (``--data-dir``), ``$MIRRORFIT_DATA``, the Keras cache
(``$KERAS_HOME/datasets/mnist.npz``, by default ``~/.keras/datasets/mnist.npz``), then a
download into that cache. Validation is the first 5,000 training images, as in the chapter.
"""

from __future__ import annotations

import hashlib
import http.client
import lzma
import os
import stat
import urllib.request
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from mirrorfit.errors import DataError

if TYPE_CHECKING:
    from mirrorfit.data.arrays import Options
    from mirrorfit.data.opened import Data, TestSplit

FILENAME = "mnist.npz"
VALIDATION_SIZE = 5000
NUM_CLASSES = 10
# Where and what keras.datasets.mnist downloads (its published SHA-256).
URL = "https://storage.googleapis.com/tensorflow/tf-keras-datasets/mnist.npz"
SHA256 = "731c5ac602752760c8e48fbffcf8c3b850d9dc2a2aedcf2cc48468fc17b673d1"
# Seconds per connect / read: Keras's own get_file has no timeout and can hang on a network
# that drops packets.
DOWNLOAD_TIMEOUT_S = 20
_KEYS = {
    "x_train": (60000, 28, 28),
    "y_train": (60000,),
    "x_test": (10000, 28, 28),
    "y_test": (10000,),
}
# What reading a damaged or foreign npz raises: zip structure, a member's compression
# (zlib.error, lzma), NumPy's header or pickle refusal (ValueError), a truncated file, an
# encrypted member (zipfile's RuntimeError: "password required for extraction").
_READ_ERRORS = (
    KeyError,
    ValueError,
    OSError,
    EOFError,
    zipfile.BadZipFile,
    zlib.error,
    lzma.LZMAError,
    NotImplementedError,
    RuntimeError,
)
# The most the four arrays may take in memory (MNIST: 55 MB): a member's header can declare any
# shape, and NumPy allocates it before reading a byte.
MAX_BYTES = 4 << 30


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


def keras_cache() -> Path:
    """Where Keras keeps downloaded data sets: ``$KERAS_HOME/datasets`` or ``~/.keras/datasets``."""
    return Path(os.environ.get("KERAS_HOME") or Path.home() / ".keras") / "datasets"


def locate_mnist(
    data_dir: str | bytes | os.PathLike | None = None, *, download: bool = True
) -> Path:
    """Path of mnist.npz. A given ``data_dir`` may be the file itself or its folder; it is
    the only place looked at. Without it: $MIRRORFIT_DATA, the Keras cache, a download."""
    data_dir = os.fsdecode(data_dir) if data_dir is not None else None  # a Path, bytes: text
    if data_dir:  # an explicit path that is wrong is an error, not a hint
        file, why = _find(Path(data_dir))
        hint = " (~ is not expanded here: write the full path)" if data_dir.startswith("~") else ""
        if why == "no such file":
            raise DataError(
                f"no {FILENAME} at --data-dir {data_dir}{hint}; point it at the "
                f"folder holding {FILENAME} or at the file itself"
            )
        if why == "permission denied":  # the path is right: its permissions are not
            raise DataError(
                f"--data-dir {data_dir}: cannot read {file} ({why}); make it "
                "readable by this user, or point --data-dir at a copy that is"
            )
        if why:
            raise DataError(
                f"--data-dir {data_dir}: cannot read {file} ({why}); point it at "
                f"the folder holding {FILENAME} or at the file itself"
            )
        return file
    tried = []
    env = os.environ.get("MIRRORFIT_DATA")
    for origin, folder in (
        ("$MIRRORFIT_DATA", Path(env) if env else None),
        ("Keras cache", keras_cache()),
    ):
        if folder is None:
            tried.append(f"{origin} ({'unset' if env is None else 'empty'})")
            continue
        file, why = _find(folder, folder_only=origin == "Keras cache")
        if not why:
            return file
        tried.append(f"{origin} ({file}: {why})")
    if download:
        try:
            return _download(keras_cache() / FILENAME)
        except (OSError, ValueError, http.client.HTTPException) as e:  # offline is common
            tried.append(f"download from {URL} ({_reason(e)})")
    else:
        tried.append("download (not attempted)")
    raise DataError(
        f"MNIST not found; tried {', '.join(tried)}. Pass --data-dir DIR or set "
        f"MIRRORFIT_DATA to a folder with {FILENAME} (keras.datasets.mnist's file)"
    )


def _find(path: Path, *, folder_only: bool = False) -> tuple[Path, str]:
    """(the file ``path`` names, "" if it can be read, else why not). A folder means the
    mnist.npz in it; anything else is the file itself, whatever its name (``folder_only``: it
    must be a folder). A look that fails (a loop of links, a folder this user cannot enter, a
    name too long, a file this user may not read) says why."""
    file = path
    try:
        mode = os.stat(path).st_mode
        if stat.S_ISDIR(mode):
            file = path / FILENAME
            mode = os.stat(file).st_mode
        elif folder_only:
            return path, "not a folder"
    except FileNotFoundError:
        if file == path and path.suffix != ".npz":
            file = path / FILENAME
        if os.path.islink(path) or os.path.islink(file):
            return file, "a link to nothing"
        return file, "no such file"
    except (OSError, ValueError) as e:  # ValueError: a NUL byte in the path
        return file, _why(e)
    if stat.S_ISDIR(mode):
        return file, "a folder, not a file"
    if not stat.S_ISREG(mode):  # a FIFO would block the read forever
        return file, "not a regular file"
    try:
        os.close(os.open(file, os.O_RDONLY))
    except OSError as e:
        return file, _why(e)
    return file, ""


def _why(e: Exception) -> str:
    return (getattr(e, "strerror", None) or str(e)).lower()


def _download(dest: Path) -> Path:
    """Fetch MNIST into the Keras cache (where Keras itself would put it), checking its hash;
    written aside and renamed, so an interrupted download leaves nothing half-written."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(f".{dest.name}.{os.getpid()}.part")
    digest = hashlib.sha256()
    try:
        with (
            urllib.request.urlopen(URL, timeout=DOWNLOAD_TIMEOUT_S) as response,
            open(part, "wb") as out,
        ):
            for chunk in iter(lambda: response.read(1 << 20), b""):
                digest.update(chunk)
                out.write(chunk)
        if digest.hexdigest() != SHA256:
            raise ValueError(f"SHA-256 {digest.hexdigest()[:12]}... is not MNIST's")
        os.replace(part, dest)
    finally:
        part.unlink(missing_ok=True)
    return dest


def _reason(error: Exception) -> str:
    reason = getattr(error, "reason", None) or getattr(error, "strerror", None) or error
    return f"{type(error).__name__}: {reason}"


def load_mnist(
    data_dir: str | os.PathLike | None = None,
    *,
    train_examples: int | None = None,
    download: bool = True,
) -> Splits:
    """Load and split MNIST: validation = first 5,000 training images, train = the rest
    (the first ``train_examples`` of them, if given). Raises DataError if malformed."""
    path = locate_mnist(data_dir, download=download)
    try:
        _check_headers(path)
        with np.load(path) as f:
            arrays = {k: f[k] for k in _KEYS}
    except MemoryError:
        raise DataError(f"{path}: not enough memory to load its arrays") from None
    except _READ_ERRORS as e:
        raise DataError(
            f"{path} is not a valid MNIST npz file ({type(e).__name__}: {e}); "
            "expected keras.datasets.mnist's layout (x_train, y_train, x_test, "
            "y_test): replace it with that file, or point --data-dir at "
            "another"
        ) from None
    _check(path, arrays)
    x, y = arrays["x_train"], arrays["y_train"].astype(np.int32)
    x_train, y_train = x[VALIDATION_SIZE:], y[VALIDATION_SIZE:]
    if train_examples is not None:
        if train_examples > len(x_train):
            raise DataError(
                f"--train-examples {train_examples} is more than the "
                f"{len(x_train)} training images available"
            )
        x_train, y_train = x_train[:train_examples], y_train[:train_examples]
    return Splits(
        x_train=x_train,
        y_train=y_train,
        x_val=x[:VALIDATION_SIZE],
        y_val=y[:VALIDATION_SIZE],
        x_test=arrays["x_test"],
        y_test=arrays["y_test"].astype(np.int32),
        source=str(path),
    )


def _check_headers(path: Path) -> None:
    """Read each array's header (a few bytes) and refuse, before NumPy allocates anything, a
    shape that is not MNIST's layout, that the member does not hold the bytes for (a 1 KB file
    declaring 730 GiB), or that is larger than MAX_BYTES in all."""
    total = 0
    with zipfile.ZipFile(path) as z:
        for key, shape in _KEYS.items():
            info = z.getinfo(f"{key}.npy")  # KeyError: named in load_mnist's message
            with z.open(info) as f:
                version = np.lib.format.read_magic(f)
                if version == (1, 0):
                    got, _, dtype = np.lib.format.read_array_header_1_0(f)
                else:
                    got, _, dtype = np.lib.format.read_array_header_2_0(f)
                offset = f.tell()
            if len(got) != len(shape) or got[1:] != shape[1:]:
                raise DataError(
                    f"{path}: {key} has shape {got}, expected "
                    f"{('N',) + shape[1:]}; is this keras.datasets.mnist's npz?"
                )
            if dtype.hasobject:  # NumPy would refuse to unpickle it, after allocating
                raise DataError(
                    f"{path}: {key} holds Python objects (dtype {dtype}), not "
                    "numbers; is this keras.datasets.mnist's npz?"
                )
            size = int(np.prod(got, dtype=object)) * dtype.itemsize  # Python ints: no overflow
            if offset + size > info.file_size:
                raise DataError(
                    f"{path}: {key} declares shape {got} ({size:,} bytes) but holds "
                    f"only {info.file_size - offset:,}; the file is damaged or not "
                    "MNIST"
                )
            total += size
    if total > MAX_BYTES:
        raise DataError(
            f"{path}: its arrays would take {total / 2**30:.1f} GiB in memory, more "
            f"than the {MAX_BYTES / 2**30:g} GiB an MNIST-layout file may (MNIST "
            "itself: 55 MB)"
        )


def _check(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Refuse what would train and then fail (or be silently wrong): every check is cheap
    next to a run."""
    for key, shape in _KEYS.items():
        a = arrays[key]
        if a.ndim != len(shape) or a.shape[1:] != shape[1:] or len(a) < 1:
            raise DataError(
                f"{path}: {key} has shape {a.shape}, expected "
                f"{('N',) + shape[1:]}; is this keras.datasets.mnist's npz?"
            )
    for split in ("train", "test"):
        x, y = arrays[f"x_{split}"], arrays[f"y_{split}"]
        if len(x) != len(y):
            raise DataError(
                f"{path}: x_{split} has {len(x)} images but y_{split} has "
                f"{len(y)} labels; each image needs exactly one label"
            )
        if x.dtype != np.uint8:  # the pipeline scales by 1/255
            raise DataError(
                f"{path}: x_{split} has dtype {x.dtype}; expected uint8 pixels "
                "0-255 as in keras.datasets.mnist"
            )
        if y.dtype.kind not in "iu":  # not issubdtype: NumPy counts timedelta64 in
            raise DataError(
                f"{path}: y_{split} has dtype {y.dtype}; expected integer labels "
                f"0-{NUM_CLASSES - 1}"
            )
        bad = (y < 0) | (y >= NUM_CLASSES)
        if bad.any():
            i = int(np.argmax(bad))
            raise DataError(
                f"{path}: y_{split}[{i}] is {y[i]}, not a class 0-"
                f"{NUM_CLASSES - 1} ({int(bad.sum())} such label(s))"
            )


def open_train(o: Options) -> Data:
    """MNIST for training (``o.data_dir``, $MIRRORFIT_DATA, the Keras cache, a download);
    validation is the first 5,000 training images."""
    from mirrorfit.data.opened import Data
    from mirrorfit.data.pipeline import ShuffledBatches

    splits = load_mnist(o.data_dir, train_examples=o.train_examples)
    o.check_shape(splits.x_train.shape[1:])
    classes = o.classes({"train": splits.y_train, "val": splits.y_val, "test": splits.y_test})
    train = ShuffledBatches(
        x=splits.x_train, y=splits.y_train, global_batch=o.global_batch, seed=o.seed
    )
    return Data(
        train=train,
        val=(splits.x_val, splits.y_val),
        test=(splits.x_test, splits.y_test),
        input_shape=splits.x_train.shape[1:],
        num_classes=classes,
        kind="mnist",
        source=splits.source,
        description=splits.source,
        fingerprint=train.order.fingerprint,
    )


def open_test(spec: str, *, batch: int, data_dir: str | None = None, **_) -> TestSplit:
    """MNIST's test split, for ``mirrorfit evaluate``."""
    from mirrorfit.data.arrays import test_arrays

    splits = load_mnist(data_dir)
    return test_arrays(
        spec, "mnist", splits.x_test, splits.y_test, batch, splits.source, splits.source
    )
