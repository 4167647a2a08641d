"""``mirrorfit.predict``: Keras's ``predict`` data-parallel over ``mirrorfit.setup``'s devices:
each batch split over the replicas, the model's ``predict_step`` (its own, where it overrides
it) on every share, the outputs put back in order. Several workers: each predicts what it is
given on its own devices, as Keras's own ``predict`` does.
"""

from __future__ import annotations

import importlib
import operator

import numpy as np

from mirrorfit.engine.backends import ENGINES
from mirrorfit.errors import FitError
from mirrorfit.fitting.batches import check_not_ragged
from mirrorfit.fitting.hooks import checked_callbacks
from mirrorfit.fitting.loop import warn_compiled_anyway
from mirrorfit.fitting.setup import current


def predict(model, x, batch_size=None, verbose="auto", steps=None, callbacks=None):
    """``model.predict(x, ...)`` on every replica (``batch_size``: the global batch, default
    32; ``steps``: batches to predict, default all of ``x``). Returns NumPy arrays, in
    ``x``'s order, structured as the model's outputs, as Keras's ``predict`` returns them."""
    import keras
    from keras.src.trainers.data_adapters import data_adapter_utils, get_data_adapter

    if not isinstance(model, keras.Model):
        raise FitError(f"mirrorfit.predict takes a keras.Model, not {type(model).__name__}")
    if x is None:
        raise FitError("x=None: give the inputs to predict")
    batch_size = 32 if batch_size is None and steps is None else batch_size
    for name, value in (("batch_size", batch_size), ("steps", steps)):
        if value is not None and _whole(value) < 1:
            raise FitError(f"{name}={value!r}: give a whole number of at least 1, or None")
    if verbose not in ("auto", 0, 1, 2):
        raise FitError(f"verbose={verbose!r}: choose 'auto', 0, 1 or 2")
    backend = keras.backend.backend()
    if backend not in ENGINES:
        raise FitError(f"mirrorfit.predict runs on the {' and '.join(ENGINES)} backends")
    engine = importlib.import_module(f"{ENGINES[backend]}.keras_fit")
    chosen = current()
    placement = engine.placement(model, chosen if chosen and chosen.backend == backend else None)
    from mirrorfit.fitting.metrics import check_input_shapes  # imports Keras: after setup

    check_not_ragged("x", x)
    check_input_shapes(model, x, "x")
    warn_compiled_anyway(model)
    adapter = get_data_adapter(x, batch_size=batch_size, steps_per_epoch=steps, shuffle=False)
    batches = adapter.get_numpy_iterator()
    total = steps if steps is not None else adapter.num_batches
    callback_list = keras.callbacks.CallbackList(
        checked_callbacks(callbacks),
        add_progbar=verbose != 0,
        verbose=1 if verbose == "auto" else verbose,
        epochs=1,
        steps=total,
        model=model,
    )
    predictor = None
    outputs: list = []
    callback_list.on_predict_begin()
    for step, batch in enumerate(batches):
        if steps is not None and step >= steps:
            break
        inputs, _, _ = data_adapter_utils.unpack_x_y_sample_weight(batch)
        if predictor is None:
            _build(model, engine, placement, inputs)
            predictor = _predictor(model, engine, placement)
        callback_list.on_predict_batch_begin(step)
        out = _predicted(predictor, inputs)
        outputs.append(out)
        callback_list.on_predict_batch_end(step, {"outputs": out})
    if predictor is not None:
        predictor.end()
    callback_list.on_predict_end()
    if not outputs:
        raise FitError("x gave no batch to predict; give at least one example")
    return keras.tree.map_structure(lambda *parts: np.concatenate(parts), *outputs)


def _build(model, engine, placement, inputs) -> None:
    """The model built from its first batch where it is not, as Keras's ``predict`` builds it
    (under the strategy's scope on TensorFlow)."""
    from keras.src import backend

    if all(layer.built for layer in model._flatten_layers()):
        return
    with engine.scope(placement), backend.StatelessScope():
        model(inputs)


def _predictor(model, engine, placement):
    """The engine's ``Predictor`` for ``model`` on ``placement``, kept on the model as Keras
    keeps its ``predict_function``: one compilation for every ``predict`` call."""
    kept = model.__dict__.get("_mirrorfit_predictor")
    if kept is None or kept[0] is not placement:
        kept = (placement, engine.Predictor(model, placement))
        object.__setattr__(model, "_mirrorfit_predictor", kept)  # not tracked by Keras
    kept[1].begin()
    return kept[1]


def _predicted(predictor, inputs):
    """``predictor(inputs)`` with the batch padded to a whole number of rows per replica
    (copies of its last row: a value of any dtype, strings too, that no mask empties), the
    outputs' padding rows cut off."""
    import keras

    leaves = keras.tree.flatten(inputs)
    rows = leaves[0].shape[0]
    extra = -rows % predictor.replicas
    if extra:
        inputs = keras.tree.map_structure(
            lambda a: np.concatenate([a, np.repeat(a[-1:], extra, axis=0)]), inputs
        )
    return keras.tree.map_structure(lambda a: np.asarray(a)[:rows], predictor(inputs))


def _whole(value) -> int:
    try:
        if isinstance(value, bool):
            raise TypeError
        return operator.index(value)
    except TypeError:
        return 0
