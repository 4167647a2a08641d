"""models.remat (``--remat``): on both engines, the CNN (with Dropout) trains through
``mirrorfit.fit`` with its layers recomputed in the backward pass, to the weights it reaches
without (Keras's own RematScope
failed here: on TensorFlow for every model, on JAX for any model with Dropout or
BatchNormalization). Each backend in its own process, on 2 replicas."""

from pathlib import Path

import pytest

from conftest import assert_same_weights, run_isolated

HERE = Path(__file__).parent


@pytest.mark.slow
@pytest.mark.parametrize(
    "backend, precision", [("tensorflow", "fp32"), ("jax", "fp32"), ("tensorflow", "bf16")]
)
def test_remat_trains_the_cnn_to_the_same_weights(backend, precision, tmp_path):
    """bf16 on TensorFlow: the backward pass recomputed the layer outside Keras's autocast
    scope (float32 weights against bf16 gradients: a ReluGrad TypeError)."""
    import numpy as np

    runs = run_isolated(HERE / "remat_driver.py", backend, precision, tmp_path)
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
    # JAX: XLA fuses the recomputed layers otherwise; one step's updates were 4e-9 apart (of
    # 1e-3), the four steps' weights up to 9.3e-6 (rounding, grown through ReLU and pooling)
    atol = 2e-5 if backend == "jax" else tolerance / 10
    assert_same_weights(plain_w := weights["plain"], weights["remat"], rtol=tolerance, atol=atol)
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
