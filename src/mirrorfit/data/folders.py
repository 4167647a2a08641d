"""``--data FOLDER``: an image folder opened for training (:func:`open_train`) and for
``mirrorfit evaluate`` (:func:`open_test`), and what both share: :func:`split_folders`,
:func:`list_folder`, :func:`image_decoder`, :func:`decode_errors` (TFRecords too, with
:func:`train_decoder`, :func:`on_decode_error`, :func:`describe_decoded`). In a split layout
training needs ``train/`` (it never takes ``test/`` for a class); evaluate needs ``test/``.
"""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path

import numpy as np
import tensorflow as tf

from mirrorfit.data import decode as decoding
from mirrorfit.data.files import (
    FileSplit,
    ImageFolder,
    _is_dir,
    files_fingerprint,
    list_image_folder,
)
from mirrorfit.data.images import (
    eval_files,
    fill_store,
    indexed_batches,
    store_key,
    undecodable_files,
)
from mirrorfit.data.opened import Data, TestSplit
from mirrorfit.errors import DataError

SPLIT_NAMES = ("train", "val", "validation", "test")  # files.py's split subfolders


def split_folders(root: Path, flag: str) -> set[str]:
    """The split subfolders of ``root`` when every (non-hidden) subfolder is one, else the
    empty set (a folder of class folders). A file named like a split (``test``) while every
    folder is one is refused: it is most likely a split that was meant to be a folder."""
    try:
        with os.scandir(root) as it:
            entries = [e for e in it if not e.name.startswith(".")]
        folders = {e.name for e in entries if _is_dir(e)}  # a link loop is no folder
    except OSError as e:
        raise DataError(
            f"--data {flag}: cannot read {root} ({e.strerror}); check the path and its permissions"
        ) from None
    if not folders or not folders <= set(SPLIT_NAMES):
        return set()
    for e in entries:
        if e.name in SPLIT_NAMES and e.name not in folders:
            raise DataError(
                f"--data {flag}: {root / e.name} is a file, not a folder; a split "
                "is a folder holding one subfolder of images per class"
            )
    return folders


def list_folder(root: Path, flag: str) -> ImageFolder:
    """:func:`~mirrorfit.data.files.list_image_folder` (which says loose images, a dangling
    link or a folder it cannot read in one line), after :func:`split_folders`'s check."""
    split_folders(root, flag)
    return list_image_folder(root, flag)


def check_not_empty(folder: ImageFolder, split: str, flag: str) -> None:
    """A val/ or test/ without class folders would be scored as no examples at all."""
    if split in folder.splits and not len(folder.splits[split]):
        name = "validation" if split == "val" and (folder.root / "validation").is_dir() else split
        raise DataError(
            f"--data {flag}: {folder.root / name} holds no class subfolders of "
            "images; add them (named as in train/) or remove it"
        )


def image_decoder(
    first: str | Path | bytes, name: str, image_size: tuple[int, int] | None, flag: str
) -> decoding.ImageDecoder:
    """The decoder every image of a source goes through: the first image's size (or
    ``image_size``) and channels. ``first``: its bytes, or the file to read them from."""
    if not isinstance(first, bytes):
        try:
            first = Path(first).read_bytes()
        except OSError as e:
            raise DataError(
                f"--data {flag}: cannot read {name} ({e.strerror}); fix or remove it"
            ) from None
    h, w, c = decoding.probe(first, name)
    if image_size is not None:
        h, w = image_size
    # Grayscale + alpha (2 channels) is decoded as grayscale, as RGBA is as RGB: decode_image
    # takes 1, 3 or 4 channels, and the alpha channel is no class evidence.
    c = 1 if c == 2 else c
    return decoding.ImageDecoder(height=h, width=w, channels=c, resize=image_size is not None)


def decode_errors(on_error):
    """Only errors that can come from reading or decoding files are looked into."""

    def explain(error: tf.errors.OpError) -> DataError | None:
        text = str(getattr(error, "message", error)).lower()
        if decoding.SIZE_MARK in text or any(
            w in text for w in ("image", "png", "jpeg", "decode", "corrupted record", "data_loss")
        ):
            found = on_error(error)
            return found if isinstance(found, DataError) else None
        return None

    return explain


