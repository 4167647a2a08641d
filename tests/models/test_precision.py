"""precision: a value that builds the model under a dtype policy and wraps the optimizer."""

import keras
import pytest

import mirrorfit
from mirrorfit.models.precision import Precision


@pytest.mark.parametrize(
    "name, compute", [("fp32", "float32"), ("bf16", "bfloat16"), ("fp16", "float16")]
)
def test_layers_built_inside_get_the_policy_and_nothing_leaks(name, compute):
    before = keras.config.dtype_policy().name
    with Precision(name).building():
        model = mirrorfit.models.mlp()
    assert keras.config.dtype_policy().name == before  # restored
    hidden, output = model.layers[-2], model.layers[-1]
    assert hidden.compute_dtype == compute
    assert hidden.variable_dtype == "float32"  # mixed: variables stay float32
    assert output.compute_dtype == "float32"  # the softmax stays float32


def test_policy_is_restored_when_building_fails():
    before = keras.config.dtype_policy().name
    with pytest.raises(RuntimeError):
        with Precision("bf16").building():
            raise RuntimeError("model code failed")
    assert keras.config.dtype_policy().name == before


def test_only_fp16_scales_the_loss():
    sgd = keras.optimizers.SGD(0.1)
    assert Precision("fp32").wrap_optimizer(sgd) is sgd
    assert Precision("bf16").wrap_optimizer(sgd) is sgd
    wrapped = Precision("fp16", initial_scale=1024, growth_steps=10).wrap_optimizer(sgd)
    assert isinstance(wrapped, keras.optimizers.LossScaleOptimizer)
    assert wrapped.initial_scale == 1024 and wrapped.dynamic_growth_steps == 10


def test_unknown_precision_names_the_choices():
    with pytest.raises(mirrorfit.ConfigError, match="unknown precision 'fp8'.*fp32, bf16, fp16"):
        Precision("fp8")


def test_bf16_cnn_runs_every_heavy_kernel_in_bfloat16():
    """What mixed_bfloat16 really does to the CNN's step: no convolution, pooling or hidden
    matmul falls back to float32 (forward or backward); only the float32 output layer does."""
    import collections

    import tensorflow as tf

    with Precision("bf16").building():
        model = mirrorfit.models.cnn()
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="sparse_categorical_crossentropy")

    def gradients(x, y):  # what mirrorfit.fit's TensorFlow step differentiates
        with tf.GradientTape() as tape:
            loss = model.compute_loss(x, y, model(x, training=True))
        return tape.gradient(loss, model.trainable_variables)

    graph = (
        tf.function(gradients)
        .get_concrete_function(tf.TensorSpec([8, 28, 28], tf.float32), tf.TensorSpec([8], tf.int32))
        .graph
    )
    dtypes = collections.defaultdict(collections.Counter)
    for op in graph.get_operations():
        if "T" in op.node_def.attr:
            dtypes[op.type][op.get_attr("T").name] += 1
    for kind in (
        "Conv2D",
        "Conv2DBackpropFilter",
        "Conv2DBackpropInput",
        "MaxPool",
        "MaxPoolGrad",
        "Relu",
        "ReluGrad",
    ):
        assert set(dtypes[kind]) == {"bfloat16"}, (kind, dtypes[kind])
    # Dense(64): forward + 2 backward matmuls in bf16; the output Dense(10): 3 in float32
    assert dtypes["MatMul"] == {"bfloat16": 3, "float32": 3}
    assert set(dtypes["Softmax"]) == {"float32"}
