"""A request checked against its signature before it costs a queue, a thread or memory: input
names, dtypes, shapes and rows, with TF Serving's messages where it has them.
:func:`check_inputs` on decoded arrays (both transports); :func:`check_declared` on each gRPC
TensorProto's declared dtype and shape, before decoding.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from mirrorfit.serving.errors import invalid
from mirrorfit.serving.loader import Signature, TensorInfo

# Rows per request (dim 0 of a batched input). The byte limit bounds what a request carries,
# not what the model makes of it: the CNN holds ~0.4 MB of activations per row, so 1,000 rows
# (TF Serving's default max_batch_size) peak near 400 MB. Raise it with --max_rows_per_request.
MAX_ROWS = 1000

_TF_NAMES = {tf.float32: "float", tf.float64: "double", tf.float16: "half"}  # DataTypeString


def dtype_name(dtype: tf.DType | int) -> str:
    """TensorFlow's name for a dtype (DataTypeString): float, double, uint8, string, ..."""
    if isinstance(dtype, int):
        if dtype == 0:
            return "invalid"
        try:
            dtype = tf.as_dtype(dtype)
        except TypeError:
            return f"unknown dtype enum ({dtype})"
    return _TF_NAMES.get(dtype, dtype.name)


def array_dtype(value: np.ndarray) -> tf.DType | str:
    """The TensorFlow dtype of a decoded array (object and byte strings are DT_STRING)."""
    if value.dtype.kind in "OSU":
        return tf.string
    try:
        return tf.as_dtype(value.dtype)
    except TypeError:
        return str(value.dtype)


def check_names(sig: Signature, names) -> None:
    want, got = set(sig.inputs), set(names)
    if want != got:
        raise invalid(
            f"input size does not match signature: {len(got)}!={len(want)} "
            f"len({{{','.join(sorted(got))}}}) != len({{{','.join(sorted(want))}}}). "
            f"Sent extra: {{{','.join(sorted(got - want))}}}. Missing but required: "
            f"{{{','.join(sorted(want - got))}}}."
        )


def check_dtype(info: TensorInfo, got: tf.DType | int | str) -> None:
    """No silent casts: a float tensor for a uint8 input is an error, as in TF Serving."""
    if got != info.dtype:  # (a DType compares equal to its enum)
        shown = got if isinstance(got, str) else dtype_name(got)
        raise invalid(
            f"Expected input {info.alias} to be {dtype_name(info.dtype)} but get {shown}."
        )


def check_shape(info: TensorInfo, dims: tuple[int, ...], max_rows: int) -> None:
    """``dims`` must fit the signature's shape (-1 dims take any size) and, where dim 0 is
    the batch, hold at most ``max_rows`` rows."""
    want = info.shape
    if any(d < 0 for d in dims):
        raise invalid(f"input {info.alias}: invalid shape {list(dims)}: dimensions must be >= 0")
    if want is not None and (
        len(dims) != len(want) or any(w is not None and d != w for d, w in zip(dims, want))
    ):
        shown = ",".join("-1" if w is None else str(w) for w in want)
        raise invalid(
            f"input {info.alias}: shape {list(dims)} does not match the signature's [{shown}]"
        )
    batch_dim = want is None or (len(want) >= 1 and want[0] is None)
    if dims and batch_dim and dims[0] > max_rows:
        raise invalid(
            f"input {info.alias}: {dims[0]} rows is more than the limit of "
            f"{max_rows} rows per request (--max_rows_per_request)"
        )


def check_declared(info: TensorInfo, dtype_enum: int, dims: tuple[int, ...], max_rows: int) -> None:
    """A TensorProto's declared dtype and shape, before it is decoded."""
    check_dtype(info, dtype_enum)
    check_shape(info, dims, max_rows)


def check_inputs(sig: Signature, inputs: dict[str, np.ndarray], max_rows: int = MAX_ROWS) -> None:
    """Names, dtypes, shapes and rows of decoded inputs."""
    check_names(sig, inputs)
    for alias, value in inputs.items():
        info = sig.inputs[alias]
        check_dtype(info, array_dtype(np.asarray(value)))
        check_shape(info, tuple(np.shape(value)), max_rows)


def check_rows(count: int, max_rows: int, what: str = "examples") -> None:
    if count > max_rows:
        raise invalid(
            f"{count} {what} is more than the limit of {max_rows} rows per request "
            "(--max_rows_per_request)"
        )


__all__ = [
    "MAX_ROWS",
    "array_dtype",
    "check_declared",
    "check_dtype",
    "check_inputs",
    "check_names",
    "check_rows",
    "check_shape",
    "dtype_name",
]
