"""The compiled model's loss and metrics on one replica's share of a padded global batch, in Keras
ops (both engines' compiled steps call these). As Keras's ``train_step``, except: the loss's
sample weights are multiplied by ``scale``, so the replicas' losses add up to the real examples'
loss, and every metric sees padding with weight 0. Metric states merge by adding each replica's
change to the initial state (as ``tf.distribute`` does: AUC is merged, not averaged).
"""

from __future__ import annotations

import keras
import numpy as np
from keras import ops, tree

from mirrorfit.errors import FitError


def loss_weights(batch: dict, *, masked: bool = False):
    """The sample weights the loss takes: ``w x scale`` (0 for padding). ``masked``: the
    model's outputs carry a Keras mask, whose loss already averages over the unmasked steps of
    each replica's share (padding's steps included in the mask): ``w x mask``."""
    if masked:
        return metric_weights(batch)
    scale = batch["scale"]
    return tree.map_structure(lambda w: w * _like(scale, w), batch["w"])


def metric_weights(batch: dict):
    """The sample weights the weighted metrics take: ``w x mask``."""
    mask = batch["mask"]
    return tree.map_structure(lambda w: w * _like(mask, w), batch["w"])


def _like(column, w):
    """``column`` (one value per row) shaped to multiply ``w`` (rows first)."""
    return ops.reshape(column, (-1,) + (1,) * (len(w.shape) - 1))


def masked_outputs(model) -> bool:
    """Whether the model's outputs carry a Keras mask (``mask_zero``, ``Masking``): known for
    functional and Sequential models."""
    from keras.src import backend

    try:
        outputs = model.outputs
    except (AttributeError, ValueError):  # a subclassed model: not known
        return False
    return any(backend.get_keras_mask(t) is not None for t in tree.flatten(outputs or []))


def overrides(model, name: str) -> bool:
    """Whether the model's class defines its own ``name`` (``train_step``, ``compute_loss``,
    ...) instead of Keras's."""
    return getattr(type(model), name) is not getattr(keras.Model, name)


def update(model, batch: dict, y_pred, replica_loss) -> None:
    """Update the model's loss tracker and compiled metrics (stateful Keras objects: on JAX
    call it inside a ``StatelessScope``). ``batch``: this replica's share; ``replica_loss``:
    its loss, unscaled (the global batch's loss is the mean over replicas)."""
    # rows / scale = this replica's share of the real examples (n / replicas): summed over
    # the replicas, the tracker counts each real example once.
    rows = batch["mask"].shape[0]
    share = ops.cast(rows, "float32") / ops.cast(batch["scale"][0], "float32")
    model._loss_tracker.update_state(replica_loss, sample_weight=share)
    y = batch.get("y")
    if overrides(model, "compute_metrics"):
        model.compute_metrics(batch["x"], y, y_pred, sample_weight=metric_weights(batch))
        return
    compiled = model._compile_metrics
    if compiled is None or y is None:
        return
    if not compiled.built:
        compiled.build(y, y_pred)
    y_true, y_pred = compiled._flatten_y(y), compiled._flatten_y(y_pred)
    mask = batch["mask"]
    for metric, y_t, y_p in zip(compiled._flat_metrics, y_true, y_pred):
        if metric:  # the mask shaped as the targets (it broadcasts against a Keras mask)
            metric.update_state(y_t, y_p, sample_weight=_like(mask, y_t))
    weights = compiled._flatten_y(metric_weights(batch))
    if len(weights) < len(y_true):
        weights = [weights[0]] * len(y_true)
    for metric, y_t, y_p, w in zip(compiled._flat_weighted_metrics, y_true, y_pred, weights):
        if metric:
            metric.update_state(y_t, y_p, sample_weight=w)


def output_loss_indices(model) -> list[int]:
    """Where, in ``model.metrics_variables``, the compiled loss's per-output loss means are
    (``value_loss``, ``flag_loss``: a model of several outputs)."""
    compiled = getattr(model, "_compile_loss", None)
    owned = {id(v) for m in (getattr(compiled, "metrics", None) or []) for v in m.variables}
    return [i for i, v in enumerate(model.metrics_variables) if id(v) in owned]


def reweighted(before, after, scale):
    """A per-output loss mean's state after Keras's update, with that update's weight (the
    replica's rows) turned into its real examples (rows / scale): the padding of a partial
    batch is not counted."""
    return before + (after - before) / ops.cast(scale[0], after.dtype)


def merged(initial: list, per_replica: list) -> list:
    """Metric variable values merged over replicas: ``initial + sum(replica - initial)``.
    ``per_replica``: one array per variable, replicas on the first axis (NumPy)."""
    import numpy as np

    out = []
    for init, values in zip(initial, per_replica):
        values = np.asarray(values)
        delta = (values - init[None]).sum(axis=0) if values.shape[0] else 0
        out.append((init + delta).astype(values.dtype))
    return out


def results(model) -> dict[str, float]:
    """The model's metric results as floats (Keras's ``get_metrics_result``)."""
    import numpy as np

    return {k: float(np.asarray(v)) for k, v in model.get_metrics_result().items()}


