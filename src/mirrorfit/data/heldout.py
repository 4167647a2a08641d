"""A ``--data`` source's test split alone, for ``mirrorfit evaluate``, reading as little of the
training split as the source allows:

- ``mnist``: its test arrays; ``FILE.npz``: ``x_test`` and ``y_test`` alone;
- an image ``FOLDER``: its ``test/`` subfolder, labels by train/'s sorted class folders (none
  of its images read), or, without ``train/``, by test/'s own class folders;
- ``package.module:function``: only its test split read, labels checked while scoring; an
  infinite dataset is refused, one of unknown length stopped after ``MAX_UNKNOWN_TEST``.

No test split, or an empty one, is one DataError line naming the fix.
"""

from __future__ import annotations

import importlib

from mirrorfit.data.opened import TestSplit
from mirrorfit.data.spec import kind_of
from mirrorfit.errors import DataError


def load_test(
    spec: str,
    *,
    batch: int,
    data_dir: str | None = None,
    image_size: tuple[int, int] | None = None,
    parallel: bool = True,
    raw: bool = False,
) -> TestSplit:
    """``spec``'s test split (a ``--data`` value), in batches of ``batch`` examples (the last
    one partial); ``data_dir`` and ``image_size`` are the flags of the same names; ``raw``:
    an image folder's pixels as decoded (uint8), not scaled to [0, 1]."""
    kind = kind_of(spec)
    opener = getattr(importlib.import_module(kind.module), "open_test", None)
    test = (
        None
        if opener is None
        else opener(
            spec,
            batch=batch,
            data_dir=data_dir,
            image_size=image_size,
            parallel=parallel,
            raw=raw,
        )
    )
    if test is None:
        raise DataError(
            f"--data {spec} has no test split to evaluate on: {kind.no_test or kind.missing_test}"
        )
    return test


__all__ = ["load_test"]
