"""A checkpoint folder's model, rebuilt for ``mirrorfit export`` and ``evaluate``: the
newest readable checkpoint of ``mirrorfit.fit``'s (artifacts/epoch_checkpoint.py), its model
built from its recorded name and shapes (bounded: a hostile meta.json cannot have a huge
model built) and its weights read. (docs/checkpoints.md)
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable

from mirrorfit.artifacts.checkpoint_meta import CheckpointError, require_checkpoints
from mirrorfit.artifacts.commit import why as _why


# Reads a model's variables from a checkpoint folder whose state was split over JAX devices:
# read_split(folder, model) (mirrorfit.engine.backends.read_split_state).
ReadSplit = Callable[[Path, Any], None]


def load_model(
    directory: str | Path,
    *,
    read_split: ReadSplit,
    model: str | None = None,
    on_notice: Callable[[str], None] = lambda m: print(m, file=sys.stderr),
):
    """The model of the newest readable checkpoint in ``directory``, rebuilt outside any
    strategy, and its meta (with ``where``, the checkpoint's name); only the model's variables
    are read (a state split over JAX devices by ``read_split``). A user's ``--model`` is
    imported only when ``model`` names it (a checkpoint folder must not choose which code
    runs); a built-in one is found by the model's recorded name."""
    directory = Path(directory)
    require_checkpoints(directory)
    return _load_fit_model(directory, model, read_split, on_notice)


def _load_fit_model(directory: Path, asked: str | None, read_split: ReadSplit, on_notice):
    """The model of ``mirrorfit.fit``'s newest readable checkpoint in ``directory`` (a user's
    ``--model`` is named by ``asked``: a checkpoint folder does not choose which code runs; a
    built-in one is found by the model's recorded name), and its meta with ``where``, the
    checkpoint's name."""
    import keras
    import numpy as np

    from mirrorfit.artifacts import epoch_checkpoint
    from mirrorfit.models.build import model_factory, needs_data_shape
    from mirrorfit.models.names import built_in_named

    recorded = epoch_checkpoint.recorded_built_in(directory)
    if asked is None:
        asked = recorded or built_in_named(epoch_checkpoint.recorded_name(directory))
    if asked is None:
        raise CheckpointError(
            f"{directory} holds mirrorfit.fit's checkpoints (epoch-NNNNNN) of a model that "
            "is not one of mirrorfit's own (or whose newest readable meta.json does not "
            "name one); pass --model package.module:function, the one that trained them"
        )
    # Built for the shapes it trained with (recorded in meta.json), where its function takes
    # them: --input-shape/--num-classes, or the data's; the identity check refuses a mismatch.
    inputs, outputs = epoch_checkpoint.model_shapes(directory)
    one_in = inputs[0][1:] if _plausible(inputs) else None
    one_out = outputs[0][-1] if _plausible(outputs, outputs=True) else None
    unknown = (
        f"the checkpoints in {directory} do not record the shapes the model trained on (a "
        "meta.json of mirrorfit before 2026-12-05, or a damaged one)"
    )
    build = model_factory(asked, input_shape=one_in, num_classes=one_out)  # imports it
    if needs_data_shape(asked, one_in, one_out):
        raise CheckpointError(
            f"{unknown}, which --model {asked} needs (its input_shape or num_classes has no "
            "default); give them defaults, the values training gave"
        )
    net = build()
    if not net.built and one_in is None:
        raise CheckpointError(
            f"{unknown}, and --model {asked} declares no keras.Input to build it from; "
            "start the model with keras.Input(shape), the shape it trained on"
        )
    if not net.built:  # no Input: built from the data, as it was
        batch = inputs[0][0]  # the first batch's size, which its InputLayer's config keeps
        try:
            if isinstance(net, keras.Sequential):  # its InputLayer keeps the batch size
                net.build((batch if type(batch) is int and batch > 0 else None, *one_in))
            else:  # a subclassed model: its layers build on a first call
                net(np.zeros((1, *one_in), "float32"))
        except Exception as e:  # Keras raises ValueError, TypeError... for a shape it refuses
            raise CheckpointError(
                f"--model {asked} cannot be built for the input shape {tuple(one_in)} that "
                f"{directory}'s meta.json records ({_why(e)}); pass the "
                "--model that trained it, or restore the file"
            ) from None

    pixels = epoch_checkpoint.recorded_pixels(directory)
    if pixels:  # trained on uint8 pixels scaled in the model: read as it trained
        from mirrorfit.models.build import inner_model, taking_pixels

        net = taking_pixels(net, one_in)
    path, meta = epoch_checkpoint.read_newest(net, directory, read_split, on_notice)
    return (inner_model(net) if pixels else net), {**meta, "where": path.name}


def _plausible(shapes, *, outputs: bool = False) -> bool:
    """Whether meta.json's recorded shapes (a hint, not trusted: the identity check decides)
    are one shape: a batch axis and up to 4 sizes (inputs: each at most MAX_IMAGE_SIDE, 2**26
    values in all; outputs: the last at most MAX_CLASSES), so that a hostile one cannot have
    a huge model built before the check refuses it."""
    import math

    from mirrorfit.config.checks import MAX_IMAGE_SIDE
    from mirrorfit.data.spec import MAX_CLASSES

    if not isinstance(shapes, list) or len(shapes) != 1 or not isinstance(shapes[0], list):
        return False
    sizes = shapes[0][1:]
    if not 1 <= len(sizes) <= 4:
        return False
    if outputs:
        return type(sizes[-1]) is int and 1 <= sizes[-1] <= MAX_CLASSES
    return all(type(n) is int and 1 <= n <= MAX_IMAGE_SIDE for n in sizes) and (
        math.prod(sizes) <= 1 << 26
    )


def position_of(meta: dict) -> str:
    """Where a checkpoint :func:`load_model` read stands, for messages: its folder's name."""
    return meta["where"]


__all__ = ["load_model", "position_of"]
