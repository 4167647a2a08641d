"""bench.flops: model FLOPs counted from the model, and a measured matmul peak."""

import pytest

import mirrorfit
from mirrorfit.bench.flops import (forward_flops_per_example, matmul_peak_flops,
                                   train_flops_per_example)


def test_mlp_flops_match_the_matmuls():
    # two dense layers: 2 x (784 x 100 + 100 x 10) multiply-adds, plus biases and activations
    matmuls = 2 * (784 * 100 + 100 * 10)
    flops = forward_flops_per_example(mirrorfit.models.mlp())
    assert matmuls <= flops <= 1.01 * matmuls
    assert train_flops_per_example(mirrorfit.models.mlp()) == 3 * flops


def test_cnn_flops_match_the_convolutions():
    convs = 2 * (28 * 28 * 64 * 7 * 7 + 14 * 14 * 128 * 3 * 3 * 64 + 14 * 14 * 128 * 3 * 3 * 128
                 + 6272 * 64 + 64 * 10)
    flops = forward_flops_per_example(mirrorfit.models.cnn())
    assert flops == pytest.approx(convs, rel=0.02)


def test_matmul_peak_is_measured_per_dtype():
    fp32 = matmul_peak_flops("float32", n=512, seconds=0.3)
    bf16 = matmul_peak_flops("bfloat16", n=512, seconds=0.3)
    assert fp32 > 1e9 and bf16 > 1e9  # any CPU does over a GFLOP/s on a 512 x 512 matmul
