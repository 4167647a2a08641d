"""Run by tests/models/test_remat.py, each backend in its own process: ``python
remat_driver.py BACKEND PRECISION OUT``. On 2 replicas of BACKEND (jax, with TensorFlow
blocked, or tensorflow), trains the CNN through ``mirrorfit.fit`` one epoch on 128 MNIST
examples at PRECISION, without and with its layers rematerialized (as --remat does), from
seed 5, and saves the weights to OUT/plain.npz and OUT/remat.npz.
Prints one JSON line: per run, the layers marked for recomputation, the recomputation marks in
the traced forward pass, the convolutions of the backward pass (TensorFlow only), the last
loss, the steps and the notices."""

import json
import os
import sys

backend, precision, out_dir = sys.argv[1:4]
os.environ["KERAS_BACKEND"] = backend

import numpy as np  # noqa: E402

if backend == "jax":
    sys.modules["tensorflow"] = None  # the JAX engine never imports it
import mirrorfit  # noqa: E402

mirrorfit.setup(backend=backend, replicas=2, precision=precision)
import keras  # noqa: E402

from mirrorfit.models.precision import Precision  # noqa: E402
from mirrorfit.models.remat import rematerialize  # noqa: E402


def recomputation(model, x):
    """The recomputation marks in the model's traced forward pass on ``x``, and the
    convolutions of its backward pass (TensorFlow; None on JAX)."""
    if backend == "jax":
        import jax

        jaxpr = jax.make_jaxpr(lambda t, n, x: model.stateless_call(t, n, x, training=True)[0])(
            [v.value for v in model.trainable_variables],
            [v.value for v in model.non_trainable_variables],
            x,
        )
        return sum(e.primitive.name in ("remat2", "checkpoint", "remat") for e in jaxpr.eqns), None
    import tensorflow as tf

    def grads(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x, training=True))
        return tape.gradient(loss, model.trainable_variables)

    def ops(fn):
        return tf.function(fn).get_concrete_function(tf.TensorSpec(x.shape)).graph.get_operations()

    marks = sum(
        op.type == "IdentityN" and b"CustomGradient" in op.get_attr("_gradient_op_type")
        for op in ops(lambda x: model(x, training=True))
    )
    # per replica, as fit runs it (mirrored variables have no handle outside a replica)
    strategy = tf.distribute.get_strategy()
    return marks, sum(op.type == "Conv2D" for op in ops(lambda x: strategy.run(grads, (x,))))


data = mirrorfit.load_mnist(train_examples=128, download=False)
x = data.x_train.astype("float32") / 255.0
out = {}
for remat in (False, True):
    keras.utils.set_random_seed(5)
    notices: list = []
    with Precision(precision).building():
        model = mirrorfit.models.cnn()
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="sparse_categorical_crossentropy")
    if remat:
        rematerialize(model, notices.append)
    recomputed = [
        type(layer).__name__
        for layer in model.layers
        if getattr(layer.call, "_mirrorfit_remat", False)
    ]
    marks, convs = recomputation(model, x[:4])
    steps: list = []
    count = keras.callbacks.LambdaCallback(on_train_batch_end=lambda b, logs, s=steps: s.append(b))
    history = mirrorfit.fit(
        model,
        x,
        data.y_train,
        batch_size=32,
        epochs=1,
        shuffle=False,
        verbose=0,
        callbacks=[count],
        steps_per_execution=1,
    )
    name = "remat" if remat else "plain"
    np.savez(f"{out_dir}/{name}.npz", *model.get_weights())
    out[name] = {
        "recomputed": recomputed,
        "marks": marks,
        "convs": convs,
        "loss": history.history["loss"][-1],
        "steps": len(steps),
        "notices": notices,
    }
print(json.dumps(out))