def check_sparse_labels(model, y, where: str) -> None:
    """FitError for integer labels a compiled sparse categorical loss cannot index: an output
    of N classes whose NumPy labels hold one outside 0..N-1 (its ``ignore_class`` excepted).
    Keras's loss on JAX takes such a label's one-hot as all zeros, a loss of 0, without a word.
    Each output of a dict or list of losses is checked against its own labels."""
    from mirrorfit.data.arrays import check_class_labels, is_sparse_categorical

    for name, loss, labels, classes in _per_output(model, y):
        if not is_sparse_categorical(loss) or not isinstance(labels, np.ndarray):
            continue
        named = f"{where}'s {name}" if name else where
        if labels.dtype.kind == "f":  # Keras's sparse loss casts them: 1.5 would be class 1
            fractional = np.flatnonzero(labels != np.floor(labels))
            if fractional.size:
                i = int(fractional[0])
                raise FitError(
                    f"{named} has the label {float(labels.flat[i])!r} (at {i}) for a sparse "
                    "categorical loss, which takes class indices and would cut it to "
                    f"{int(labels.flat[i])}; give integer labels, or probabilities with "
                    "a categorical loss"
                )
            labels = labels.astype(np.int64)
        elif labels.dtype.kind not in "iu":
            continue
        check_class_labels(labels, named, classes, getattr(loss, "ignore_class", None))


def check_class_weight(class_weight, y) -> None:
    """FitError for a ``class_weight`` Keras would take and use wrongly or not at all: keys
    that are not whole class indices (a string, 0.5), a class the labels never hold, or a
    weight that is not a finite number >= 0."""
    import numbers

    if class_weight is None:
        return
    if not isinstance(class_weight, dict) or not class_weight:
        raise FitError(
            f"class_weight={class_weight!r}: give a dict of class index -> weight, e.g. "
            "{0: 1.0, 1: 5.0}"
        )
    for key, weight in class_weight.items():
        if isinstance(key, bool) or not isinstance(key, numbers.Integral) or key < 0:
            raise FitError(
                f"class_weight has the key {key!r}; its keys are class indices, whole "
                "numbers 0, 1, ... as the labels hold them"
            )
        if isinstance(weight, bool) or not (
            isinstance(weight, numbers.Real) and np.isfinite(weight) and weight >= 0
        ):
            raise FitError(f"class_weight[{key}] is {weight!r}; give a finite weight of at least 0")
    labels = np.asarray(y) if isinstance(y, np.ndarray) else None
    if labels is None or labels.size == 0:
        return  # a dataset's or generator's labels are seen only while they are read
    if labels.ndim > 1 and labels.shape[-1] > 1:  # one-hot, as Keras reads it
        present = set(np.unique(np.argmax(labels, axis=-1)).tolist())
    else:
        present = set(np.unique(labels).tolist())
    absent = sorted(k for k in class_weight if int(k) not in present)
    if absent:
        raise FitError(
            f"class_weight names class {absent[0]}, which no training label holds (the "
            f"labels hold {len(present)} classes); drop it, or check the keys index the "
            "classes as the labels do"
        )


def ignores_a_class(model) -> bool:
    """Whether a compiled loss skips a label (``ignore_class``): like a masked output, its loss
    averages over each replica's counted labels."""
    return any(
        getattr(loss, "ignore_class", None) is not None
        for _, loss, _, _ in _per_output(model, None)
    )


def _per_output(model, y):
    """(name, loss, labels, classes) for each output of a compiled model: one for a single loss
    (no name), one per key of a dict of losses (labels from a dict ``y``), one per entry of a
    list (``output i``)."""
    from mirrorfit.data.arrays import output_classes

    loss = getattr(model, "loss", None)
    if isinstance(loss, dict):
        shapes = _output_shapes(model)
        return [
            (
                f"output {name}",
                fn,
                y.get(name) if isinstance(y, dict) else None,
                _classes(shapes.get(name) if isinstance(shapes, dict) else None),
            )
            for name, fn in loss.items()
        ]
    if isinstance(loss, (list, tuple)):
        shapes = _output_shapes(model)
        ys = y if isinstance(y, (list, tuple)) else [None] * len(loss)
        shapes = shapes if isinstance(shapes, (list, tuple)) else [None] * len(loss)
        return [
            (f"output {i}", fn, labels, _classes(shape))
            for i, (fn, labels, shape) in enumerate(zip(loss, ys, shapes))
        ]
    return [(None, loss, y, output_classes(model))]


def _output_shapes(model):
    try:
        shapes = model.output_shape
    except (AttributeError, ValueError, RuntimeError):
        return None
    if isinstance(shapes, (list, tuple)) and shapes and isinstance(shapes[0], (list, tuple)):
        names = getattr(model, "output_names", None)
        return dict(zip(names, shapes)) if names and isinstance(model.loss, dict) else shapes
    return shapes


def _classes(shape) -> int | None:
    return int(shape[-1]) if shape and shape[-1] is not None else None
