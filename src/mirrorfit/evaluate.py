"""``mirrorfit evaluate``: test-set accuracy and loss of a checkpoint or an exported version."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

from mirrorfit.checkpoint import load_model
from mirrorfit.data import load_mnist
from mirrorfit.errors import ConfigError
from mirrorfit.export import INPUT_NAME, OUTPUT_NAME, versions


def _saved_model_predict(path: Path):
    if versions(path):  # a base path: take the newest version, as TF Serving would
        path = path / f"{versions(path)[-1]:04d}"
    if not (path / "saved_model.pb").is_file():
        raise ConfigError(f"no SavedModel at {path}; pass models/NAME or models/NAME/0001")
    fn = tf.saved_model.load(str(path)).signatures["serving_default"]
    raw = fn.structured_input_signature[1][INPUT_NAME].dtype == tf.uint8
    return path, lambda x: fn(**{INPUT_NAME: tf.constant(x if raw else x / np.float32(255))}
                              )[OUTPUT_NAME].numpy()


def evaluate_artifact(*, checkpoint_dir: str | None = None, saved_model: str | None = None,
                      data_dir: str | None = None, batch_size: int = 500,
                      model: str | None = None) -> dict[str, Any]:
    """Accuracy and mean cross-entropy over the whole MNIST test set (10,000 images).
    ``model``: a checkpoint's user model spec, to allow importing it (see ``load_model``)."""
    if bool(checkpoint_dir) == bool(saved_model):
        raise ConfigError("pass exactly one of --checkpoint-dir or --saved-model")
    data = load_mnist(data_dir, train_examples=1)
    if checkpoint_dir:
        net, meta = load_model(checkpoint_dir, model=model)
        source = f"{checkpoint_dir} (step {meta['step']})"
        predict = lambda x: net(x / np.float32(255), training=False).numpy()  # noqa: E731
    else:
        path, predict = _saved_model_predict(Path(saved_model))
        source = str(path)
    probs = np.concatenate([predict(data.x_test[i:i + batch_size])
                            for i in range(0, len(data.x_test), batch_size)])
    y = data.y_test
    loss = float(np.mean(-np.log(np.clip(probs[np.arange(len(y)), y], 1e-7, 1.0))))
    return {"source": source, "examples": int(len(y)),
            "test_accuracy": float(np.mean(np.argmax(probs, 1) == y)), "test_loss": loss}
