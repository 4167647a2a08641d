"""Decoding encoded images (PNG, JPEG) to uint8 pixels inside tf.data, and naming the file when
one cannot be decoded: :func:`explain` reads back an in-graph assertion that carries the file
name (an image of another size); :func:`find_undecodable` decodes the source's files again in
parallel with ``ignore_errors`` and names those that went missing.
(why: docs/architecture.md#data-sources)
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Sequence

import tensorflow as tf

from mirrorfit.errors import DataError

SIZE_MARK = "mirrorfit-image-size"  # in the assertion message: name, height, width
_SIZE_FAILED = re.compile(r"\[" + SIZE_MARK + r"\] \[(.*)\] \[(\d+)\] \[(\d+)\]", re.S)
_MAX_NAMED = 3  # files named in one message; the count says how many more


@dataclass(frozen=True)
class ImageDecoder:
    """Encoded image bytes -> uint8 pixels of shape (height, width, channels). ``resize``: to
    (height, width) (bilinear, rounded back to uint8: ``--image-size``), else an image of another
    size fails the run naming its file; ``channels`` converts as Keras's ``color_mode`` does.
    """

    height: int
    width: int
    channels: int
    resize: bool

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.height, self.width, self.channels)

    def __call__(self, raw: tf.Tensor, name: tf.Tensor) -> tf.Tensor:
        image = tf.io.decode_image(raw, channels=self.channels, expand_animations=False)
        if self.resize:
            # float32 from resize; back to uint8 so that every source reaches the model the
            # same way (scaled by 1/255 after batching, pipeline._to_float).
            image = tf.image.resize(image, [self.height, self.width])
            image = tf.cast(tf.clip_by_value(tf.round(image), 0.0, 255.0), tf.uint8)
        else:
            size = tf.shape(image)
            same = tf.logical_and(tf.equal(size[0], self.height), tf.equal(size[1], self.width))
            check = tf.debugging.Assert(same, [SIZE_MARK, name, size[0], size[1]])
            with tf.control_dependencies([check]):
                image = tf.identity(image)
        return tf.ensure_shape(image, self.shape)


def probe(raw: bytes, name: str) -> tuple[int, int, int]:
    """(height, width, channels) of one encoded image, read eagerly: the shape every image of
    the source is decoded to unless ``--image-size`` says otherwise."""
    try:
        image = tf.io.decode_image(raw, expand_animations=False)
    except tf.errors.OpError as e:
        raise DataError(
            f"{name} cannot be decoded as an image ({_first_line(e)}); remove or replace the file"
        ) from None
    h, w, c = (int(d) for d in image.shape)
    return h, w, (3 if c == 4 else c)  # RGBA -> RGB: the alpha channel is no class evidence


def explain(error: tf.errors.OpError, data_flag: str) -> DataError | None:
    """A DataError for a failed size assertion of :class:`ImageDecoder` in ``error`` (the file,
    its size and the fix); None if ``error`` is not one."""
    match = _SIZE_FAILED.search(str(getattr(error, "message", error)))
    if match is None:
        return None
    name, h, w = match.group(1), match.group(2), match.group(3)
    return DataError(
        f"--data {data_flag}: image {name} is {h}x{w} pixels, not the size of the "
        "first image; pass --image-size H,W to resize every image to one size"
    )


def find_undecodable(
    items: tf.data.Dataset, names: Sequence[str], data_flag: str, cause: tf.errors.OpError
) -> DataError:
    """Decode every element of ``items`` (``(index, raw bytes)``; ``names[index]`` says which
    file or record it is) again, in parallel, skipping failures; the DataError names those that
    fail. Called only after a decode error, so its cost (one pass over the data) is paid only
    on the way out."""
    start = time.perf_counter()

    def decoded(i, raw):
        # A value of the pixels: a static result (a shape after resizing) would let TensorFlow
        # drop the decoding altogether.
        image = tf.io.decode_image(raw, expand_animations=False)
        return i, tf.reduce_max(image)

    ds = items.map(decoded, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
    ds = ds.ignore_errors()
    seen = set()
    for index, _ in ds.as_numpy_iterator():
        seen.add(int(index))
    bad = [names[i] for i in range(len(names)) if i not in seen]
    took = time.perf_counter() - start
    if not bad:
        return DataError(
            f"--data {data_flag}: decoding failed ({_first_line(cause)}), but every "
            f"image decodes when read again ({took:.0f} s); did the files change "
            "while training?"
        )
    more = f" and {len(bad) - _MAX_NAMED} more" if len(bad) > _MAX_NAMED else ""
    return DataError(
        f"--data {data_flag}: cannot decode {', '.join(bad[:_MAX_NAMED])}{more} "
        f"({_first_line(cause)}); remove or replace " + ("it" if len(bad) == 1 else "them")
    )


def _first_line(error: Exception) -> str:
    """TensorFlow's reason, without its wrapping: "Graph execution error:", "Detected at node
    ...", stack lines, "{{function_node ...}}" and "[[...]]" node lines."""
    text = str(getattr(error, "message", error))
    text = re.sub(r"\{\{function_node [^}]*\}\}\s*", "", text)
    skip = ("Graph execution error", "Detected at node", "<stack traces", "[[", "File ")
    lines = [
        ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith(skip)
    ]
    first = lines[0] if lines else type(error).__name__
    return re.sub(r"\s*\[Op:\w+\].*", "", first)[:200]


__all__ = ["ImageDecoder", "SIZE_MARK", "explain", "find_undecodable", "probe"]
