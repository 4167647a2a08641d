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


def pythonified(logs: dict, to_numpy) -> dict:
    """A step's logs as Keras's fit hands them on: numbers as Python floats or ints, arrays as
    lists, a nested dict's keys (a compiled metrics' ``result()``) flattened into the logs."""
    out: dict = {}
    for key, value in logs.items():
        if isinstance(value, dict):
            out.update(pythonified(value, to_numpy))
            continue
        value = np.asarray(to_numpy(value))
        out[key] = value.item() if value.size == 1 else value.tolist()
    return out


def whole_batch_reductions(model) -> list[str]:
    """The reductions of the compiled losses that a mean over each replica's share, averaged
    over the replicas, does not give: ``sum`` (a sum, not a mean) and
    ``mean_with_sample_weight`` (divided by the share's weights, which differ between
    replicas). Keras's default, ``sum_over_batch_size``, averages."""
    from keras import tree

    loss = getattr(model, "loss", None)
    found = []
    for fn in tree.flatten(loss) if loss is not None else []:
        reduction = getattr(fn, "reduction", "sum_over_batch_size")
        if reduction in ("sum", "mean_with_sample_weight") and reduction not in found:
            found.append(reduction)
    return found


def check_reductions(model, why: str) -> None:
    """FitError for a compiled loss reduction a per-replica step cannot give (``why``: what
    would give it)."""
    found = whole_batch_reductions(model)
    if found:
        raise FitError(
            f"the compiled loss has reduction={found[0]!r}, which each replica's step would "
            f"apply to its own share (the replicas' {found[0]}s averaged are not the global "
            f"batch's); {why}, or compile the loss with reduction='sum_over_batch_size'"
        )


def own_step_arguments(model) -> dict[str, int]:
    """The positional arguments (``self`` not counted) of each ``train_step``/``test_step``
    the model defines itself: 1 in TensorFlow's form ``(data)``, 2 in JAX's ``(state,
    data)``; a step taking ``*args`` is left out."""
    import inspect

    found = {}
    for step in ("train_step", "test_step"):
        if not overrides(model, step):
            continue
        params = list(inspect.signature(getattr(model, step)).parameters.values())
        if not any(p.kind == p.VAR_POSITIONAL for p in params):
            kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
            found[step] = sum(p.kind in kinds for p in params)
    return found


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


def own_metric_names(model) -> list[str]:
    """The compiled metrics of classes the user wrote (not Keras's), whose state
    :func:`merged` adds up over the replicas: right for Keras's sums and counts, not known
    for a class of the user's own (a running maximum would be summed)."""
    found = []
    for metric in getattr(model, "metrics", []):
        for inner in getattr(metric, "metrics", None) or [metric]:  # CompileMetrics' own
            module = type(inner).__module__
            if not module.startswith(("keras.", "keras_hub.")) and inner.variables:
                found.append(inner.name)
    return found


def loss_tracker_indices(model) -> list[int] | None:
    """Where Keras's loss tracker (a Mean: total, count) sits in ``model.metrics_variables``,
    or None (a model without one)."""
    tracker = getattr(model, "_loss_tracker", None)
    if tracker is None or len(tracker.variables) != 2:
        return None
    ids = [id(v) for v in model.metrics_variables]
    try:
        return [ids.index(id(v)) for v in tracker.variables]
    except ValueError:
        return None


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
            if not np.isfinite(labels).all():
                i = int(np.flatnonzero(~np.isfinite(labels))[0])
                raise FitError(
                    f"{named} has the label {float(labels.flat[i])!r} (at {i}) for a sparse "
                    "categorical loss, which takes class indices; give finite integer labels"
                )
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


# Keras's losses that compare each target with its output value by value: targets of another
# shape are broadcast against the output (MSE on integer labels of a 10-way output) or fail
# deep in the framework. Keyed by how compile() may name them.
_ELEMENTWISE = frozenset(
    {
        "mse", "mae", "mape", "msle", "mean_squared_error", "mean_absolute_error",
        "mean_absolute_percentage_error", "mean_squared_logarithmic_error",
        "categorical_crossentropy", "binary_crossentropy", "kl_divergence", "huber",
        "log_cosh", "hinge", "squared_hinge", "categorical_hinge", "poisson",
        "binary_focal_crossentropy", "categorical_focal_crossentropy",
        "MeanSquaredError", "MeanAbsoluteError", "MeanAbsolutePercentageError",
        "MeanSquaredLogarithmicError", "CategoricalCrossentropy", "BinaryCrossentropy",
        "KLDivergence", "Huber", "LogCosh", "Hinge", "SquaredHinge", "CategoricalHinge",
        "Poisson", "BinaryFocalCrossentropy", "CategoricalFocalCrossentropy",
    }
)  # fmt: skip


