"""tf.data's errors about a source's files, as one line naming the file: the data ended early,
an image that does not decode or has another size, a file gone. For training, evaluate and
bench. TensorFlow is looked at only when loaded (it reads file sources under both engines)."""

from __future__ import annotations

import contextlib
import sys

from mirrorfit.data.sources import Data
from mirrorfit.data.spec import KINDS
from mirrorfit.errors import DataEndedError, DataError


@contextlib.contextmanager
def data_errors(data: Data):
    """A tf.data error about the source's files (an image that does not decode, or has another
    size; a file gone) as one line naming the file, not a traceback."""
    try:
        yield
    except Exception as e:
        tf = sys.modules.get("tensorflow")  # a tf.data error needs TensorFlow loaded
        ended = tf is not None and isinstance(e, tf.errors.OutOfRangeError)
        if ended or isinstance(e, DataEndedError):  # counted N examples, then gave fewer
            raise DataError(
                f"--data {data.source}: the data ended before the epoch did: it "
                f"yielded fewer examples than the {data.train_examples:,} counted "
                "when it was opened; it must give the same examples on every "
                "pass"
            ) from None
        if tf is None or not isinstance(e, tf.errors.OpError):
            raise
        if isinstance(e, (tf.errors.InvalidArgumentError, tf.errors.DataLossError)):
            found = data.explain(e)
            if found is None:
                raise
            raise found from None
        if not isinstance(e, tf.errors.NotFoundError) or not KINDS[data.kind].files:
            raise
        first = (str(getattr(e, "message", e)).strip().splitlines() or [""])[0][:300]
        raise DataError(
            f"--data {data.source}: a file went missing while training "
            f"({first}); restore it, or rerun to list the files again"
        ) from None
