"""``--data SOURCE`` -> one frozen :class:`~mirrorfit.data.opened.Data`: training batches,
validation and test data, the input shape, the classes, a log line and a fingerprint. The
kind (:data:`mirrorfit.data.spec.KINDS`) names the module that opens it; this one picks it,
and holds out ``--validation-split F`` (exactly round(F x N) examples, seeded) for a source
without a validation split. Every check a user can fail is one DataError line (exit 2).
"""

from __future__ import annotations

import importlib

from mirrorfit.data.arrays import Options
from mirrorfit.data.opened import Data
from mirrorfit.data.spec import kind_of
from mirrorfit._frameworks import install_hint, tensorflow_start_filtered
from mirrorfit.errors import DataError


def load_data(
    spec: str = "mnist",
    *,
    global_batch: int,
    seed: int = 42,
    workers: int = 1,
    eval_batch: int | None = None,
    data_dir: str | None = None,
    train_examples: int | None = None,
    validation_split: float | None = None,
    image_size: tuple[int, int] | None = None,
    image_feature: str = "image/encoded",
    label_feature: str = "image/class/label",
    cache: str | None = None,
    input_shape: tuple[int, ...] | None = None,
    num_classes: int | None = None,
    model: str = "mlp",
    parallel: bool = True,
    raw: bool = False,
    on_shape=None,
) -> Data:
    """Open ``spec`` (a ``--data`` value) for a run with ``global_batch`` examples per step
    over ``workers`` workers; ``eval_batch`` is the global batch of evaluation (default
    ``global_batch``); ``raw``: evaluation batches of uint8 pixels as decoded, for a
    compiled model that takes them so (else scaled to [0, 1]); ``on_shape``: called with an
    image source's decoded shape before any image is decoded. The other arguments are the
    flags of the same names."""
    kind = kind_of(spec)
    o = Options(
        spec=spec,
        kind=kind.name,
        data_dir=data_dir,
        global_batch=global_batch,
        seed=seed,
        workers=workers,
        eval_batch=eval_batch or global_batch,
        train_examples=train_examples,
        validation_split=validation_split,
        image_size=image_size,
        image_feature=image_feature,
        label_feature=label_feature,
        cache=cache,
        input_shape=input_shape,
        num_classes=num_classes,
        model=model,
        parallel=parallel,
        raw=raw,
        on_shape=on_shape,
    )
    try:
        with tensorflow_start_filtered():  # image folders and TFRecords load TensorFlow
            module = importlib.import_module(kind.module)
    except ImportError as e:  # on a JAX-only machine: what needs TensorFlow, in one line
        if (e.name or "").split(".")[0] != "tensorflow":
            raise
        raise DataError(
            f"--data {spec}: {kind.name} sources are decoded by tf.data, which "
            f"needs TensorFlow: {install_hint('tensorflow')}, or give the data "
            "as a .npz file or a package.module:function returning arrays"
        ) from None
    data = module.open_train(o)
    check_one_batch(spec, global_batch, data.train_examples)
    return data


def check_one_batch(spec: str, global_batch: int, train_examples: int) -> None:
    """DataError, one line, unless ``train_examples`` hold one ``global_batch`` at least
    (else an epoch has no step)."""
    if train_examples < global_batch:
        raise DataError(
            f"--data {spec}: the global batch {global_batch} is larger than the "
            f"{train_examples} training examples; lower --batch-size or "
            "--global-batch-size"
        )


__all__ = ["Data", "check_one_batch", "load_data"]
