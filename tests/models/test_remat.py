"""models.remat (``--remat``): on both engines, the CNN (with Dropout) trains with its layers
recomputed in the backward pass, to the weights it reaches without (Keras's own RematScope
failed here: on TensorFlow for every model, on JAX for any model with Dropout or
BatchNormalization). Each backend in its own process, on 2 replicas."""

import pytest

from conftest import assert_same_weights, run_isolated

SCRIPT = """
import os, sys, json, collections
os.environ["KERAS_BACKEND"] = "{backend}"
import numpy as np
if "{backend}" == "jax":
    sys.modules["tensorflow"] = None  # the JAX engine never imports it
    from mirrorfit.engine import jax as engine
    strategy = engine.build_distribution(engine.configure_devices(replicas=2))
    seed = engine.seed
else:
    import mirrorfit
    strategy = mirrorfit.build_strategy(mirrorfit.configure_devices(replicas=2))
    import keras
    seed = keras.utils.set_random_seed
import keras, mirrorfit

data = mirrorfit.load_mnist(train_examples=128, download=False)
out = {{}}
for remat in (False, True):
    seed(5)
    notices = []
    trainer = mirrorfit.Trainer(strategy=strategy, model=mirrorfit.models.cnn,
                                optimizer=keras.optimizers.SGD(0.05),
                                loss=keras.losses.SparseCategoricalCrossentropy(),
                                global_batch=32, remat=remat, on_notice=notices.append,
                                precision="{precision}")
    model = trainer.model
    recomputed = [type(l).__name__ for l in model.layers
                  if getattr(l.call, "_mirrorfit_remat", False)]
    x = data.x_train[:4].astype("float32") / 255.0
    if "{backend}" == "jax":
        import jax
        jaxpr = jax.make_jaxpr(lambda t, n, x: model.stateless_call(t, n, x, training=True)[0])(
            [v.value for v in model.trainable_variables],
            [v.value for v in model.non_trainable_variables], x)
        marks = sum(e.primitive.name in ("remat2", "checkpoint", "remat") for e in jaxpr.eqns)
        convs = None
    else:
        import tensorflow as tf
        def grads(x):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(model(x, training=True))
            return tape.gradient(loss, model.trainable_variables)
        def ops(fn):
            return tf.function(fn).get_concrete_function(
                tf.TensorSpec(x.shape)).graph.get_operations()
        marks = sum(op.type == "IdentityN" and b"CustomGradient" in op.get_attr("_gradient_op_type")
                    for op in ops(lambda x: model(x, training=True)))
        convs = sum(op.type == "Conv2D" for op in ops(grads))
    history = trainer.fit(mirrorfit.train_batches(data.x_train, data.y_train, global_batch=32,
                                                  seed=3), epochs=1)
    name = "remat" if remat else "plain"
    np.savez(f"{out_dir}/{{name}}.npz", *model.get_weights())
    out[name] = {{"recomputed": recomputed, "marks": marks, "convs": convs,
                  "loss": history.epochs[-1]["loss"], "steps": history.steps,
                  "notices": notices}}
print(json.dumps(out))
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    "backend, precision", [("tensorflow", "fp32"), ("jax", "fp32"), ("tensorflow", "bf16")]
)
def test_remat_trains_the_cnn_to_the_same_weights(backend, precision, tmp_path):
    """bf16 on TensorFlow: the backward pass recomputed the layer outside Keras's autocast
    scope (float32 weights against bf16 gradients: a ReluGrad TypeError)."""
    import numpy as np

    runs = run_isolated(SCRIPT.format(backend=backend, out_dir=tmp_path, precision=precision))
    plain, remat = runs["plain"], runs["remat"]
    # The layers with weights and no other state; Dropout (its seed state) and pooling are not.
    assert remat["recomputed"] == ["Conv2D", "Conv2D", "Conv2D", "Dense", "Dense"]
    assert plain["recomputed"] == [] and plain["marks"] == 0
    assert remat["marks"] == 5  # one jax.checkpoint / tf.recompute_grad per layer
    if backend == "tensorflow":  # the backward pass runs the convolutions again
        assert remat["convs"] > plain["convs"]
    assert remat["notices"] == []
    assert remat["steps"] == plain["steps"] == 4
    weights = {}
    for name in ("plain", "remat"):
        with np.load(tmp_path / f"{name}.npz") as f:
            weights[name] = [f[k] for k in sorted(f.files, key=lambda k: int(k.split("_")[1]))]
    tolerance = 1e-5 if precision == "fp32" else 1e-2  # bf16: the same ops, bf16 rounding
    assert_same_weights(
        plain_w := weights["plain"], weights["remat"], rtol=tolerance, atol=tolerance / 10
    )
    assert np.isfinite(remat["loss"]) and len(plain_w) == 10


def test_remat_says_when_no_layer_qualifies():
    import keras

    from mirrorfit.models.remat import rematerialize

    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.BatchNormalization(), keras.layers.Dropout(0.5)]
    )
    notices = []
    assert rematerialize(model, notices.append) == []
    assert len(notices) == 1 and "--remat" in notices[0]


def test_remat_leaves_the_users_own_layers_as_written():
    """A layer of the user's own may write state inside ``call`` (``self.add_loss``): under
    JAX the recomputation leaked a tracer, on TensorFlow the loss's gradient was lost."""
    import keras

    from mirrorfit.models.remat import rematerialize

    class Penalised(keras.layers.Dense):
        def call(self, inputs):
            self.add_loss(0.01 * keras.ops.sum(self.kernel**2))
            return super().call(inputs)

    model = keras.Sequential([keras.Input((4,)), Penalised(3), keras.layers.Dense(2)])
    assert rematerialize(model) == [model.layers[1].name]  # Keras's Dense only