def train_decoder(o, first: str | Path | bytes, name: str) -> decoding.ImageDecoder:
    """:func:`image_decoder` of the first training example, checked against --input-shape;
    ``o``: :class:`mirrorfit.data.arrays.Options`."""
    decoder = image_decoder(first, name, o.image_size, o.spec)
    o.check_shape(decoder.shape)
    if o.on_shape is not None:
        o.on_shape(decoder.shape)
    return decoder


def on_decode_error(flag: str, undecodable):
    """The ``on_error`` of :func:`~mirrorfit.data.images.fill_store` and :func:`decode_errors`:
    decode.explain's line, else ``undecodable(error)``'s (a pass naming what does not decode)."""

    def on_error(error):
        return decoding.explain(error, flag) or undecodable(error)

    return on_error


def describe_decoded(
    source: str,
    counts: dict[str, int],
    unit: str,
    classes: int,
    decoder: decoding.ImageDecoder,
    cache: str | None,
    uncached: str = "",
) -> str:
    """A description of decoded images: ``source (N train, M val <unit>, C classes, decoded
    to HxWxC, cached in DIR)``; ``uncached`` ends it without --cache."""
    listed = ", ".join(f"{n:,} {split}" for split, n in counts.items())
    shape = "x".join(map(str, decoder.shape))
    how = f", cached in {cache}" if cache else uncached
    return f"{source} ({listed} {unit}, {classes} classes, decoded to {shape}{how})"


def open_train(o) -> Data:
    """An image folder for training; ``o``: :class:`mirrorfit.data.arrays.Options`."""
    folder = _list_for_training(Path(o.spec), o.spec)
    train, val, test = _training_splits(folder, o)
    decoder = train_decoder(o, train.paths[0], str(train.paths[0]))
    classes = _classes(folder, o)
    fingerprint = _fingerprint(folder, decoder, o)
    parts = {k: p for k, p in (("train", train), ("val", val), ("test", test)) if p is not None}
    all_paths = np.concatenate([p.paths for p in parts.values()])
    on_error = on_decode_error(o.spec, partial(undecodable_files, all_paths, decoder, o.spec))
    store_of = partial(_store, o, decoder, fingerprint, on_error)  # (split, name) -> store
    batches = indexed_batches(
        o, train.paths, train.labels, decoder, fingerprint, store_of(train, "train")
    )
    evals = _evals(o, {"val": val, "test": test}, decoder, store_of)
    return Data(
        train=batches,
        val=evals.get("val"),
        test=evals.get("test"),
        input_shape=decoder.shape,
        num_classes=classes,
        kind="folder",
        source=str(folder.root),
        class_names=folder.class_names,
        fingerprint=fingerprint,
        _explain=decode_errors(on_error),
        description=describe_decoded(
            f"image folder {folder.root}",
            {k: len(p) for k, p in parts.items()},
            "images",
            len(folder.class_names),
            decoder,
            o.cache,
        ),
    )


def _list_for_training(root: Path, flag: str) -> ImageFolder:
    """The folder listed for training; DataError for splits without train/, or for an empty
    val/ or test/ (before any image is read)."""
    layout = split_folders(root, flag)
    if layout and "train" not in layout:
        have = ", ".join(f"{n}/" for n in sorted(layout))
        raise DataError(
            f"--data {flag} has {have} but no train/ subfolder; training reads "
            "train/ (one subfolder of images per class) beside them: add it, or "
            "give a folder of class folders"
            + ("; `mirrorfit evaluate` scores test/ alone" if "test" in layout else "")
        )
    folder = list_folder(root, flag)
    for split in ("val", "test"):
        check_not_empty(folder, split, flag)
    return folder


def _training_splits(
    folder: ImageFolder, o
) -> tuple[FileSplit, FileSplit | None, FileSplit | None]:
    """(train, val, test) files after --validation-split and --train-examples (None: absent)."""
    train, val, test = (folder.splits.get(k) for k in ("train", "val", "test"))
    split = o.holdout(len(train), val is not None)
    if split is not None:
        val, train = train.subset(split[1]), train.subset(split[0])
    if o.first(len(train)) < len(train):  # the files are sorted by class: draw, not the first
        chosen = np.random.default_rng([o.seed, 2 << 32]).permutation(len(train))
        train = train.subset(np.sort(chosen[: o.train_examples]))
    return train, val, test


