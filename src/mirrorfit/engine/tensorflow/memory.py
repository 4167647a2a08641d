"""What a TensorFlow run holds on its devices, for the run's summary: the training state's
bytes per device (whole on every replica) and the GPUs' peak memory."""

from __future__ import annotations

import math

import tensorflow as tf

REPLICATED = "replicated (the TensorFlow engine keeps the whole state on every device)"


def whole_state_bytes(model, optimizer) -> int:
    """Bytes of weights, statistics and optimizer state a device holds: all of them (the
    state is whole on every replica)."""
    return sum(
        math.prod(v.shape) * tf.as_dtype(v.dtype).size
        for v in [*model.variables, *optimizer.variables]
    )


def gpu_peak_bytes() -> int | None:
    """The GPUs' largest peak memory in use so far; None on CPUs."""
    peaks = []
    for device in tf.config.list_logical_devices("GPU"):  # "/device:GPU:0"
        try:
            peaks.append(
                tf.config.experimental.get_memory_info(device.name.split("device:")[-1])["peak"]
            )
        except (ValueError, tf.errors.OpError):  # a GPU that keeps no statistics
            pass
    return max(peaks) if peaks else None


__all__ = ["REPLICATED", "gpu_peak_bytes", "whole_state_bytes"]
