"""What ``mirrorfit.fit`` reads: anything Keras's ``fit`` takes, through Keras's data adapters, as
global batches of one static size, each a dict: ``x``, ``y`` (absent without targets), ``w``
(sample weights, ``class_weight`` folded in, ones by default; nested like ``y``), ``mask`` (1 a
real example, 0 padding), ``scale`` (global batch / real examples). A partial batch is padded
with copies of its last example (zeros for a model whose outputs carry a Keras mask), weight 0;
the loss weights by ``w`` x ``scale``, metrics by ``mask``; dtypes are kept.
(why: docs/keras-script.md#mirrorfitfit, "Every example, every epoch")
"""

from __future__ import annotations

import numpy as np

from mirrorfit.errors import FitError

KEYS = ("x", "y", "w", "mask", "scale")


def check_not_ragged(name: str, part) -> None:
    """FitError for a ``tf.RaggedTensor`` in ``part`` (an array structure or a
    ``tf.data.Dataset``): Keras's adapters hand its batches on as zero-padded rectangles, which
    a model written for ragged input would compute on silently."""
    from keras import tree

    spec = getattr(part, "element_spec", None)
    leaves = tree.flatten(spec if spec is not None else part)
    if any(type(a).__name__ in ("RaggedTensor", "RaggedTensorSpec") for a in leaves):
        raise FitError(
            f"{name} holds a tf.RaggedTensor, which mirrorfit would split as a zero-padded "
            "rectangle; give it as .to_tensor() (with a mask, e.g. Embedding(mask_zero=True)), "
            "or use the model's own fit/predict for ragged input"
        )


_NOT_NUMBERS = {"U": "strings", "S": "bytes", "c": "complex numbers", "M": "dates", "m": "times"}


def check_targets_given(model, x, y) -> None:
    """FitError for arrays without targets given to a model whose compiled loss needs them
    (a model that is its own loss, add_loss or compute_loss, trains on ``y=None``)."""
    from keras import tree

    from mirrorfit.fitting.metrics import overrides

    arrays = x is not None and all(isinstance(a, np.ndarray) for a in tree.flatten(x))
    if y is None and arrays and model.loss is not None and not overrides(model, "compute_loss"):
        raise FitError(
            "y=None, but the model is compiled with a loss, which needs targets; give y, or "
            "compile without a loss a model that adds its own (add_loss)"
        )


def check_arrays(x, y, sample_weight) -> None:
    """FitError for arrays that Keras would cast to other numbers (complex ones to their real
    part) or stop on in a traceback (strings; rows that disagree, "Data cardinality is
    ambiguous"), naming the part and the fix."""
    from keras import tree

    lengths = {}
    for name, part in (("x", x), ("y", y), ("sample_weight", sample_weight)):
        for a in tree.flatten(part) if part is not None else ():
            kind = getattr(getattr(a, "dtype", None), "kind", None)
            if kind in _NOT_NUMBERS:
                text = kind in "US"
                fix = "tokenise text, encode labels as integers" if text else "convert them"
                raise FitError(
                    f"{name} holds {_NOT_NUMBERS[kind]} (dtype {a.dtype}), which Keras "
                    f"{'cannot take' if text else 'would cast'}; give real numbers ({fix})"
                )
            shape = getattr(a, "shape", None)
            if shape is not None and len(shape) and isinstance(shape[0], int):
                lengths.setdefault(name, set()).add(shape[0])
    sizes = set().union(*lengths.values()) if lengths else set()
    if len(sizes) > 1:
        said = ", ".join(f"{n} {'/'.join(map(str, sorted(v)))}" for n, v in lengths.items())
        raise FitError(
            f"the arrays have different numbers of rows ({said}); every input, target and "
            "weight needs one row per example"
        )


def _floats(dtype) -> bool:
    """Whether ``dtype`` holds floats: NumPy's, and ml_dtypes' bfloat16 and float8 (kind "V")."""
    return dtype.kind == "f" or dtype.name.startswith(("bfloat", "float"))


