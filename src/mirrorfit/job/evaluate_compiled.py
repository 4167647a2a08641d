"""``mirrorfit evaluate --checkpoint-dir D --model package.module:function`` where D holds a
compiled ``--model``'s checkpoints (``mirrorfit.fit``'s): the model rebuilt from ``--model``,
the newest readable checkpoint read into it, and scored by its own compile (its loss and
metrics, through ``mirrorfit.evaluate``) on ``--data``'s test split as ``mirrorfit train``
gives it to such a model (MNIST's uint8 pixels, a ``.npz``'s ``x_test``, an image folder's
decoded images), not the [0, 1] images the built-in models' evaluation feeds.
"""

from __future__ import annotations

from typing import Any

from mirrorfit.config import TrainConfig
from mirrorfit.errors import ConfigError, DataError


def evaluate_checkpoint(
    config: TrainConfig, checkpoint_dir: str, model: str | None, batch_size: int
) -> dict[str, Any]:
    """``{"source", "data", "examples", "test_<name>": value, ...}``: the compile's loss and
    metrics over the test split, ``batch_size`` examples at a time."""
    import mirrorfit
    from keras import tree

    from mirrorfit.artifacts.checkpoint_model import load_model, position_of
    from mirrorfit.engine.jax import read_split_state

    net, meta = load_model(checkpoint_dir, read_split=read_split_state, model=model)
    if not getattr(net, "compiled", False) and model is None:
        raise ConfigError(
            f"{checkpoint_dir} holds mirrorfit's {net.name}, trained through mirrorfit.fit "
            "with a compile the checkpoint does not keep; mirrorfit evaluate scores a model "
            "by its compile: pass --model package.module:function returning it compiled "
            "as it trained"
        )
    if not getattr(net, "compiled", False):
        raise ConfigError(
            f"--model {model} returns a model that is not compiled (trained with --loss); "
            "mirrorfit evaluate scores a compiled --model by its own compile: compile it in "
            "its function"
        )
    data = config.data or "mnist"
    test = _test_split(config, net, batch_size)
    if test is None:
        raise DataError(f"--data {data} has no test split to evaluate on; give one that has")
    x, y, w = (*test, None, None)[:3] if isinstance(test, tuple) else (test, None, None)
    figures = mirrorfit.evaluate(
        net, x, y, sample_weight=w, batch_size=batch_size, verbose=0, return_dict=True
    )
    return {
        "source": f"{checkpoint_dir} ({position_of(meta)})",
        "data": data,
        "examples": int(len(tree.flatten(x)[0])),
        **{f"test_{name}": float(value) for name, value in figures.items()},
    }


def _test_split(config: TrainConfig, model, batch: int):
    """The test split as ``mirrorfit train`` gives it to ``model``, read without the train
    split (a folder of test/ alone, an .npz of x_test/y_test), or None where there is none."""
    from mirrorfit.job import keras_job

    data = config.data or "mnist"
    kind = keras_job.decoded_kind(config)
    if kind == "folder":
        return _folder_test(config, model, batch)
    if kind is None and data.endswith(".npz"):
        found = keras_job.npz_splits(data, train=False)
        return keras_job.checked_splits(data, model, found).get("test")
    if kind is None:
        return keras_job.splits(config, model, batch).get("test")
    return None  # TFRecords and synthetic data hold no test split


def _folder_test(config: TrainConfig, model, batch: int):
    """An image folder's test/ as uint8 pixels and int32 labels, decoded once."""
    import numpy as np

    from mirrorfit.data.file_errors import data_errors
    from mirrorfit.data.heldout import load_test
    from mirrorfit.job import keras_job
    from mirrorfit.job.evaluate import note_test_alone
    from mirrorfit.models.shapes import classes_of

    keras_job.check_one_input(config, model)
    opened = load_test(config.data, batch=batch, image_size=config.image_size, raw=True)
    keras_job.check_takes(config, model, opened.input_shape)
    outputs = classes_of(model)
    note_test_alone(opened, outputs, config.data)
    with data_errors(opened):  # an image that does not decode: one line naming the file
        pairs = list(opened.test.as_numpy_iterator())
    return tuple(np.concatenate([p[i] for p in pairs]) for i in (0, 1))
