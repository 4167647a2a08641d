"""``mirrorfit train --model package.module:function`` with a compiled Keras model (or an
uncompiled one with ``--loss``), trained as compiled through ``mirrorfit.fit`` on the data as
given: MNIST's uint8 pixels and integer labels, a ``.npz``'s arrays (``x_train``, ``y_train``;
optional ``sample_weight_train``, ``x_val``/``y_val``, ``x_test``/``y_test``; ``x_train/NAME``
members make a dict of inputs, likewise targets), a ``--data`` function's splits as Keras's
``fit`` takes them, an image folder's or TFRecords' images decoded once into uint8 arrays
(in memory, or a memory map in ``--cache FOLDER``), or synthetic uint8 images of the model's
input shape. Flags only the built-in loop has are refused, one line each.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import math
import os
import sys
import time
from typing import Any

import numpy as np

from mirrorfit.config import TrainConfig
from mirrorfit.errors import ConfigError, MirrorfitError
from mirrorfit.models.shapes import classes_of, input_shape_of

# Settings that cannot reach a model the user compiled, why, and the way round.
_NOT_APPLIED = {
    "export_preprocessing": "the export takes the inputs as the model trained on them; put "
    "the scaling in the model (a keras.layers.Rescaling layer)",
}
# Settings of the optimizer mirrorfit builds, which a model's own compile() replaces.
_OPTIMIZER_FLAGS = ("optimizer", "lr", "lr_scaling", "base_batch", "warmup_epochs")


def built_in(config: TrainConfig) -> bool:
    """Whether ``--model`` is one of mirrorfit's (mlp, cnn, a keras.applications name)."""
    return ":" not in config.model


def as_built_in(config: TrainConfig, model) -> bool:
    """Whether ``model`` trains as mirrorfit's own models do: not compiled, and no ``--loss``
    (a built-in model, or a user's uncompiled one): sparse categorical crossentropy and
    accuracy, uint8 pixels scaled to float32 in [0, 1] inside the model (other inputs as
    given), saved and exported on [0, 1] images with the data's class names."""
    return not getattr(model, "compiled", False) and config.loss is None


def check(config: TrainConfig, engine, model) -> None:
    """One line for a flag this path cannot honour (before anything trains)."""
    if as_built_in(config, model) and not built_in(config):
        _check_probabilities(config, model)
    for name, why in _NOT_APPLIED.items():
        if _given(config, name) and not as_built_in(config, model):
            raise ConfigError(f"{_flag(name)} does not apply to a compiled --model: {why}")
    if config.cache is not None and not decoded_kind(config) and ":" not in (config.data or ""):
        raise ConfigError(
            f"--cache does not apply to a compiled --model with --data {config.data or 'mnist'}: "
            "the arrays reach the model as the source gives them, already in memory (it "
            "keeps an image folder's or TFRecords' decoded images, and a --data function's "
            "dataset of examples)"
        )
    from mirrorfit.fitting.metrics import overrides

    if config.profile and config.model_parallel > 1:
        raise ConfigError(
            "--profile with --model-parallel: the step is one program XLA partitions over "
            "the 2-D mesh, which the profile cannot time in parts; profile without "
            "--model-parallel, or time it with mirrorfit bench --model"
        )
    if config.profile and overrides(model, "train_step"):
        raise ConfigError(
            f"--profile: {type(model).__name__}'s own train_step is one piece, which the "
            "profile cannot time in parts; time the model with mirrorfit bench --model"
        )
    if getattr(model, "compiled", False) and _given(config, "warmup_epochs"):
        raise ConfigError(
            "--warmup-epochs does not apply to a compiled --model: its optimizer's learning "
            "rate is the compile's; give a schedule with a warm-up there (e.g. "
            "keras.optimizers.schedules.CosineDecay(..., warmup_target=, warmup_steps=))"
        )
    if config.xla and not engine.CAPABILITIES.compiles_every_step:
        unsupported = [layer.name for layer in model._flatten_layers() if not layer.supports_jit]
        if unsupported:
            raise ConfigError(
                f"--xla: the layer {unsupported[0]} of the model says XLA cannot compile it "
                "(supports_jit is False); drop --xla"
            )
    if config.strategy == "parameter-server" and config.profile:
        raise ConfigError(
            "--profile with --strategy parameter-server: the steps are scheduled on whichever "
            "worker is free, which the profile cannot time in parts; time the model with "
            "mirrorfit bench --model"
        )


def _check_probabilities(config: TrainConfig, model) -> None:
    """ConfigError where an uncompiled ``--model`` ends in a Dense or Activation layer without
    softmax (logits, say): the default loss takes probabilities, and would train it wrong
    without a word. (Other last layers are not known here: trained as they are.)"""
    import keras

    layers = getattr(model, "layers", None) or []
    last = layers[-1] if layers else None
    if not isinstance(last, (keras.layers.Dense, keras.layers.Activation)):
        return
    activation = getattr(last.activation, "__name__", str(last.activation))
    if activation != "softmax":
        raise ConfigError(
            f"--model {config.model}: its last layer {last.name!r} gives {activation} outputs, "
            "and an uncompiled model trains with sparse categorical crossentropy on "
            "probabilities; end it with a softmax, or compile it in its function (e.g. "
            "loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))"
        )