def _classes(folder: ImageFolder, o) -> int:
    """The class folders' count, or --num-classes (DataError if it is fewer)."""
    # Every class folder is a class, also one that --train-examples left without examples.
    classes = len(folder.class_names)
    if o.num_classes is not None:
        if o.num_classes < classes:
            raise DataError(
                f"--data {o.spec} has {classes} class folders, more than "
                f"--num-classes {o.num_classes}; raise --num-classes or drop it"
            )
        classes = o.num_classes
    return classes


def _fingerprint(folder: ImageFolder, decoder: decoding.ImageDecoder, o) -> str:
    """The training examples' fingerprint: the files, the decoded shape, and the split and
    seed that chose them."""
    text = (
        f"{folder.fingerprint}|{decoder.shape}|{decoder.resize}|{o.validation_split}|"
        f"{o.seed if o.validation_split or o.train_examples else ''}"
    )
    return files_fingerprint([], extra=text)


def _store(
    o, decoder: decoding.ImageDecoder, fingerprint: str, on_error, part: FileSplit | None, what: str
) -> np.ndarray | None:
    """``part``'s images decoded once into --cache (uint8 [images, height, width, channels]);
    None without --cache or without ``part``."""
    if o.cache is None or part is None:
        return None
    items = tf.data.Dataset.from_tensor_slices(part.paths.astype(str))
    items = items.map(lambda p: (tf.io.read_file(p), p))
    key = store_key(fingerprint, decoder, f"folder|{what}|{len(part)}")
    return fill_store(items, len(part), decoder, o.cache, key, on_error=on_error)


def _evals(
    o, parts: dict[str, FileSplit | None], decoder: decoding.ImageDecoder, store_of
) -> dict[str, tf.data.Dataset]:
    """The present ``parts`` as evaluation datasets of ``o.eval_batch`` images."""
    # Each split's cache is filled just before its dataset is made, in the order of ``parts``.
    return {
        name: eval_files(
            part.paths,
            part.labels,
            decoder,
            batch=o.eval_batch,
            store=store_of(part, name),
            parallel=o.parallel,
            raw=o.raw,
        )
        for name, part in parts.items()
        if part is not None
    }


def open_test(
    spec: str,
    *,
    batch: int,
    image_size: tuple[int, int] | None = None,
    parallel: bool = True,
    raw: bool = False,
    **_,
) -> TestSplit | None:
    """The folder's test/ subfolder, for ``mirrorfit evaluate`` (None: it has none); ``raw``:
    uint8 pixels as decoded (a compiled model's), not scaled to [0, 1]."""
    root = Path(spec)
    layout = split_folders(root, spec)
    if "test" not in layout:
        return None
    if "train" in layout:  # labels index train/'s class folders, as in training
        folder = list_folder(root, spec)
        check_not_empty(folder, "test", spec)
        test, first = folder.splits["test"], folder.splits["train"].paths[0]
    else:  # test/ alone: listed as a folder of class folders
        folder = list_folder(root / "test", spec)
        test = folder.splits["train"]
        first = test.paths[0]
    alone = "train" not in layout
    # The first training image sets the channels (and size), as it did in training.
    decoder = image_decoder(first, str(first), image_size, spec)

    on_error = on_decode_error(spec, partial(undecodable_files, test.paths, decoder, spec))
    classes = len(folder.class_names)
    return TestSplit(
        test=eval_files(test.paths, test.labels, decoder, batch=batch, parallel=parallel, raw=raw),
        input_shape=decoder.shape,
        num_classes=classes,
        kind="folder",
        source=str(root),
        class_names=folder.class_names,
        _explain=decode_errors(on_error),
        description=f"image folder {root} ({len(test):,} test images, {classes} "
        "classes"
        + (" from test/ alone" if alone else "")
        + f", decoded to {'x'.join(map(str, decoder.shape))})",
        alone=alone,
    )


__all__ = [
    "SPLIT_NAMES",
    "check_not_empty",
    "decode_errors",
    "describe_decoded",
    "image_decoder",
    "list_folder",
    "on_decode_error",
    "open_train",
    "open_test",
    "split_folders",
    "train_decoder",
]