def check_finite(x, y, sample_weight, *, validation: str = "", first_row: int = 0) -> None:
    """FitError for a NaN or an infinity in NumPy training arrays (inputs, targets, weights):
    the loss of the first batch holding one is NaN, and the weights with it, which the
    divergence guard would only see after the call, blaming the learning rate.
    ``validation``: the validation arrays, named so (``"the validation data's "``), their
    rows counted from ``first_row``. Read in blocks of rows, so that a memory map is not held
    whole."""
    harm = (
        "the loss of the batch holding it would be NaN, and the weights after it"
        if not validation
        else "val_loss would be NaN or meaningless, and a callback watching it misled"
    )
    from keras import tree

    for name, part in (("x", x), ("y", y), ("sample_weight", sample_weight)):
        parts = tree.flatten_with_path(part) if part is not None else ()
        for path, a in parts:
            if not isinstance(a, np.ndarray) or not a.ndim or not _floats(a.dtype):
                continue
            rows = max(1, (1 << 22) // max(1, a[0].size))  # about 4M values a block
            for start in range(0, len(a), rows):
                bad = ~np.isfinite(a[start : start + rows])
                if bad.any():
                    row = start + int(np.argwhere(bad)[0][0])
                    key = "".join(f"[{k!r}]" for k in path)
                    value = a[start : start + rows][bad][0]
                    raise FitError(
                        f"{validation}{name}{key} holds {value} (row {first_row + row}); "
                        f"{harm}: "
                        "clean the data (drop the row, or np.nan_to_num), or pass "
                        "allow_nan=True (--allow-nan) to train on as Keras does"
                    )


def check_batch_size(batch_size, replicas: int, accum_steps: int = 1) -> int:
    """The global batch as an int; FitError unless it splits evenly into replicas x
    micro-batches."""
    import numbers

    if (
        not isinstance(batch_size, numbers.Integral)
        or isinstance(batch_size, bool)
        or batch_size < 1
    ):
        raise FitError(
            f"batch_size={batch_size!r}: give the global batch, a whole number of at least 1"
        )
    batch_size, parts = int(batch_size), replicas * accum_steps
    if batch_size % parts:
        raise FitError(
            f"batch_size={batch_size} does not split over {replicas} replica(s) x "
            f"{accum_steps} micro-batch(es); use a multiple of {parts}, e.g. "
            f"{parts * max(1, round(batch_size / parts))}"
        )
    return batch_size


def padded(
    data, batch_size: int, *, where: str = "training data", zeros: bool = False
) -> dict | None:
    """One batch of ``(x, y, sample_weight)`` NumPy structures as the dict above, padded to
    ``batch_size`` rows; None for a batch of 0 examples. ``zeros``: pad ``x`` and ``y`` with
    zeros, not copies of the last example."""
    import keras
    from keras import tree

    x, y, w = _unpacked(data)
    n = _checked_rows(data, batch_size, where)
    if n == 0:
        return None
    floatx = keras.config.floatx()
    if w is None:
        w = ones_like_targets(y, n, floatx)
    w = tree.map_structure(lambda a: np.asarray(a, floatx), w)
    fill = _pad if zeros else _pad_last
    out = {
        "x": tree.map_structure(lambda a: fill(a, batch_size), x),
        "w": tree.map_structure(lambda a: _pad(a, batch_size), w),
        "mask": _pad(np.ones((n,), floatx), batch_size),
        "scale": np.full((batch_size,), batch_size / n, floatx),
    }
    if y is not None:
        out["y"] = tree.map_structure(lambda a: fill(a, batch_size), y)
    return out


def _unpacked(data):
    from keras.src.trainers.data_adapters.data_adapter_utils import unpack_x_y_sample_weight

    return unpack_x_y_sample_weight(tuple(data) if isinstance(data, list) else data)


def rows(data, *, where: str = "training data") -> int:
    """The examples in one batch of ``(x, y, sample_weight)``; FitError when its arrays
    disagree."""
    from keras import tree

    leaves = [a for a in tree.flatten(_unpacked(data)) if a is not None]
    sizes = {np.shape(a)[0] if np.ndim(a) else None for a in leaves}
    if len(sizes) != 1 or None in sizes:
        raise FitError(
            f"a batch of the {where} has arrays of different lengths "
            f"({sorted(map(str, sizes))}); every input, target and weight needs "
            "one row per example"
        )
    return sizes.pop()


def ones_like_targets(y, n: int, dtype):
    """Weights of 1, one per target: shaped ``(n, 1, ...)`` to the target's rank, so that they
    broadcast against a per-example loss and a per-token one alike (a ``(n,)`` weight
    against an ``(n, T)`` loss is Keras's own broadcasting error)."""
    from keras import tree

    if y is None:
        return np.ones((n,), dtype)
    return tree.map_structure(lambda a: np.ones((n,) + (1,) * max(0, np.ndim(a) - 1), dtype), y)


def _pad(a, rows: int) -> np.ndarray:
    a = np.asarray(a)
    if a.shape[0] == rows:
        return a
    return np.concatenate([a, np.zeros((rows - a.shape[0], *a.shape[1:]), a.dtype)])


def _pad_last(a, rows: int) -> np.ndarray:
    # A real example passes the model without 0/0 (a masked mean over a row that is all
    # mask_zero tokens is NaN, and NaN x weight 0 is NaN), whatever its dtype
    a = np.asarray(a)
    if a.shape[0] == rows:
        return a
    return np.concatenate([a, np.repeat(a[-1:], rows - a.shape[0], axis=0)])


def as_given(data, batch_size: int, *, where: str = "training data") -> dict | None:
    """One batch as the source gave it, for a model's own ``train_step``/``test_step``
    (``{"data": ...}``, not padded); None for a batch of 0 examples."""
    if _checked_rows(data, batch_size, where) == 0:
        return None
    return {"data": tuple(data) if isinstance(data, list) else data}


def rows_of(batch: dict) -> int:
    """The real examples in a batch of :func:`padded` or :func:`as_given`."""
    if "data" in batch:
        return rows(batch["data"])
    return int(round(batch["mask"].shape[0] / float(batch["scale"][0])))


def _checked_rows(data, batch_size: int, where: str) -> int:
    """The batch's examples; FitError for more than the global batch or object arrays."""
    from keras import tree

    n = rows(data, where=where)
    if n > batch_size:
        raise FitError(
            f"a batch of the {where} holds {n} examples, more than batch_size="
            f"{batch_size}; batch it to at most {batch_size} (or pass that "
            "batch_size)"
        )
    for a in tree.flatten(_unpacked(data)):
        if a is not None and np.asarray(a).dtype == object:
            raise FitError(
                f"the {where} holds an array of Python objects (dtype object, "
                "e.g. strings); give numeric arrays (tokenise text first)"
            )
    return n


def nbytes(batch: dict) -> int:
    """Bytes of one batch (what a block of them costs in host memory)."""
    from keras import tree

    return sum(np.asarray(a).nbytes for a in tree.flatten(batch))


def signature(batch: dict) -> tuple:
    """Shapes and dtypes of a padded batch: batches of one signature stack into a block."""
    from keras import tree

    return tuple((np.shape(a), np.asarray(a).dtype.str) for a in tree.flatten(batch))
