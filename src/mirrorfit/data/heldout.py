"""A ``--data`` source's test split alone, for ``mirrorfit evaluate``: what scoring needs is
read, the training split as little as the source allows.

* ``mnist``: its test arrays; ``FILE.npz``: ``x_test`` and ``y_test`` alone (a file without
  ``x_train`` is scored too);
* an image ``FOLDER``: its ``test/`` subfolder. Beside ``train/``, labels index train/'s
  sorted class folders, as in training (train/ is listed, no image of it read). A folder of
  ``test/`` alone (``val/`` may be there too) is scored on its own: its class folders are the
  classes, so it needs one for every class the model was trained on, named as in training;
* ``package.module:function``: the function is called, and only its test split checked and
  read: a dataset's labels are checked batch by batch while it is scored, in one pass. An
  infinite dataset is refused up front; one of unknown length (``from_generator``) that has
  not ended after ``MAX_UNKNOWN_TEST`` examples is stopped with one line, not read for ever.

A source without a test split, or with a test split that has no examples, is one DataError
line naming the fix.
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
) -> TestSplit:
    """``spec``'s test split (a ``--data`` value), in batches of ``batch`` examples (the last
    one partial); ``data_dir`` and ``image_size`` are the flags of the same names."""
    kind = kind_of(spec)
    opener = getattr(importlib.import_module(kind.module), "open_test", None)
    test = (
        None
        if opener is None
        else opener(spec, batch=batch, data_dir=data_dir, image_size=image_size, parallel=parallel)
    )
    if test is None:
        raise DataError(
            f"--data {spec} has no test split to evaluate on: {kind.no_test or kind.missing_test}"
        )
    return test


__all__ = ["load_test"]
