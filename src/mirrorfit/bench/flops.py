"""Model FLOPs, counted from the model itself, and this machine's matmul peak (FLOP/s).
MFU (model FLOPs utilisation) = training FLOPs per example x examples/s / peak FLOP/s, training
FLOPs being 3x the forward pass (why: docs/architecture.md#the-bench).
"""

from __future__ import annotations

import time

TRAIN_FLOPS_PER_FORWARD = 3


def forward_flops_per_example(model) -> int:
    """Floating-point operations of one example's forward pass (multiply and add counted as 2),
    as TensorFlow's op statistics count them (matmuls, convolutions, bias adds, activations)."""
    import tensorflow as tf
    from tensorflow.python.profiler import model_analyzer, option_builder

    spec = tf.TensorSpec([1, *model.inputs[0].shape[1:]], model.inputs[0].dtype)
    graph = tf.function(lambda x: model(x, training=False)).get_concrete_function(spec).graph
    options = (
        option_builder.ProfileOptionBuilder(option_builder.ProfileOptionBuilder.float_operation())
        .with_empty_output()
        .build()
    )
    logger = tf.get_logger()
    level = logger.level
    logger.setLevel("ERROR")  # the v1 profiler warns about its own deprecated helpers
    try:
        stats = model_analyzer.profile(graph, options=options)
    finally:
        logger.setLevel(level)
    return int(stats.total_float_ops)


def train_flops_per_example(model) -> int:
    """Training FLOPs per example: forward x 3."""
    return TRAIN_FLOPS_PER_FORWARD * forward_flops_per_example(model)


def matmul_peak_flops(dtype: str = "float32", n: int = 2048, seconds: float = 1.0) -> float:
    """Best measured FLOP/s of an ``n`` x ``n`` matmul in ``dtype`` on the default device,
    over repeated timed runs of about ``seconds`` in all."""
    import tensorflow as tf

    a = tf.random.uniform([n, n], dtype=tf.float32)
    a, b = tf.cast(a, dtype), tf.cast(tf.transpose(a), dtype)

    @tf.function
    def chain(x, y, k):
        out = tf.zeros([], dtype)
        for _ in tf.range(k):
            out += tf.reduce_sum(tf.matmul(x, y)[:1, :1])  # consumed: not pruned away
        return out

    chain(a, b, tf.constant(1)).numpy()  # trace, warm up
    best, deadline = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        t0 = time.perf_counter()
        chain(a, b, tf.constant(3)).numpy()
        best = max(best, 3 * 2 * n**3 / (time.perf_counter() - t0))
    return best


__all__ = ["forward_flops_per_example", "train_flops_per_example", "matmul_peak_flops"]
