"""The TensorFlow engine's checkpoint files: a ``tf.train.Checkpoint`` of the model, the
optimizer (slots, iterations) and every model variable (Keras's seed-generator state, Dropout's
RNG, is a model variable the model's own checkpoint dependencies miss), as ``state.*``.

TF checkpoints do not depend on the strategy: a 2-replica run resumes on 1 or 4.
"""

from __future__ import annotations

from pathlib import Path

import tensorflow as tf

from mirrorfit.artifacts.checkpoint_meta import StructureError

PREFIX = "state"


class CheckpointState:
    """What :class:`~mirrorfit.artifacts.checkpoint.Checkpointer` saves of a TensorFlow run."""

    backend = "tensorflow"

    collective = False  # the chief's folder alone is kept (see Checkpointer.save)

    def __init__(self, runner) -> None:
        model, optimizer = runner.model, runner.optimizer
        self._model = model
        self._checkpoint = tf.train.Checkpoint(
            model=model, optimizer=optimizer, variables=[v.value for v in model.variables]
        )

    def first_non_finite(self) -> str | None:
        from mirrorfit.artifacts.finite import first_non_finite

        return first_non_finite(self._model.weights)

    def write(self, folder: Path) -> None:
        self._checkpoint.write(str(folder / PREFIX))

    def read(self, folder: Path) -> None:
        """StructureError when the files hold other objects; TensorFlow's own error (OpError,
        ValueError, ...) when they cannot be read."""
        _read_every_tensor(folder)
        try:
            self._checkpoint.read(str(folder / PREFIX)).assert_existing_objects_matched()
        except AssertionError as e:  # said as TensorFlow said it, first line
            first = (str(e).strip().splitlines() or [""])[0][:200]
            raise StructureError(
                f"AssertionError: {first}" if first else "AssertionError"
            ) from None


def read_model(folder: Path, model) -> None:
    """The model's variables of a TensorFlow checkpoint folder, into ``model`` (``mirrorfit
    export`` and ``evaluate``: the optimizer's are not read)."""
    _read_every_tensor(folder)
    tf.train.Checkpoint(model=model).read(
        str(folder / PREFIX)
    ).expect_partial().assert_existing_objects_matched()


def _read_every_tensor(folder: Path) -> None:
    """Read each tensor of the checkpoint once (TensorFlow's DataLossError, NotFoundError...
    for bytes it cannot read), before a restore: a restore that fails half-way leaves values
    it did not assign, which TensorFlow lists later in a WARNING line each (a damaged file's
    one-line error came with six)."""
    reader = tf.train.load_checkpoint(str(folder / PREFIX))
    for name in reader.get_variable_to_shape_map():
        reader.get_tensor(name)


__all__ = ["CheckpointState", "StructureError", "read_model", "PREFIX"]
