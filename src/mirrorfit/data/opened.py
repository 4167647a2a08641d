"""What an opened ``--data`` source gives: :class:`Data` for a training run
(:func:`mirrorfit.data.sources.load_data`), :class:`TestSplit` for ``mirrorfit evaluate``
(:func:`mirrorfit.data.heldout.load_test`: the test split alone)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable


from mirrorfit.errors import DataError

if TYPE_CHECKING:
    import tensorflow as tf

EvalData = Any  # (x, y) arrays, or a tf.data.Dataset of global batches (last one partial)
Explain = Callable[["tf.errors.OpError"], "DataError | None"]


class _Explains:
    _explain: Explain | None

    def explain(self, error: tf.errors.OpError) -> DataError | None:
        """A one-line DataError naming the file behind a tf.data error raised while training
        or evaluating (an image that does not decode, or has another size); None if the error
        is not about this source's files."""
        if self._explain is None:
            return None
        return self._explain(error)


@dataclass(frozen=True)
class Data(_Explains):
    """Everything a run needs from ``--data``. ``train`` has the trainer's training-data
    protocol (``global_batch``, ``steps_per_epoch``, ``order``, ``dataset``, ``sampled``);
    ``val``/``test`` are what ``Trainer.evaluate`` takes, or None when the source has none.
    ``input_shape`` is one example's (pixels: height, width, channels), ``num_classes`` the
    labels' (0..num_classes-1)."""

    train: Any
    val: EvalData | None
    test: EvalData | None
    input_shape: tuple[int, ...]
    num_classes: int
    description: str
    fingerprint: str
    kind: str
    source: str  # the file, folder, pattern or function --data resolved to
    class_names: tuple[str, ...] | None = None
    _explain: Explain | None = field(default=None, repr=False, compare=False)
    # a --data function's splits as it returned them: read again by a run through
    # mirrorfit.fit (job/keras_job.py), not by calling the function a second time
    returned: dict | None = field(default=None, repr=False, compare=False)

    @property
    def train_examples(self) -> int:
        return self.train.order.examples


@dataclass(frozen=True)
class TestSplit(_Explains):
    """A source's test split alone. ``num_classes``: the classes its labels index (an image
    folder's class folders, or the largest label + 1), None for a dataset, whose labels are
    only seen while it is read (scoring checks each batch's)."""

    __test__ = False  # not a pytest test class

    test: Any  # a tf.data.Dataset of (x, y) batches, the last one partial
    input_shape: tuple[int, ...]
    num_classes: int | None
    description: str
    kind: str
    source: str
    class_names: tuple[str, ...] | None = None
    _explain: Explain | None = field(default=None, repr=False, compare=False)
    alone: bool = False  # an image folder's test/ without train/: its own folders are classes


__all__ = ["Data", "EvalData", "TestSplit"]
