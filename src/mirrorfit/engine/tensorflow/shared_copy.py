"""What holds where the replicas or workers share one copy of each variable (central storage,
parameter servers): Keras's increments made one op each, an assigning metric refused, XLA off.
Used by the fit runner (:mod:`.keras_fit`) and its scheduled form (:mod:`.coordinated_fit`).
(why: docs/architecture.md#tensorflow-parameter-servers)
"""

from __future__ import annotations

import contextlib

from mirrorfit.engine.tensorflow.parameter_server import atomic_keras_increments
from mirrorfit.errors import FitError


@contextlib.contextmanager
def increments_only(model, why: str):
    """Around tracing the steps where one copy of each variable is shared (``why``): Keras's
    increments made one op each (:func:`atomic_keras_increments`), and FitError for a metric
    of the model that updates its state with an assign instead (Keras's Precision, Recall,
    AUC, IoU, R2Score, F-scores: ``v.assign(v + x)``), which would be silently wrong there;
    found by what the metric does while the step traces, before the step runs."""
    import keras
    from keras.src.backend.common.stateless_scope import in_stateless_scope

    owners = {id(v): m for m in _leaf_metrics(model.metrics) for v in m.variables}
    keras_assign = keras.Variable.assign

    def assign(self, value):
        metric = owners.get(id(self))
        if metric is not None and not in_stateless_scope():
            raise FitError(
                f"the metric {metric.name} ({type(metric).__name__}) updates its state with "
                f"an assign, and {why}; compute it after training (mirrorfit evaluate, or "
                "model.evaluate), or train with --strategy mirrored / multi-worker"
            )
        return keras_assign(self, value)

    keras.Variable.assign = assign
    try:
        with atomic_keras_increments():
            yield
    finally:
        keras.Variable.assign = keras_assign


def without_xla(model, asked: bool, where: str) -> bool:
    """False, with a warning where the model asked for XLA: ``where`` (central storage,
    parameter servers) keeps the variables on another device than the step's, which XLA
    cannot compile against (the config refuses --xla there)."""
    if asked:
        import warnings

        warnings.warn(
            f"{type(model).__name__} is compiled with jit_compile (or --xla): off under "
            f"{where}, whose variables live on another device than the step's, which XLA "
            "cannot compile against",
            stacklevel=3,
        )
    return False


def _leaf_metrics(metrics):
    for metric in metrics:
        inner = getattr(metric, "metrics", None)
        if isinstance(inner, (list, tuple)):  # Keras's compiled metrics: a container
            yield from _leaf_metrics(inner)
        else:
            yield metric
