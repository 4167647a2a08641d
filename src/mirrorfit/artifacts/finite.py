"""Whether a model's weights are all finite: checkpoints and exports refuse NaN or infinite
ones (``--allow-nan`` writes them on purpose)."""

from __future__ import annotations

import numpy as np

from mirrorfit.errors import DivergedError


def first_non_finite(variables) -> str | None:
    """The path (or name) of the first floating-point variable holding a NaN or an infinity,
    with how many of its values are; None when every value is finite."""
    for v in variables:
        value = np.asarray(v.numpy() if hasattr(v, "numpy") else v.value)
        if not np.issubdtype(value.dtype, np.floating) and value.dtype.kind != "V":
            continue
        value = value.astype(np.float32) if value.dtype.kind == "V" else value  # bfloat16
        bad = int(value.size - np.count_nonzero(np.isfinite(value)))
        if bad:
            name = getattr(v, "path", None) or getattr(v, "name", "a variable")
            return f"{name}: {bad} of {value.size} values"
    return None


def refuse_non_finite(model, what: str, *, allow: bool) -> None:
    """DivergedError naming the first non-finite weight of ``model`` (``what``: whose weights,
    e.g. ``"step 40 of ckpt/"``), unless ``allow``."""
    bad = None if allow else first_non_finite(model.weights)
    if bad is not None:
        raise DivergedError(
            f"{what}: the weights are not finite ({bad}); a model of NaNs "
            "is not exported (pass --allow-nan to export it anyway)"
        )