def check_target_shapes(model, y, where: str) -> None:
    """FitError for NumPy targets a compiled Keras loss cannot pair with the model's outputs:
    one array for a model of several outputs and one loss, or targets of another shape than
    the output for a loss that compares them value by value (a rank apart with a last axis of
    1 is fine: Keras squeezes it). Losses of the user's own are not judged."""
    loss = getattr(model, "loss", None)
    outputs = getattr(model, "outputs", None) or []
    if isinstance(y, dict) and outputs:
        _check_target_keys(model, y, where)
    if len(outputs) > 1 and isinstance(y, np.ndarray):
        raise FitError(
            f"the model has {len(outputs)} outputs and {where} one target array; give one "
            "target per output (a list in output order, or a dict keyed by output name)"
        )
    if not isinstance(loss, (dict, list, tuple)) and len(outputs) > 1:
        return
    from mirrorfit.data.arrays import is_sparse_categorical

    for name, fn, labels, _ in _per_output(model, y):
        shape = _output_shape_of(model, name)
        kind = fn if isinstance(fn, str) else getattr(fn, "__name__", type(fn).__name__)
        if is_sparse_categorical(fn) and isinstance(labels, np.ndarray) and shape is not None:
            have, want = tuple(labels.shape[1:]), tuple(shape[1:])
            if want and want[-1] != 1 and len(have) == len(want) and _pairs(have, want):
                whose = f"{where}'s {name}" if name else where
                raise FitError(
                    f"{whose} has targets of shape {have} per example, the output's own, for "
                    "a sparse categorical loss, which takes one class index per example; give "
                    "class indices (np.argmax of one-hot rows), or categorical crossentropy "
                    "for one-hot targets"
                )
        if kind not in _ELEMENTWISE or not isinstance(labels, np.ndarray) or shape is None:
            continue
        have, want = tuple(labels.shape[1:]), tuple(shape[1:])
        if _pairs(have, want):
            continue
        hint = (
            "one-hot targets (keras.utils.to_categorical) or a sparse categorical loss for "
            "class indices"
            if labels.dtype.kind in "iu" and len(have) < len(want)
            else "targets of the output's shape, or a model whose output has theirs"
        )
        whose = f"{where}'s {name}" if name else where
        raise FitError(
            f"{whose} has targets of shape {have} per example "
            f"and the model's output {want}, which the loss {kind} compares value by value; "
            f"give {hint}"
        )


def _listed_by_output_name(model, part: dict):
    """``part`` keyed by the layer names of a model whose outputs are a list: that list, in
    output order, as Keras's own fit matches them; as it is otherwise (a dict of outputs, a
    step of the model's own, keys that are not every output's name)."""
    structure = getattr(model, "_outputs_struct", None)
    if not isinstance(structure, (list, tuple)) or overrides(model, "train_step"):
        return part
    names = list(getattr(model, "output_names", None) or [])
    if len(names) != len(structure) or len(names) < 2 or set(part) != set(names):
        return part
    return [part[name] for name in names]


def _check_target_keys(model, y: dict, where: str) -> None:
    """FitError for targets given as a dict that Keras's compiled loss cannot match: a key no
    output has (a dict of outputs' keys; a list of outputs' layer names, which
    :func:`as_outputs` turned into a list when every one was given), or any dict for one output
    (Keras: "could not convert string to float" with the key). Outputs left out of a dict of
    outputs are Keras's to judge (one without a loss needs none). A step of the model's own
    reads its targets as it likes: not judged."""
    if overrides(model, "train_step") or overrides(model, "compute_loss"):
        return
    # a functional model's outputs as declared (a dict, a list, one tensor); a Sequential's
    # is one tensor (its .output raises until it is called)
    structure = getattr(model, "_outputs_struct", None)
    if structure is None and not isinstance(model, keras.Sequential):
        return
    keys = ", ".join(repr(k) for k in list(y)[:5]) or "none"
    if isinstance(structure, dict):
        if set(y) - set(structure):
            names = ", ".join(map(repr, structure))
            raise FitError(
                f"{where}'s targets are a dict with the key(s) {keys}; the model's outputs "
                f"are named {names}: key the targets by those names"
            )
        return
    count = len(model.outputs)
    if count == 1:
        raise FitError(
            f"{where}'s targets are a dict (key(s) {keys}) for a model of one output, which "
            "Keras's loss takes as one array; give the array"
        )
    names = ", ".join(map(repr, model.output_names))
    raise FitError(
        f"{where}'s targets are a dict with the key(s) {keys}; the model's {count} outputs are "
        f"named {names}: key the targets by every one of those names, or give a list in "
        "output order"
    )


