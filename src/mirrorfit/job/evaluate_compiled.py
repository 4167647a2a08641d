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

    from mirrorfit.artifacts.checkpoint import load_model, position_of
    from mirrorfit.job.keras_job import splits

    net, meta = load_model(checkpoint_dir, model=model)
    if not getattr(net, "compiled", False):
        raise ConfigError(
            f"--model {model} returns a model that is not compiled (trained with --loss); "
            "mirrorfit evaluate scores a compiled --model by its own compile: compile it in "
            "its function"
        )
    data = config.data or "mnist"
    test = splits(config, net, batch_size).get("test")
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
