"""The training run's data: open --data for this process, check the model takes its examples,
and name what it is made of (the flags behind its order, for checkpoints; how it is read, for
the profile). For job.train; tf.data's errors about the files: :mod:`mirrorfit.data.file_errors`.
"""

from __future__ import annotations

from typing import Any

from mirrorfit.config import TrainConfig
from mirrorfit.data.sources import Data, load_data
from mirrorfit.data.spec import KINDS
from mirrorfit.engine.backends import WORKER_SHARE
from mirrorfit.errors import DataError


def load_run_data(config: TrainConfig, global_batch: int, dist) -> Data:
    """``--data`` for this run. Each worker reads its own share (WORKER_SHARE), else one
    process reads whole global batches (workers=1 for the order)."""
    workers = dist.workers if dist.input_split == WORKER_SHARE else 1
    return load_data(config.data, global_batch=global_batch, workers=workers, **source(config))


def source(config: TrainConfig) -> dict[str, Any]:
    """The flags of ``config`` that open ``--data``, as :func:`load_data` takes them."""
    return dict(
        seed=config.seed,
        eval_batch=config.eval_batch_size,
        data_dir=config.data_dir,
        train_examples=config.train_examples,
        validation_split=config.validation_split,
        image_size=config.image_size,
        image_feature=config.image_feature,
        label_feature=config.label_feature,
        cache=config.cache,
        input_shape=config.input_shape,
        num_classes=config.num_classes,
        model=config.model,
    )


def check_model_fits(model, data: Data, config: TrainConfig) -> None:
    """Refuse, in one line, a model whose input does not take the data's examples or whose
    outputs are fewer than the data's classes (a label past the last output is no error to
    Keras: the loss would be silently wrong or NaN)."""
    try:
        want = tuple(model.inputs[0].shape[1:])
        model.outputs[0].shape  # noqa: B018 (read below; absent alike)
    except (AttributeError, IndexError, TypeError, ValueError):
        # A subclassed model, or a Sequential without keras.Input: no variables yet, and
        # none for the optimizer to build its state from.
        raise DataError(
            f"--model {config.model} returns a model whose input is not known "
            "before it is called (a subclassed model, or a Sequential without "
            "keras.Input); start it with keras.Input(shape), e.g. "
            "keras.Sequential([keras.Input(input_shape), ...])"
        ) from None
    have = tuple(data.input_shape)
    if len(want) != len(have) or any(w is not None and w != h for w, h in zip(want, have)):
        shown = "x".join("?" if w is None else str(w) for w in want)
        hint = (
            "pass --image-size H,W to resize the images"
            if KINDS[data.kind].files
            else "pass --input-shape to build the model for the data"
            if config.input_shape is None and data.kind == "synthetic"
            else "give data of that shape"
        )
        raise DataError(
            f"--data {data.source} gives examples of shape "
            f"{'x'.join(map(str, have))} but --model {config.model} takes "
            f"{shown}; {hint}, or use a model built for "
            f"{'x'.join(map(str, have))}"
        )
    outputs = model.outputs[0].shape[-1]
    if outputs is not None and outputs < data.num_classes:
        raise DataError(
            f"--data {data.source} has labels 0-{data.num_classes - 1} "
            f"({data.num_classes} classes) but --model {config.model} has "
            f"{outputs} outputs; pass --num-classes {data.num_classes} (a model "
            "function takes it as num_classes) or a model with enough outputs"
        )


def input_source(data: Data, config: TrainConfig) -> str:
    """How the profiled input is read, for the report and its advice."""
    kind = KINDS[data.kind]
    if kind.in_memory:
        return kind.reads  # memory; synthetic: one batch repeated
    if kind.name == "module" and config.cache is not None:
        return "memory"  # tf.data's cache() of the function's dataset
    return f"{kind.reads}, {'decoded once (--cache)' if config.cache else 'decoded every step'}"