def as_outputs(model, part):
    """``part`` (targets or sample weights) given as a list for a model whose outputs are a
    dict: that dict, the entries in its keys' sorted order, as Keras's compiled loss packs
    targets (its sample weights it does not: a list of them, which mirrorfit always passes,
    failed there)."""
    if isinstance(part, dict):
        return _listed_by_output_name(model, part)
    if not isinstance(part, (list, tuple)):
        return part
    try:
        outputs = model.output
    except (AttributeError, ValueError):  # a subclassed model: not known
        return part
    if isinstance(outputs, dict) and len(outputs) == len(part):
        return dict(zip(sorted(outputs), part))
    return part


def check_input_shapes(model, x, where: str) -> None:
    """FitError for NumPy inputs of another count than the model's declared inputs, or (one
    input) of another example shape (a model without a declared input is built from the
    data, so not judged)."""
    inputs = getattr(model, "inputs", None) or []
    if inputs and isinstance(x, dict):
        names = [_input_name(t) for t in inputs]
        missing = [n for n in names if n not in x]
        if missing:
            keys = ", ".join(repr(k) for k in list(x)[:5])
            raise FitError(
                f"{where} is a dict with the key(s) {keys or 'none'}; the model's inputs are "
                f"named {', '.join(map(repr, names))} (no {missing[0]!r}): key the arrays by "
                "input name, or give them as a list in input order"
            )
    given = (
        1
        if isinstance(x, np.ndarray)
        else len(x)
        if isinstance(x, (list, tuple)) and all(isinstance(a, np.ndarray) for a in x)
        else None
    )
    if inputs and given is not None and given != len(inputs):
        names = ", ".join(_input_name(t) for t in inputs)
        # one input and a list of several: Keras's own fit takes the first with a warning
        raise FitError(
            f"the model has {len(inputs)} input{'s' if len(inputs) > 1 else ''} ({names}) "
            f"and {where} "
            + ("one array" if given == 1 else f"{given} arrays")
            + "; give one array per input (a list in input order, or a dict keyed by input "
            "name)"
        )
    if len(inputs) != 1 or not isinstance(x, np.ndarray):
        return
    want, have = tuple(inputs[0].shape[1:]), tuple(x.shape[1:])
    if len(want) != len(have) or any(w is not None and w != h for w, h in zip(want, have)):
        shown = tuple("?" if w is None else w for w in want)
        raise FitError(
            f"{where} has examples of shape {have} but the model takes {shown}; give data of "
            "the model's input shape, or a model built for the data"
        )


def _input_name(tensor) -> str:
    """An input's name as Keras keys it (its InputLayer's), else the tensor's."""
    history = getattr(tensor, "_keras_history", None)
    return getattr(getattr(history, "operation", None), "name", None) or tensor.name


def _pairs(have: tuple, want: tuple) -> bool:
    """Whether targets of example shape ``have`` pair with outputs of ``want`` (None: any)."""

    def same(a, b):
        return len(a) == len(b) and all(w is None or h == w for h, w in zip(a, b))

    return (
        same(have, want)
        or (len(have) + 1 == len(want) and want[-1] == 1 and same(have, want[:-1]))
        or (len(have) == len(want) + 1 and have[-1] == 1 and same(have[:-1], want))
    )


def _output_shape_of(model, name: str | None):
    """The output shape (batch first) ``_per_output``'s ``name`` stands for, or None."""
    shapes = _output_shapes(model)
    if shapes is None:
        return None
    if name is None:
        return shapes if not (shapes and isinstance(shapes[0], (list, tuple))) else None
    key = name.removeprefix("output ")
    if isinstance(shapes, dict):
        return shapes.get(key)
    return shapes[int(key)] if key.isdigit() and int(key) < len(shapes) else None


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
