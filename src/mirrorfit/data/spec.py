"""What kind of source ``--data SOURCE`` names, and the data flags' values, in plain Python:
the configuration checks them before TensorFlow loads (seconds). The sources themselves are
opened by the module each kind names (:data:`KINDS`).
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass
from pathlib import Path

from mirrorfit.errors import ConfigError


@dataclass(frozen=True)
class Kind:
    """A kind of ``--data`` source and what holds for it: the one table every part of mirrorfit
    asks (the configuration's flag checks, the run's hints, ``evaluate``, ``bench``). Its
    ``module`` opens it: ``open_train(options)`` for training, ``open_test(...)`` for
    ``mirrorfit evaluate`` (absent: no test split). A new kind is a row here and one module."""

    name: str
    module: str  # the module that opens it
    summary: str  # what it is, for help and docs
    files: bool = False  # images read from files as training runs: --image-size applies
    features: bool = False  # TFRecord features: --image-feature / --label-feature apply
    streamed: bool = False  # read in a stream whose order depends on the workers
    in_memory: bool = False  # already in memory: --cache does not apply
    own_validation: str | None = None  # why --validation-split does not apply
    no_test: str | None = None  # why it never has a test split (known without opening it)
    missing_test: str | None = None  # what to do when the opened source has no test split
    tensorflow: bool = False  # read by TensorFlow's ops (decoding, parsing): TF must be installed
    reads: str = "memory"  # how training reads it, for --profile's advice


KINDS: dict[str, Kind] = {
    k.name: k
    for k in (
        Kind(
            "mnist",
            "mirrorfit.data.mnist",
            "keras.datasets.mnist's file (--data-dir, "
            "$MIRRORFIT_DATA, the Keras cache, a download)",
            in_memory=True,
            own_validation="the first 5,000 training images",
        ),
        Kind(
            "synthetic",
            "mirrorfit.data.synthetic",
            "random examples, one batch repeated",
            in_memory=True,
            own_validation="none: random data teaches nothing",
            no_test="random data has no test split",
            reads="synthetic, one batch repeated",
        ),
        Kind(
            "npz",
            "mirrorfit.data.npz",
            "x_train/y_train (+ x_val/y_val, x_test/y_test)",
            in_memory=True,
            missing_test="the file has no x_test/y_test; add them, or pass a file that has them",
        ),
        Kind(
            "module",
            "mirrorfit.data.user",
            "package.module:function returning arrays or datasets",
            reads="a dataset function",
            missing_test="the function returns no test split; return one (x_test, y_test or a "
            "dataset), or pass a FILE.npz with x_test/y_test",
        ),
        Kind(
            "tfrecord",
            "mirrorfit.data.records",
            "tf.train.Example records, streamed",
            files=True,
            features=True,
            streamed=True,
            tensorflow=True,
            reads="TFRecord files",
            no_test="TFRecord sources are training examples only; write the test examples to an "
            "image FOLDER with a test/ subfolder or a FILE.npz with x_test/y_test",
        ),
        Kind(
            "folder",
            "mirrorfit.data.folders",
            "one subfolder of images per class",
            files=True,
            tensorflow=True,
            reads="image files",
            missing_test="the folder has no test/ subfolder; give a folder holding test/ (one "
            "subfolder of images per class), beside train/ or alone, or a FILE.npz "
            "with x_test/y_test",
        ),
    )
}
TFRECORD_SUFFIXES = (".tfrecord", ".tfrecords", ".tfrec")
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*")
# Elements in one example --input-shape may ask for (224x224x3 is 150,528; 8192x8192 is 2**26):
# each of its 2**20 a side passes, but 2**20 x 2**20 x 3 synthetic examples would not fit.
MAX_INPUT_ELEMENTS = 1 << 26
# Classes --num-classes, or the largest label + 1, may ask for: the model's last layer and every
# one-hot/probability row are that wide (ImageNet-21k has 21,841; 10**11 was an out-of-memory
# traceback).
MAX_CLASSES = 1_000_000
_FORMS = (
    "mnist, synthetic, FILE.npz, an image FOLDER (one subfolder per class), "
    "'train-*.tfrecord' or package.module:function"
)


def kind_of(spec: str) -> Kind:
    """The :class:`Kind` of ``--data`` ``spec``; ConfigError naming it if it is none."""
    return KINDS[source_kind(spec)]


def source_kind(spec: str) -> str:
    """The name of ``--data`` ``spec``'s kind (a key of KINDS); ConfigError naming it if it is
    none.

    Looks at the file system only to tell a folder from a missing path, and to check that a
    glob matches something (cheap: no file is opened)."""
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(f"--data must name a source, got {spec!r}; use {_FORMS}")
    if spec in ("mnist", "synthetic"):
        return spec
    if _MODULE.fullmatch(spec) and not os.path.exists(spec):
        return "module"
    lower = spec.lower()
    # A path that exists is that path, even with glob characters in its name (e.g. "imgs[1]")
    if any(c in spec for c in "*?[") and not os.path.exists(spec):
        if not tfrecord_files(spec):
            raise ConfigError(
                f"--data {spec}: the pattern matches no file; check the path "
                "(quote the pattern so that the shell leaves it to mirrorfit)"
            )
        return "tfrecord"
    if lower.endswith(".npz") or lower.endswith(TFRECORD_SUFFIXES):
        if not os.path.isfile(spec):
            raise ConfigError(f"--data {spec}: no such file")
        return "npz" if lower.endswith(".npz") else "tfrecord"
    if os.path.isdir(spec):
        return "folder"
    if os.path.exists(spec):
        raise ConfigError(
            f"--data {spec} is a file but neither .npz nor TFRecord "
            f"({', '.join(TFRECORD_SUFFIXES)}); use {_FORMS}"
        )
    raise ConfigError(f"--data {spec}: no such file or folder; use {_FORMS}")


def tfrecord_files(pattern: str) -> list[str]:
    """Files matching ``pattern`` (a path or a glob, ``**`` for subfolders), sorted: the
    canonical order every epoch's shuffle starts from. Folders are left out. A file that
    exists is itself, glob characters in its name or not."""
    if os.path.isfile(pattern):
        return [pattern]
    return sorted(p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))


def parse_ints(
    flag: str,
    value,
    *,
    count: int | None = None,
    lengths: tuple[int, ...] = (),
    example: str,
    max_elements: int | None = None,
) -> tuple[int, ...]:
    """``"28,28"`` or ``[28, 28]`` (TOML) as a tuple of positive integers; ConfigError naming
    ``flag``, the value and ``example`` otherwise. ``count``: exactly that many numbers;
    ``lengths``: one of those counts, for the shape of one example (``--input-shape``), whose
    product is at most ``max_elements`` (default :data:`MAX_INPUT_ELEMENTS`)."""
    parts = value.split(",") if isinstance(value, str) else value
    try:
        if isinstance(parts, (str, bytes)) or not hasattr(parts, "__iter__"):
            raise ValueError
        numbers = tuple(_positive(p) for p in parts)
    except (TypeError, ValueError):
        numbers = ()
    ok = (
        bool(numbers)
        and (count is None or len(numbers) == count)
        and (not lengths or len(numbers) in lengths)
    )
    if not ok:
        shown = (
            value
            if isinstance(value, str)
            else ",".join(map(str, value))
            if isinstance(value, (list, tuple))
            else repr(value)
        )
        raise ConfigError(
            f"{flag} {shown}: expected "
            + (f"{count} " if count else "")
            + f"positive integers separated by commas; e.g. {flag} {example}"
        )
    limit = max_elements if max_elements is not None else MAX_INPUT_ELEMENTS if lengths else None
    elements = 1
    for n in numbers:
        elements *= n
    if limit is not None and elements > limit:
        raise ConfigError(
            f"{flag} {','.join(map(str, numbers))}: {elements:,} elements per "
            f"example, at most {limit:,}; give a smaller shape, e.g. {flag} "
            f"{example}"
        )
    return numbers


def _positive(part) -> int:
    if isinstance(part, bool):
        raise ValueError
    if isinstance(part, str):
        part = part.strip()
        if not part.isdigit():  # ASCII digits only: int() takes "٣" and " 3 "
            raise ValueError
    elif not isinstance(part, int):
        raise ValueError
    number = int(part)
    if number < 1 or number > 1 << 20:  # 2**20 pixels a side: past that it is a typo
        raise ValueError
    return number


def check_cache(value: str) -> None:
    """``--cache memory`` or a folder that exists and is writable, or can be created (the
    nearest existing folder above it is writable); ConfigError naming the problem."""
    if value == "memory":
        return
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"--cache must be memory or a folder, got {value!r}")
    path = Path(value)
    if path.exists():
        if not path.is_dir():
            raise ConfigError(
                f"--cache {value} is a file, not a folder; give a folder (created "
                "if missing) or memory"
            )
        if not os.access(path, os.W_OK | os.X_OK):
            raise ConfigError(
                f"--cache {value}: the folder is not writable; give another "
                "folder or --cache memory"
            )
        return
    parent = path.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(
            f"--cache {value}: cannot create it ({parent} is not a writable "
            "folder); give another folder or --cache memory"
        )


__all__ = [
    "Kind",
    "KINDS",
    "MAX_INPUT_ELEMENTS",
    "kind_of",
    "source_kind",
    "tfrecord_files",
    "parse_ints",
    "check_cache",
]
