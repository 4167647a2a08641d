"""``mirrorfit evaluate``: test-set accuracy and loss of a checkpoint or an exported version on
the test split of any ``--data`` source that has one (MNIST's 10,000 images by default). The
flags are checked in plain Python first (:func:`check_evaluate_flags`); the test examples go
through training's own evaluation pipeline, so a checkpoint scores what its run reported.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path
from typing import Any

from mirrorfit.artifacts.checkpoint_meta import require_checkpoints
from mirrorfit.config import load_config
from mirrorfit.data.spec import KINDS, kind_of
from mirrorfit.errors import ConfigError, DataError
from mirrorfit.artifacts.version_names import parse_version

EVAL_BATCH = 500  # examples per evaluation batch


def check_evaluate_flags(
    *,
    checkpoint_dir: str | None = None,
    saved_model: str | None = None,
    data: str = "mnist",
    data_dir: str | None = None,
    image_size: str | tuple[int, int] | None = None,
):
    """ConfigError, one line, for flags that cannot evaluate anything: not exactly one model,
    a source that does not exist or cannot have a test split (synthetic data, TFRecords), a
    flag that does not apply to it (checked as `mirrorfit train` checks it). Plain Python;
    returns the checked :class:`~mirrorfit.config.TrainConfig` (``image_size`` as (height,
    width) pixels)."""
    if bool(checkpoint_dir) == bool(saved_model):
        raise ConfigError("pass exactly one of --checkpoint-dir or --saved-model")
    config = load_config(data=data, data_dir=data_dir, image_size=image_size)
    kind = kind_of(data)
    if kind.no_test:  # never a test split: known without opening it
        raise ConfigError(
            f"--data {data} has no test split to evaluate on: {kind.no_test} (or use --data mnist)"
        )
    if checkpoint_dir:  # the flags' values first, then what they point at
        require_checkpoints(checkpoint_dir)
    else:
        _check_saved_model(saved_model)
    return config


def _check_saved_model(path: str) -> None:
    """ConfigError, one line, unless ``path`` is a folder this user can read holding
    saved_model.pb or version folders (0001, ...): plain Python, before TensorFlow loads."""
    fix = "pass models/NAME or models/NAME/0001"
    try:
        if not stat.S_ISDIR(os.stat(path).st_mode):
            raise ConfigError(f"no SavedModel at {path} (a file); {fix}")
        names = os.listdir(path)
    except FileNotFoundError:
        what = f"a link to nothing: {os.readlink(path)}" if os.path.islink(path) else "not there"
        raise ConfigError(f"no SavedModel at {path} ({what}); {fix}") from None
    except (OSError, ValueError) as e:  # a loop of links, a folder this user may not read
        raise ConfigError(
            f"--saved-model {path}: cannot read it "
            f"({(getattr(e, 'strerror', None) or str(e)).lower()}); {fix}"
        ) from None
    if "saved_model.pb" not in names and not any(
        parse_version(n) is not None and os.path.isdir(os.path.join(path, n)) for n in names
    ):
        raise ConfigError(
            f"no SavedModel at {path} (no saved_model.pb and no version folder); {fix}"
        )


def _saved_model_predict(path: Path):
    """(the version's path, predict(float32 batch in [0, 1]) -> probabilities, the signature's
    input shape per example, its outputs)."""
    import numpy as np
    import tensorflow as tf

    from mirrorfit.data.decode import _first_line
    from mirrorfit.artifacts.export import INPUT_NAME, OUTPUT_NAME, versions

    found = versions(path)
    if found:  # a base path: take the newest version, as TF Serving would (1 or 0001)
        path = min(p for p in path.iterdir() if p.is_dir() and parse_version(p.name) == found[-1])
    if not (path / "saved_model.pb").is_file():
        raise ConfigError(f"no SavedModel at {path}; pass models/NAME or models/NAME/0001")
    try:
        loaded = tf.saved_model.load(str(path))
    except Exception as e:  # a damaged or foreign file: TF raises many kinds
        raise ConfigError(
            f"{path} is not a readable SavedModel ({type(e).__name__}: "
            f"{_first_line(e)}); export it again with mirrorfit export"
        ) from None
    fn = loaded.signatures.get("serving_default")
    spec = None if fn is None else fn.structured_input_signature[1].get(INPUT_NAME)
    if spec is None or OUTPUT_NAME not in fn.structured_outputs:
        raise ConfigError(
            f"the SavedModel at {path} has no serving_default signature taking "
            f"'{INPUT_NAME}' and giving '{OUTPUT_NAME}' (what mirrorfit export gives the "
            "built-in models); a compiled --model's export takes its own inputs: evaluate "
            "its checkpoint, mirrorfit evaluate --checkpoint-dir DIR --model "
            "package.module:function"
        )
    out = fn.structured_outputs[OUTPUT_NAME]
    # Evaluate feeds a batch of float32 pixels in [0, 1] (uint8 when the model scales them
    # itself) and reads one row of probabilities per example: other signatures would fail
    # mid-run as an IndexError or a TensorFlow error.
    shape, name = spec.shape, f"its input '{INPUT_NAME}'"
    if shape.rank is None or shape.rank == 0:
        problem = f"{name} has {'unknown rank' if shape.rank is None else 'no batch axis'}"
    elif spec.dtype not in (tf.float32, tf.uint8):
        problem = f"{name} is {spec.dtype.name}, not float32 (or uint8)"
    elif shape[0] is not None:
        problem = f"{name} takes batches of exactly {shape[0]}, not any size"
    elif out.shape.rank is not None and out.shape.rank != 2:
        problem = f"its output '{OUTPUT_NAME}' has shape {out.shape}, not [batch, classes]"
    else:
        problem = None
    if problem:
        raise ConfigError(
            f"the SavedModel at {path} cannot be evaluated: {problem}; export it "
            "with mirrorfit export"
        )
    raw = spec.dtype == tf.uint8  # exported with --export-preprocessing: it scales itself

    def predict(x):
        # The pipeline scaled uint8 pixels to k/255 in float32; x * 255 rounds back to k.
        x = tf.cast(tf.round(x * np.float32(255)), tf.uint8) if raw else x
        try:
            return fn(**{INPUT_NAME: x})[OUTPUT_NAME].numpy()
        except tf.errors.OpError as e:  # a fixed batch size, say: the model's own limit
            raise ConfigError(
                f"the SavedModel at {path} failed on a batch of shape "
                f"{list(x.shape)} ({_first_line(e)}); export it with mirrorfit "
                "export"
            ) from None

    outputs = out.shape[-1] if out.shape.rank else None
    return path, predict, tuple(spec.shape[1:]), outputs


def evaluate_artifact(
    *,
    checkpoint_dir: str | None = None,
    saved_model: str | None = None,
    data: str = "mnist",
    data_dir: str | None = None,
    image_size: str | tuple[int, int] | None = None,
    batch_size: int = EVAL_BATCH,
    model: str | None = None,
) -> dict[str, Any]:
    """Accuracy and mean cross-entropy over every example of ``data``'s test split (a ``--data``
    value), ``batch_size`` examples at a time; ``model``: a checkpoint's user model spec (see
    ``load_model``). One-line DataError for no test split, another example shape, more classes
    than the model's outputs, or a label outside them.
    """
    config = check_evaluate_flags(
        checkpoint_dir=checkpoint_dir,
        saved_model=saved_model,
        data=data,
        data_dir=data_dir,
        image_size=image_size,
    )
    import numpy as np

    from mirrorfit.data.heldout import load_test
    from mirrorfit.data.file_errors import data_errors

    if checkpoint_dir:
        from keras import ops

        from mirrorfit.artifacts.checkpoint_model import load_model, position_of
        from mirrorfit.engine.jax import read_split_state

        net, meta = load_model(checkpoint_dir, read_split=read_split_state, model=model)
        source = f"{checkpoint_dir} ({position_of(meta)})"
        predict = lambda x: ops.convert_to_numpy(net(np.asarray(x), training=False))  # noqa: E731
        takes, outputs = _shapes_of(net, meta)
    else:
        path, predict, takes, outputs = _saved_model_predict(Path(saved_model))
        source = str(path)
    opened = load_test(
        config.data, batch=batch_size, data_dir=config.data_dir, image_size=config.image_size
    )
    _check_fits(opened, takes, outputs, source, data)
    note_test_alone(opened, outputs, data)
    picked, correct, seen = [], [], 0
    with data_errors(opened):  # an image that does not decode: one line naming the file
        for x, y in _batches(opened, data):
            y = y.numpy().astype(np.int64)
            _check_labels(y, outputs, seen, data)  # before the model runs on the batch
            probs = predict(x)
            _check_probs(probs, len(y), outputs, source)
            if outputs is None:  # a SavedModel of unknown width: known from its output
                _check_labels(y, probs.shape[-1], seen, data)
            picked.append(probs[np.arange(len(y)), y])
            correct.append(np.argmax(probs, 1) == y)
            seen += len(y)
    if not correct:
        raise DataError(f"--data {data}: its test split has no examples; give one that has")
    picked, correct = np.concatenate(picked), np.concatenate(correct)
    loss = float(np.mean(-np.log(np.clip(picked, 1e-7, 1.0))))
    return {
        "source": source,
        "data": opened.description,
        "examples": int(len(correct)),
        "test_accuracy": float(np.mean(correct)),
        "test_loss": loss,
    }


def _shapes_of(net, meta: dict) -> tuple[tuple, int | None]:
    """(one example's input shape, the outputs) of a checkpoint's model: its declared ones,
    or, for a model that declares none (subclassed), those meta.json records."""
    try:
        return tuple(net.inputs[0].shape[1:]), net.outputs[0].shape[-1]
    except (AttributeError, IndexError, TypeError, ValueError):
        shapes = meta.get("shapes") or {}
        return tuple(shapes["inputs"][0][1:]), shapes["outputs"][0][-1]


def _check_probs(probs, batch: int, outputs: int | None, source: str) -> None:
    """ConfigError unless the model at ``source`` gave one row of ``outputs`` probabilities per
    example (a SavedModel's signature may declare [batch, classes] and return another shape)."""
    if probs.ndim != 2 or probs.shape[0] != batch or outputs not in (None, probs.shape[1]):
        want = f"({batch}, {'classes' if outputs is None else outputs})"
        raise ConfigError(
            f"the model of {source} gave probabilities of shape {probs.shape} for "
            f"a batch of {batch} examples, not {want}; export it with mirrorfit "
            "export"
        )


def _check_labels(y, outputs: int | None, before: int, data: str) -> None:
    """DataError naming the first label of a batch that is negative or past the model's
    outputs (NumPy would index from the end with a negative one: a silent wrong score)."""
    if outputs is None:
        return
    bad = (y < 0) | (y >= outputs)
    if bad.any():
        at = int(bad.argmax())
        why = (
            "is negative"
            if y[at] < 0
            else (f"is past the model's {outputs} outputs (labels 0-{outputs - 1})")
        )
        raise DataError(
            f"--data {data}: test label {y[at]} (example {before + at}) {why}; "
            "evaluate on labels the model was trained with"
        )


def _batches(opened, data: str):
    """The test split's batches. What a user's dataset raises while it is read (its own code
    runs in it), or a file without read permission, is one line; a file that does not decode
    is left to ``data_errors``, which names it."""
    import tensorflow as tf

    from mirrorfit.data.decode import _first_line  # TensorFlow's reason, without its wrapping

    batches = iter(opened.test)
    while True:
        try:
            x, y = next(batches)
        except StopIteration:
            return
        except tf.errors.PermissionDeniedError as e:
            raise DataError(
                f"--data {data}: a file cannot be read ({_first_line(e)}); fix its permissions"
            ) from None
        except tf.errors.OpError as e:
            if opened.kind != "module":
                raise
            raise DataError(
                f"--data {data}: reading its test split failed ({_first_line(e)}); "
                "fix the dataset the function returns"
            ) from None
        yield x, y


def note_test_alone(opened, outputs: int | None, data: str) -> None:
    """Where a folder has ``test/`` alone and its class count differs from the model's
    ``outputs``: a note on stderr saying how its labels were numbered."""
    if opened.alone and outputs is not None and opened.num_classes != outputs:
        # Not an error (train --num-classes makes more outputs), but a test/ lacking a class
        # folder shifts the labels of the classes after it: say how labels were numbered.
        print(
            f"mirrorfit: note: --data {data} has test/ alone: its {opened.num_classes} class "
            f"folders are labels 0-{opened.num_classes - 1} by name, for a model of "
            f"{outputs} outputs; if it lacks one of training's classes, put train/ beside it",
            file=sys.stderr,
        )


def _check_fits(opened, takes: tuple, outputs: int | None, source: str, data: str) -> None:
    """DataError naming both shapes (or class counts) and the fix, unless the model at
    ``source`` takes ``opened``'s examples and has an output for each of its classes (more
    outputs than classes is what `mirrorfit train --num-classes` makes, and is accepted)."""
    have = tuple(opened.input_shape)
    if len(takes) != len(have) or any(t is not None and t != h for t, h in zip(takes, have)):
        shown = "x".join("?" if t is None else str(t) for t in takes)
        files = KINDS[opened.kind].files
        if (
            files
            and len(takes) == len(have) == 3
            and all(t in (None, h) for t, h in zip(takes[:2], have[:2]))
            and takes[2] is not None
        ):
            # Only the channels differ: --image-size resizes, it cannot change them.
            hint = (
                f"its images decode to {have[2]} channels, the model takes {takes[2]}; "
                "evaluate on images of that many channels (1: grayscale, 3: RGB)"
            )
        elif files:
            hint = "pass --image-size H,W as in training"
        else:
            hint = "evaluate on data of the shape it was trained on"
        raise DataError(
            f"--data {data} gives examples of shape {'x'.join(map(str, have))} but "
            f"the model of {source} takes {shown}; {hint}"
        )
    if outputs is None or opened.num_classes is None or opened.num_classes <= outputs:
        return
    if opened.kind == "folder":
        raise DataError(
            f"--data {data} has {opened.num_classes} class folders but the model of "
            f"{source} has {outputs} outputs, fewer; evaluate on a folder with the "
            "class folders it was trained on (label i is the i-th by name)"
        )
    raise DataError(
        f"--data {data} has {opened.num_classes} classes (labels 0-"
        f"{opened.num_classes - 1}) but the model of {source} has {outputs} "
        "outputs, fewer; evaluate on data with the classes it was trained on"
    )