def _given(config: TrainConfig, name: str) -> bool:
    return getattr(config, name) != TrainConfig.__dataclass_fields__[name].default


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def compile_from_flags(config: TrainConfig, model, *, global_batch: int, examples: int) -> None:
    """``--loss`` and ``--metrics`` with the optimizer of ``--optimizer``, ``--lr``,
    ``--lr-scaling``/``--base-batch`` and ``--warmup-epochs`` (over ``examples`` per epoch in
    batches of ``global_batch``), for a model not compiled: as the built-in model's."""
    from mirrorfit.models.schedules import build_optimizer, learning_rate

    steps = -(-examples // global_batch)  # the partial last batch is a step too
    lr = learning_rate(
        config.lr,
        global_batch=global_batch,
        base_batch=config.base_batch,
        scaling=config.lr_scaling,
        warmup_steps=round(config.warmup_epochs * steps),
    )
    compile_uncompiled(config, model, build_optimizer(config.optimizer, lr))


def compile_uncompiled(config: TrainConfig, model, optimizer) -> None:
    """``--loss`` and ``--metrics`` with ``--optimizer``/``--lr`` for a model not compiled."""
    loss, metrics = config.loss, [m for m in (config.metrics or "").split(",") if m]
    if loss is None:  # as mirrorfit's own models train (as_built_in)
        loss, metrics = "sparse_categorical_crossentropy", ["accuracy"]
    try:
        model.compile(optimizer=optimizer, loss=loss, metrics=metrics)
    except (ValueError, TypeError) as e:
        raise ConfigError(
            f"--loss {config.loss} / --metrics {config.metrics}: Keras refused "
            f"them ({str(e).strip().splitlines()[0][:200]})"
        ) from None


def describe(config: TrainConfig, model, compiled: bool) -> str:
    """What trains, for the start screen: ``loss: mse (the model's compile), ...``."""
    import keras

    from mirrorfit.models.schedules import LinearWarmup

    opt = model.optimizer
    lr = opt.learning_rate
    rate = f"{float(keras.ops.convert_to_numpy(lr)):g}" if not callable(lr) else "a schedule"
    schedule = getattr(opt, "_learning_rate", None)
    if isinstance(schedule, LinearWarmup):
        rate = (
            f"{schedule.initial_lr:g} -> {schedule.target_lr:g} over "
            f"{schedule.warmup_steps} warm-up steps"
        )
    loss = model.loss
    names = (
        ", ".join(f"{k}: {_name(v)}" for k, v in loss.items())
        if isinstance(loss, dict)
        else ", ".join(map(_name, loss))
        if isinstance(loss, (list, tuple))
        else _name(loss)
    )
    metrics = (
        [_name(m) for m in (model._compile_metrics._user_metrics or [])]
        if getattr(model, "_compile_metrics", None) is not None
        else []
    )
    if loss is None:  # compiled without a loss: the model's own add_loss trains it
        names = "none, the model's add_loss"
    where = "the model's compile" if compiled else "--loss"
    if not compiled and config.loss is None:
        where = f"{config.model}'s" if built_in(config) else "the default; --loss chooses"
    kind = type(opt).__name__
    inner = getattr(opt, "inner_optimizer", None)  # fp16: Keras wraps the compiled one
    if inner is not None:
        kind, rate = type(inner).__name__, f"{rate} with fp16 loss scaling"
    line = (
        f"loss: {names} ({where}), optimizer: {kind} {rate}, "
        f"metrics: {', '.join(map(str, _flat(metrics))) or 'none'}"
    )
    if compiled:
        given = [_flag(n) for n in ("loss", "metrics", *_OPTIMIZER_FLAGS) if _given(config, n)]
        if given:
            line += f"; the compile wins over {', '.join(given)}"
    return line


def batch_line(config: TrainConfig, replicas: int, *, own: bool = False) -> str:
    """``batch: 16 per replica x 2 replicas x 4 accumulation steps = 128 global
    (effective), 10 steps per execution``, as the start screen says it; ``own``: the data's
    own batches (a dataset batched by a --data function)."""
    if own:
        return (
            f"batch: the --data dataset's own batches, split over {replicas} replicas, "
            f"{config.steps_per_execution} steps per execution"
        )
    per_replica, global_batch = config.batch_sizes(replicas)
    accum = f" x {config.accum_steps} accumulation steps" if config.accum_steps > 1 else ""
    return (
        f"batch: {per_replica} per replica x {replicas} replicas{accum} = {global_batch} "
        f"global (effective), {config.steps_per_execution} steps per execution"
    )


def precision_line(config: TrainConfig, model, recomputed: list[str]) -> str:
    """``precision: bf16, XLA: on`` (and remat), as the start screen says it."""
    from mirrorfit.engine import backends

    if backends.capabilities(config.backend).compiles_every_step:
        xla = "on (every step, JAX)"
    else:  # the model's compile (jit_compile=True) or --xla
        xla = "on" if getattr(model, "jit_compile", False) is True else "off"
    remat = f", rematerialisation on ({len(recomputed)} layers)" if recomputed else ""
    return f"precision: {config.precision}, XLA: {xla}{remat}"


def _name(thing) -> str:
    return (
        thing
        if isinstance(thing, str)
        else getattr(thing, "name", None) or getattr(thing, "__name__", type(thing).__name__)
    )


def _flat(values):
    from keras import tree

    return [_name(v) for v in tree.flatten(values)]


def user_callbacks(spec: str | None) -> list:
    """``--callbacks package.module:function``: the list it returns."""
    if not spec:
        return []
    module_name, _, attr = spec.partition(":")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (Exception, SystemExit) as e:
        raise ConfigError(
            f"--callbacks {spec}: cannot import it ({type(e).__name__}: {str(e)[:200]})"
        ) from None
    try:
        callbacks = fn()
    except Exception as e:
        raise ConfigError(
            f"--callbacks {spec}: the function raised {type(e).__name__}: {str(e)[:200]}"
        ) from None
    if not isinstance(callbacks, (list, tuple)):
        raise ConfigError(
            f"--callbacks {spec} returned {type(callbacks).__name__}; return a "
            "list of keras.callbacks.Callback"
        )
    return list(callbacks)


def decoded_kind(config: TrainConfig) -> str | None:
    """The kind of ``--data`` when mirrorfit's readers make its arrays (an image folder,
    TFRecords, synthetic images), else None."""
    from mirrorfit.data.spec import kind_of

    kind = kind_of(config.data or "mnist").name
    return kind if kind in ("folder", "tfrecord", "synthetic") else None


def splits(
    config: TrainConfig,
    model=None,
    global_batch: int = 1,
    eval_batch: int | None = None,
    returned: dict | None = None,
) -> dict[str, Any]:
    """``{"train": (x, y[, w]), "val": ..., "test": ...}`` as the data hold them (a --data
    function's as it ``returned`` them where it was called already); a --data
    function's dataset of single examples in batches of ``global_batch`` (``eval_batch``
    for val and test, default ``global_batch``)."""
    eval_batch = eval_batch or global_batch
    data = config.data or "mnist"
    if decoded_kind(config) == "synthetic":
        return _held_out(config, decoded_splits(config, model, global_batch))
    if decoded_kind(config):  # the reader held out --validation-split's examples
        return decoded_splits(config, model, global_batch)
    if data == "mnist":
        from mirrorfit.data.mnist import VALIDATION_SIZE, locate_mnist

        with np.load(locate_mnist(config.data_dir)) as f:
            x, y = f["x_train"], f["y_train"]
            return {
                "train": (x[VALIDATION_SIZE:], y[VALIDATION_SIZE:]),
                "val": (x[:VALIDATION_SIZE], y[:VALIDATION_SIZE]),
                "test": (f["x_test"], f["y_test"]),
            }
    if data.endswith(".npz"):
        return checked_splits(data, model, _held_out(config, npz_splits(data)))
    if ":" in data:
        from mirrorfit.data.user import call_user_function

        found = dict(returned) if returned is not None else call_user_function(data, check=())
        batches = {"train": global_batch, "val": eval_batch, "test": eval_batch}
        own = tuple(k for k, v in found.items() if k in batches and _in_batches(v, model))
        found = _held_out(config, found, own="train" in own)
        if "train" in found:
            found["train"] = _examples_kept(config, found["train"], own="train" in own)
        found = {
            k: _batched(v, batches[k], model, shuffle_seed=config.seed if k == "train" else None)
            for k, v in found.items()
        }
        return {**checked_splits(data, model, found), "own_batches": own}
    raise ConfigError(  # kind_of named every other kind: not reached
        f"--data {data}: give mnist, FILE.npz, an image FOLDER, 'train-*.tfrecord', "
        "synthetic or package.module:function"
    )


def decoded_splits(config: TrainConfig, model, global_batch: int) -> dict[str, Any]:
    """An image folder's or TFRecords' splits as uint8 pixel arrays and int32 labels, decoded
    once (in memory, or a memory map in ``--cache FOLDER``; after --train-examples and
    --validation-split, as the built-in loop takes them), or ``synthetic``: random uint8
    images of the model's input shape (or --input-shape) and labels of its classes."""
    from mirrorfit.data.sources import load_data
    from mirrorfit.job.data import source

    synthetic = decoded_kind(config) == "synthetic"
    if not synthetic:
        check_one_input(config, model)
    opened = load_data(
        config.data,
        global_batch=global_batch,
        **{
            **source(config),
            "cache": config.cache or "memory",
            # synthetic images take the model's shape and classes; files bring their own
            "input_shape": config.input_shape or (input_shape_of(model) if synthetic else None),
            "num_classes": config.num_classes or (classes_of(model) if synthetic else None),
        },
        raw=True,
        on_shape=None if synthetic else functools.partial(check_takes, config, model),
    )
    train = opened.train
    if opened.kind == "synthetic":  # --train-examples of them, exactly
        from mirrorfit.data.synthetic import SYNTHETIC_STEPS

        examples = config.train_examples or SYNTHETIC_STEPS * global_batch
        return {"train": train.arrays(examples, split=0), "description": opened.description}
    out = {
        "train": (train.store, train.labels),
        "description": opened.description,
        "class_names": opened.class_names,
    }
    for name in ("val", "test"):
        batches = getattr(opened, name)
        if batches is not None:
            pairs = list(batches.as_numpy_iterator())
            out[name] = tuple(np.concatenate([p[i] for p in pairs]) for i in (0, 1))
    return out


def check_one_input(config: TrainConfig, model) -> None:
    """ConfigError unless ``model`` takes one input: images and their labels are all an image
    folder or TFRecords give."""
    inputs = getattr(model, "inputs", None) or []
    if len(inputs) > 1:
        raise ConfigError(
            f"--data {config.data} gives one image per example; the --model takes "
            f"{len(inputs)} inputs: give the inputs as an .npz (x_train/NAME members) or "
            "a --data function, or a model of one input"
        )


def check_takes(config: TrainConfig, model, shape: tuple[int, ...]) -> None:
    """ConfigError, naming the fix, where the model's declared input is not the images'
    (height, width, channels) once decoded."""
    want, shape = input_shape_of(model), tuple(shape)
    if want is None or want == shape:
        return
    fixes = []
    if math.prod(want) == math.prod(shape):  # the same values in another layout
        fixes.append(
            f"take keras.Input({shape}) in the model, then keras.layers.Reshape({want}) "
            "(or Flatten)"
        )
    else:
        if len(want) == 3 and want[:2] != shape[:2]:
            fixes.append(f"--image-size {want[0]},{want[1]} resizes the images")
        if len(want) != 3 or want[2] != shape[2]:
            fixes.append(
                f"they decode to {shape[2]} channel(s): give images of the model's channels, "
                "or a model built for theirs"
            )
    raise ConfigError(
        f"the --model takes examples of shape {want}; --data {config.data}'s images are "
        f"{tuple(shape)}: " + "; ".join(fixes)
    )


def npz_splits(path: str, *, train: bool = True) -> dict[str, Any]:
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {k: f[k] for k in f.files}
    except (OSError, ValueError, EOFError) as e:
        raise ConfigError(
            f"--data {path} is not a readable npz file ({type(e).__name__}: "
            f"{str(e)[:200]}); save it with numpy.savez"
        ) from None
    out = {}
    for split in ("train", "val", "test"):
        parts = [_member(arrays, f"{kind}_{split}") for kind in ("x", "y", "sample_weight")]
        if parts[0] is None:
            lone = [f"{kind}_{split}" for kind, p in zip(("y", "sample_weight"), parts[1:]) if p]
            if lone:  # not silently left out
                raise ConfigError(
                    f"--data {path} has {lone[0]} but no x_{split}; add x_{split}, or "
                    f"remove {lone[0]}"
                )
            continue
        out[split] = tuple(parts)  # (x, y, sample_weight), None where absent
    if train and "train" not in out:
        raise ConfigError(f"--data {path} has no x_train (or x_train/NAME members)")
    return out


def checked_splits(data: str, model, out: dict) -> dict:
    """``out``, where every split of arrays can feed ``model``: numbers, one row per example
    in each of its arrays, targets where its compiled loss needs them; else ConfigError
    naming the split, before anything trains (the test split was read after training)."""
    from mirrorfit.errors import FitError
    from mirrorfit.fitting.batches import check_arrays, check_targets_given

    for name in ("train", "val", "test"):
        part = out.get(name)
        if not isinstance(part, tuple):
            continue
        x, y, w = (*part, None, None)[:3]
        try:
            check_arrays(x, y, w)
            if model is not None and getattr(model, "compiled", False):
                check_targets_given(model, x, y)
            elif model is not None and y is None:  # to be compiled with --loss, which needs y
                raise FitError("no labels (y), which --loss needs; give them")
        except FitError as e:
            said = str(e).replace("y=None, but", "no labels (y), but")
            raise ConfigError(f"--data {data}, its {name} split: {said}") from None
    return out


def _examples_kept(config: TrainConfig, train, *, own: bool):
    """A --data function's training dataset of single examples after ``--train-examples``
    (its first N) and ``--cache`` (tf.data's, in memory or files in the folder, named for
    the function, the count and the examples' spec), as the built-in loop reads one. Arrays
    and a dataset in the function's own batches are returned as they are (--cache and, for
    the batches, --train-examples refused: they are in memory, or not examples)."""
    if not _dataset(train):
        if config.cache is not None:
            raise ConfigError(
                f"--cache keeps a dataset's examples; --data {config.data} returns arrays, "
                "which are in memory already: drop --cache"
            )
        return train  # --train-examples: the first N of them (_first)
    if own and (config.cache is not None or config.train_examples is not None):
        flag = "--cache" if config.cache is not None else "--train-examples"
        raise ConfigError(
            f"{flag} applies to a dataset of single examples; --data {config.data} returns "
            f"its training split in batches: {'cache' if flag == '--cache' else 'take'} them "
            "in the function instead"
        )
    count = int(train.cardinality())  # < 0: unknown (a filter, a generator)
    if config.train_examples is not None:
        if 0 <= count < config.train_examples:
            raise ConfigError(
                f"--train-examples {config.train_examples} is more than the {count} "
                f"training examples of --data {config.data}"
            )
        train, count = train.take(config.train_examples), config.train_examples
    if config.cache == "memory":
        return train.cache()
    if config.cache is not None:
        from pathlib import Path

        from mirrorfit.data.user import dataset_fingerprint

        Path(config.cache).mkdir(parents=True, exist_ok=True)
        name = f"mirrorfit-{dataset_fingerprint(config.data, train, count)}"
        return train.cache(str(Path(config.cache) / name))
    return train


def _batched(split, batch: int, model, *, shuffle_seed: int | None = None):
    """``split``, a dataset of single examples (docs/data.md: what a --data function returns)
    in batches of ``batch`` (the training split first through a 10,000-example shuffle
    buffer seeded with ``shuffle_seed``, reshuffled each epoch); one already in batches, and
    arrays, as they are."""
    if not _dataset(split) or _in_batches(split, model):
        return split  # batched by the function, as Keras's fit takes a dataset
    if shuffle_seed is not None:
        split = split.shuffle(10_000, seed=shuffle_seed, reshuffle_each_iteration=True)
    return split.batch(batch)


def _dataset(split) -> bool:
    """Whether ``split`` is a tf.data dataset (read without importing TensorFlow)."""
    return getattr(split, "element_spec", None) is not None


def _in_batches(split, model=None) -> bool:
    """Whether ``split`` is a dataset of batches, not of single examples: its inputs have
    the rank of the model's declared inputs (a batch axis first); else, for a model that
    declares none, single examples where the labels are scalars, batches where every
    component's first axis is unknown (as ``.batch()`` leaves it). A rank it does not know is
    taken as batches: Keras's fit takes a dataset so."""
    spec = getattr(split, "element_spec", None)
    if spec is None:
        return False
    from keras import tree

    x, y = (spec[0], spec[1]) if isinstance(spec, tuple) and len(spec) > 1 else (spec, None)
    xs = tree.flatten(x)
    inputs = getattr(model, "inputs", None) or []
    if xs and len(inputs) == len(xs):  # the model declares its inputs: compare their ranks
        rank = xs[0].shape.rank
        return rank is None or rank >= len(inputs[0].shape)
    if xs and xs[0].shape.rank is None:
        return True
    if y is not None and not isinstance(y, (tuple, list, dict)) and xs:
        if y.shape.rank == 0:
            return False  # one scalar label: single examples (a batch's labels have an axis)
        if y.shape.rank == 1 and xs[0].shape.rank and xs[0].shape[0] == y.shape[0]:
            return True  # sparse labels beside their inputs, one per row: a batch
    shapes = [s.shape for s in tree.flatten(spec)]
    return bool(shapes) and all(s.rank is None or (s.rank and s[0] is None) for s in shapes)


def _pixels(split) -> bool:
    """Whether a training split's inputs are uint8 pixels (arrays, or a dataset of them)."""
    spec = getattr(split, "element_spec", None)
    if isinstance(spec, tuple):
        return getattr(spec[0], "dtype", None) == "uint8"
    x = split[0] if isinstance(split, tuple) and split else None
    return isinstance(x, np.ndarray) and x.dtype == np.uint8


def _taking_pixels(config: TrainConfig, model, shape: tuple):
    """``model`` behind models.build.taking_pixels; ConfigError for one that cannot take one
    array of images so (several inputs, a ``call`` of other arguments)."""
    from mirrorfit.models.build import taking_pixels

    inputs = getattr(model, "_inputs_struct", None)
    if isinstance(inputs, (list, tuple, dict)) and len(inputs) != 1:
        raise ConfigError(
            f"--model {config.model} takes {len(inputs)} inputs, and the data one array of "
            "images; give it one input, or compile it in its function and give --data a "
            "function returning one array per input"
        )
    import keras

    flat = getattr(model, "_flatten_layers", lambda: [])()
    own = [layer.name for layer in flat if isinstance(layer, keras.layers.Rescaling)]
    if own:  # it would scale the [0, 1] images again: trained on [0, 1/255], without a word
        raise ConfigError(
            f"--model {config.model} scales its inputs itself (its Rescaling layer "
            f"{own[0]!r}), and an uncompiled model is given the pixels scaled to [0, 1]: drop "
            "the layer, or compile the model in its function (it then takes the uint8 pixels "
            "as they are)"
        )
    try:
        return taking_pixels(model, shape)
    except (TypeError, ValueError) as e:
        raise ConfigError(
            f"--model {config.model} cannot be called on one array of images "
            f"({type(e).__name__}: {str(e).strip().splitlines()[0][:160]}); give it a "
            "call(self, inputs, training=None), or compile it in its function"
        ) from None


def _example_shape(split) -> tuple:
    """The shape of one example of a training split's inputs (arrays, or a dataset)."""
    spec = getattr(split, "element_spec", None)
    if isinstance(spec, tuple):
        return tuple(spec[0].shape[1:])
    return tuple(split[0].shape[1:])


def _check_one_kind(config: TrainConfig, data: dict) -> None:
    """ConfigError where a built-in model's validation or test images are uint8 pixels and
    its training images are not, or the other way round: one model takes both, scaled in it
    (uint8) or as given (any other type), so one kind would be scored on the wrong scale."""
    pixels = _pixels(data["train"])
    for name in ("val", "test"):
        split = data.get(name)
        if split is not None and _pixels(split) != pixels:
            kinds = ("uint8 pixels", "not uint8")
            raise ConfigError(
                f"--data {config.data}: the training images are {kinds[not pixels]} and the "
                f"{name} images {kinds[pixels]}; the model scales uint8 pixels to [0, 1] and "
                "takes other numbers as they are: give every split the same dtype"
            )


def _loss_scaled(model) -> bool:
    """Whether ``model`` trains with fp16's loss scaling (Keras's LossScaleOptimizer)."""
    return getattr(getattr(model, "optimizer", None), "inner_optimizer", None) is not None


def _member(arrays: dict, key: str):
    if key in arrays:
        return arrays[key]
    named = {k[len(key) + 1 :]: v for k, v in arrays.items() if k.startswith(key + "/")}
    return named or None


def run(
    config: TrainConfig,
    console,
    model,
    *,
    compiled: bool,
    scope,
    guard,
    clock,
    returned: dict | None = None,
) -> dict[str, Any]:
    """Train ``model`` as compiled on ``config``'s data (compiled here from the flags when
    ``compiled`` is False, in ``scope()``); print and return the summary. ``guard``: the job's
    PreemptionGuard, checked before the export commits."""
    from mirrorfit.fitting.loop import input_wait_s, runner_of
    from mirrorfit.job import fit_summary
    from mirrorfit.job.fit_summary import state_fields
    from mirrorfit.job.fit_summary import epoch_record
    from mirrorfit.job.observe import CpuGpuSampler
    from mirrorfit.job.steady_rate import steady_rate

    _, global_batch = config.batch_sizes(_replicas(model))
    data = splits(config, model, global_batch, config.eval_batch_size, returned)
    default = as_built_in(config, model)
    if default:
        _check_one_kind(config, data)  # before one kind is taken for all
    if default and _pixels(data["train"]):
        from mirrorfit.models.precision import as_precision

        # uint8 pixels scaled in the model: no float32 copy of the data. Built in the run's
        # precision as its model was: Keras's compile gives a mixed_float16 model its loss
        # scaling.
        with scope(), as_precision(config.precision).building():
            model = _taking_pixels(config, model, _example_shape(data["train"]))
        model.mirrorfit_pixels = True  # its checkpoints say so: export and evaluate unwrap it
    train, val, test = data["train"], data.get("val"), data.get("test")
    if "description" in data and not built_in(config):  # a built-in's first line says it
        console.print(f"data: {data['description']}")
    decoded = decoded_kind(config)  # its reader took --train-examples (and a file's split)
    if config.train_examples is not None and not decoded and not _dataset(train):
        train = _first(train, config.train_examples)  # a dataset's were taken (splits)
    if not compiled:
        with scope():
            compile_from_flags(
                config,
                model,
                global_batch=global_batch,
                examples=_examples(train, config),
            )
    recomputed = _accelerate(config, model, console)
    console.print(describe(config, model, compiled))
    own = "train" in data.get("own_batches", ())  # batched by the --data function
    console.print(batch_line(config, _replicas(model), own=own))
    console.print(precision_line(config, model, recomputed))
    clock.lap("data")
    examples = _examples(train, config)
    rate = steady_rate(examples, global_batch)
    # Keras's bar where it redraws in place; elsewhere (CI, | tee, a log) a line per epoch
    # (Keras draws it on stdout, the lines go to stderr: both must be a terminal)
    bar = config.progress and (
        console.is_jupyter or (console.is_interactive and sys.stdout.isatty())
    )
    fp16 = _loss_scaled(model)
    record = epoch_record(
        console, config.epochs, lines=not bar, fp16=fp16, examples=examples, batch=global_batch
    )
    callbacks = [state_shown(console), rate, record, *user_callbacks(config.callbacks)]
    if config.logdir:
        callbacks.append(scalars(config.logdir if _chief() else None, global_batch, record))
    kwargs = {}
    if isinstance(train, tuple):
        kwargs.update(
            x=train[0],
            y=train[1] if len(train) > 1 else None,
            sample_weight=train[2] if len(train) > 2 else None,
        )
    else:
        kwargs["x"] = train
    start = time.perf_counter()
    eval_batch = config.eval_batch_size or global_batch
    usage = CpuGpuSampler() if config.profile else contextlib.nullcontext()
    from mirrorfit.artifacts.checkpoint_meta import settings_of

    # its checkpoints record the flags, and a resume with one changed is refused by its name:
    # also at an epoch's end (where Keras's BackupAndRestore goes on), as the rest of the run
    # would take other batches, examples or orders than the run that was stopped (files that
    # changed on disk are read as they are now, as Keras's fit takes new data between epochs)
    model.mirrorfit_settings = {
        **settings_of(config),
        "--global-batch-size": global_batch,  # replicas x batch x accumulation steps
        "--train-examples": config.train_examples,
        "--seed": config.seed,
    }
    if default:  # its checkpoints say so, and keep the class names for export
        if built_in(config):
            model.mirrorfit_built_in = config.model  # as given: ResNet50 is named resnet50
        else:
            model.mirrorfit_default_compile = True
        if data.get("class_names"):
            model.class_names = list(data["class_names"])
    guard.fitting(workers=_workers())  # fit saves on a signal itself, from here on
    from mirrorfit.job.observe import out_of_memory_hint

    per_replica = global_batch // _replicas(model)
    with _said(console), usage, out_of_memory_hint(per_replica):  # OOM: one line, what to try
        history = _fit(config, model, global_batch, eval_batch, callbacks, val, kwargs, bar)
    wall = time.perf_counter() - start
    guard.trained(config.checkpoint_dir)  # a signal now stops at the next check, said so
    clock.lap("fit")
    clock.timings.update(rate.phases())  # where the fit's time went
    fields = {
        "wall_time_s": wall,
        "train_examples": examples or None,  # None: a dataset of unknown length
        "train_examples_per_sec": rate.rate(),  # steady: the first call's compile left out
        "xla": bool(getattr(runner_of(model), "jit_compile", True)),  # JAX: every step
        "remat_layers": recomputed,
        **state_fields(runner_of(model), config.shard),
    }
    if record.train_s:  # the share of training time the loop waited for its input
        fields["input_wait_share"] = min(1.0, input_wait_s(model) / record.train_s)
    if "description" in data:
        fields["description"] = data["description"]
    if test is not None:
        t0 = time.perf_counter()
        fields["test"] = _evaluate(model, test, eval_batch)
        fields["test_eval_time_s"] = time.perf_counter() - t0
        fields["test_examples"] = _rows(test)
        guard.check_local()
    summary = fit_summary.summary(
        config,
        model,
        history,
        steps_before=record.steps_before,
        skipped=record.skipped(model) if fp16 else 0,
        **fields,
    )
    console.print(fit_summary.done_line(summary))
    if config.profile:
        waited = input_wait_s(model) / max(1, summary["steps_this_run"])
        report = _profile(config, model, kwargs, global_batch, rate.rate(), waited, usage)
        summary["profile"] = report.as_dict()
        console.print(report.describe())
    chief = _chief()  # several workers: the chief writes
    if config.save_keras and chief:
        from mirrorfit.artifacts.finite import refuse_non_finite
        from mirrorfit.artifacts.keras_file import save_keras

        refuse_non_finite(model, "the trained model", allow=config.allow_nan)
        # as the built-in models' file: atomic, durable, TensorFlow's start-up lines filtered;
        # a built-in model's takes [0, 1] images, as its export does, whatever it trained on
        kept = _plain_built_in(config, model) if default else model
        save_keras(kept, config.save_keras, before_commit=guard.check_local)
        console.print(f"saved {config.save_keras}")
    if config.export_dir and chief:
        from mirrorfit.artifacts.export import export_keras_model
        from mirrorfit.artifacts.finite import refuse_non_finite

        refuse_non_finite(model, "the trained model", allow=config.allow_nan)
        if default:  # the signature TF Serving clients of mirrorfit's models know
            path = _export_built_in(config, model, data.get("class_names"), guard)
        else:
            path = export_keras_model(model, config.export_dir, before_commit=guard.check_local)
        summary["export_path"] = str(path)
        console.print(f"exported SavedModel version {path}")
    clock.lap("test_and_outputs")
    summary["timings_s"] = clock.timings
    if config.metrics_out and chief:
        from mirrorfit._io import write_json_atomic

        write_json_atomic(config.metrics_out, summary)
    return summary


def _plain_built_in(config: TrainConfig, model):
    """A copy of a model trained as mirrorfit's own are (:func:`as_built_in`), built outside
    the strategy (an export or a .keras file loads with none), on float32 images in [0, 1],
    with ``model``'s trained weights."""
    from mirrorfit.models.build import inner_model, model_factory

    shape = input_shape_of(model)
    plain = model_factory(config.model, input_shape=shape, num_classes=classes_of(model))()
    if not plain.built:  # a subclassed model: built by a call, as it was by its first batch
        plain(np.zeros((1, *shape), "float32"))
    trained = inner_model(model) if getattr(model, "mirrorfit_pixels", False) else model
    plain.set_weights(trained.get_weights())
    return plain


def _export_built_in(config: TrainConfig, model, class_names, guard):
    """A built-in model's SavedModel: float32 images in [0, 1], or raw uint8 pixels with
    --export-preprocessing; class names where the data has them. Written from a copy built
    outside the strategy (an export loads with none)."""
    from mirrorfit.artifacts.export import export_saved_model

    from mirrorfit.models.build import with_inputs

    return export_saved_model(
        with_inputs(_plain_built_in(config, model), input_shape_of(model)),
        config.export_dir,
        preprocessing=config.export_preprocessing,
        class_names=class_names,
        before_commit=guard.check_local,
    )


def _profile(config: TrainConfig, model, data: dict, global_batch: int, steady, waited, usage):
    """--profile: where a step's time went (fitting/profile.py), as the built-in loop's
    report's fields; ``steady``: the run's steady examples/s (None: unknown), ``waited``:
    seconds per step the loop waited for its input, ``usage``: its CPU/GPU sampler."""
    from mirrorfit.fitting.loop import runner_of
    from mirrorfit.fitting.profile import time_parts
    from mirrorfit.job.profile_report import ProfileReport

    arrays = {k: data.get(k) for k in ("x", "y", "sample_weight")}
    parts = time_parts(
        model,
        **arrays,
        batch_size=global_batch,
        steps_per_execution=config.steps_per_execution,
        accum_steps=config.accum_steps,
    )
    step_s = global_batch / steady if steady else parts["step_s"]
    # the wait the loop measured (not all the step's time beyond the cached one: the loop's
    # own per-call work, callbacks included, is overhead)
    wait = min(waited, max(0.0, step_s - parts["step_s"]))
    sampled = usage.summary()
    report = ProfileReport(
        step_s=step_s,
        input_wait_s=wait,
        compute_s=parts["compute_s"],
        all_reduce_s=parts["all_reduce_s"],
        update_overhead_s=max(0.0, step_s - wait - parts["compute_s"] - parts["all_reduce_s"]),
        input_batch_s=parts["input_batch_s"],
        cpu_percent=sampled.get("cpu_percent"),
        gpu_percent=sampled.get("gpu_percent"),
        precision=config.precision,
        xla=bool(getattr(runner_of(model), "jit_compile", True)),
        input_source="arrays in memory",
    )
    return report


def _evaluate(model, test, batch: int) -> dict[str, float]:
    """The compile's figures over the test split, by name."""
    import mirrorfit

    x, y, w = (*test, None, None)[:3] if isinstance(test, tuple) else (test, None, None)
    return mirrorfit.evaluate(
        model,
        x,
        y,
        sample_weight=w,
        batch_size=None if _dataset(x) else batch,
        verbose=0,
        return_dict=True,
    )


def _rows(split) -> int | None:
    """Examples in a split of arrays (None: a dataset)."""
    from keras import tree

    if not isinstance(split, tuple):
        return None
    return int(len(tree.flatten(split[0])[0]))


def _fit(config: TrainConfig, model, global_batch: int, eval_batch: int, callbacks, val, data, bar):
    """``mirrorfit.fit`` with the flags' settings; Keras's History."""
    from mirrorfit.fitting.loop import fit

    return fit(
        model,
        # a dataset comes in its own order (Keras's fit warns that it ignores shuffle=True)
        shuffle=not _dataset(data["x"]),
        # a dataset batched by the --data function: its own batches, as Keras's fit
        # every dataset reaching fit is in batches (a function's single examples were
        # batched by splits()): its own, as Keras's fit takes them
        batch_size=None if _dataset(data["x"]) else global_batch,
        validation_batch_size=None if _dataset(val) else eval_batch,
        epochs=config.epochs,
        verbose=1 if bar else 0,
        callbacks=callbacks,
        validation_data=val,
        steps_per_execution=config.steps_per_execution,
        accum_steps=config.accum_steps,
        checkpoint_dir=config.checkpoint_dir,
        checkpoint_every=config.checkpoint_every,
        keep_checkpoints=config.keep_checkpoints,
        fresh=config.fresh,
        allow_nan=config.allow_nan,
        **data,
    )


@contextlib.contextmanager
def _said(console):
    """``mirrorfit.fit``'s notes (where it resumed: ``mirrorfit.fit`` logs them at INFO) on the
    start screen, while it runs, and its warnings (a Python API's) as one line each."""
    import logging
    import warnings

    from mirrorfit.job.preemption import Preempted

    class Said(logging.Handler):
        def emit(self, record):
            console.print(record.getMessage(), markup=False, highlight=False)

    shown = warnings.showwarning

    def one_line(message, category, filename, lineno, file=None, line=None):
        if f"{os.sep}mirrorfit{os.sep}" not in str(filename):  # a library's: as Python shows it
            return shown(message, category, filename, lineno, file, line)
        # ours: the sentence alone, not the file, line and source Python adds for an API
        console.print(f"warning: {_flag_words(str(message))}", markup=False, highlight=False)

    log, handler = logging.getLogger("mirrorfit.fit"), Said(logging.INFO)
    level, propagate = log.level, log.propagate
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False  # said once: not again by a root handler a library set up
    warnings.showwarning = one_line
    try:
        yield
    except Preempted as e:  # fit's line names its arguments; the CLI's names the flags
        raise Preempted(e.signal_name, e.path, None, None, text=_flag_words(str(e))) from None
    except MirrorfitError as e:
        e.args = (_flag_words(str(e)), *e.args[1:])
        raise
    finally:
        warnings.showwarning = shown
        log.removeHandler(handler)
        log.setLevel(level)
        log.propagate = propagate


# mirrorfit.fit's words for its arguments, as mirrorfit train's flags (in this order)
_FLAG_WORDS = (
    ("rerun with the same checkpoint_dir", "rerun the same command"),
    ("give another checkpoint_dir", "pass --fresh (or give another --checkpoint-dir)"),
    ("fresh=True (--fresh)", "--fresh"),
    ("fresh=True", "--fresh"),
    ("allow_nan=True (--allow-nan)", "--allow-nan"),
    ("allow_nan=True", "--allow-nan"),
    ("checkpoint_dir=", "--checkpoint-dir "),
    ("checkpoint_dir", "--checkpoint-dir"),
    ("checkpoint_every=", "--checkpoint-every "),
    ("steps_per_execution=", "--steps-per-execution "),
)


def _flag_words(line: str) -> str:
    for api, flag in _FLAG_WORDS:
        line = line.replace(api, flag)
    return line


def _accelerate(config: TrainConfig, model, console) -> list[str]:
    """--remat (the qualifying layers recompute their activations: their names returned) and
    --xla (TensorFlow: each replica's forward and backward pass compiled; JAX compiles every
    step) on the model."""
    recomputed = []
    if config.remat:
        from mirrorfit.models.remat import rematerialize

        recomputed = rematerialize(model, lambda msg: console.print(f"[yellow]{msg}[/]"))
    if config.xla:  # what mirrorfit.fit compiles with, as Keras's fit does (JAX: always)
        model.jit_compile = True
    return recomputed


def _examples(train, config: TrainConfig) -> int:
    """Examples per epoch of the training split (arrays, a dict of them); 0 for a dataset (a
    warm-up over one is refused: its length is unknown here)."""
    from keras import tree

    if not isinstance(train, tuple):
        if config.warmup_epochs:
            raise ConfigError(
                "--warmup-epochs counts the steps of an epoch of arrays; the --data function "
                "returns a dataset: compile the model with a warm-up schedule instead"
            )
        return 0
    return len(tree.flatten(train[0])[0])


def _held_out(config: TrainConfig, found: dict, *, own: bool = False) -> dict:
    """``found`` with ``--validation-split``'s share of its training examples as its "val",
    drawn with ``--seed`` as the data readers draw it (docs/data.md), not Keras's last rows
    (on data in label order they would be one class): rows of arrays, or examples of a
    dataset (counted in one pass). Data with a validation split of its own, or a dataset in
    the function's own batches (``own``), is refused."""
    from keras import tree

    from mirrorfit.data.files import holdout

    fraction, train = config.validation_split, found.get("train")
    if not fraction or train is None:
        return found
    if found.get("val") is not None:
        raise ConfigError(
            f"--data {config.data or 'mnist'} has its own validation split; drop --validation-split"
        )
    if _dataset(train):
        if own:
            raise ConfigError(
                f"--validation-split {fraction} holds out examples; --data {config.data} "
                "returns its training split in batches: return a validation split from the "
                "function too, or drop --validation-split"
            )
        from mirrorfit.data.user import dataset_held_out

        train, val = dataset_held_out(train, fraction, config.seed)
        return {**found, "train": train, "val": val}

    def rows(index):  # an .npz without sample weights holds None in their place
        return tuple(
            None if part is None else tree.map_structure(lambda a: a[index], part) for part in train
        )

    kept, held = holdout(len(tree.flatten(train[0])[0]), fraction, config.seed)
    return {**found, "train": rows(kept), "val": rows(held)}


def _first(split, n: int):
    """The first ``n`` examples of a training split (arrays, or a dict of them)."""
    from keras import tree

    return tuple(
        None if part is None else tree.map_structure(lambda a: a[:n], part) for part in split
    )


def scalars(logdir: str | None, global_batch: int, record):
    """A callback writing TensorBoard scalars under ``logdir`` as the built-in loop writes
    them, with TensorBoard's own writer (no TensorFlow needed): after each compiled call
    (x axis: the optimizer step) its logs as ``train/NAME``, the learning rate, fp16's loss
    scale and the examples/s; each epoch's logs as ``epoch/NAME``, with its examples/s from
    ``record`` (fit_summary.epoch_record, called before this). None: write nothing (the
    workers but the chief)."""
    import keras

    from mirrorfit.job.fit_summary import learning_rate_now, loss_scale_now, optimizer_steps
    from mirrorfit.job.observe import ScalarWriter

    writer = ScalarWriter(logdir)

    class Scalars(keras.callbacks.Callback):
        step: int | None = None  # the optimizer steps done (a resume's restored ones too)

        def on_epoch_begin(self, epoch, logs=None):
            if self.step is None:  # after a resume's restore
                self.step = optimizer_steps(self.model)

        def on_train_batch_begin(self, batch, logs=None):
            self.first = batch  # mirrorfit.fit calls it per call of several steps

        def on_train_batch_end(self, batch, logs=None):
            self.step = (self.step or 0) + batch - self.first + 1
            values = dict(logs or {})
            scale = loss_scale_now(self.model)
            if scale is not None:
                values["loss_scale"] = scale
            writer.after_call(self.step, values, learning_rate_now(self.model), global_batch)

        def on_epoch_end(self, epoch, logs=None):
            rate = {} if record.rate is None else {"examples_per_sec": record.rate}
            writer.epoch_callback(epoch, {**(logs or {}), **rate})

        def on_train_end(self, logs=None):
            writer.close()

    return Scalars()


def state_shown(console):
    """A callback printing what each device holds once the state is placed (the start
    screen's ``state:`` line, as mirrorfit's own loop prints it)."""
    import keras

    from mirrorfit.fitting.loop import runner_of
    from mirrorfit.job.fit_summary import state_line

    class StateShown(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            console.print(state_line(runner_of(self.model)))

    return StateShown()


def _replicas(model) -> int:
    from mirrorfit.fitting.setup import current

    return current().replicas


def _workers() -> int:
    from mirrorfit.fitting.setup import current

    return current().workers


def _chief() -> bool:
    from mirrorfit.fitting.setup import current

    return current().is_chief
