"""Build the tf.distribute strategy from a name and a device list.

A strategy is a value chosen by name. Multi-worker and parameter-server strategies plug into
``_BUILDERS`` without touching the step or the loop.
"""

from __future__ import annotations

from typing import Callable

import tensorflow as tf

from mirrorfit.devices import DeviceSetup
from mirrorfit.errors import ConfigError


def _cross_device_ops(name: str, setup: DeviceSetup):
    if name == "auto":
        if setup.kind == "GPU":
            return None  # TF's choice: NCCL collectives on physical GPUs
        # TF's default on CPUs is a RING collective: measured 1.7x slower than reduce-to-one
        # for the MLP on 2 logical CPU replicas (benchmarks/textbook_vs_mirrorfit.py).
        return tf.distribute.ReductionToOneDevice()
    if name == "nccl":
        if setup.kind != "GPU":
            raise ConfigError("--cross-device-ops nccl needs GPUs; on CPU use auto, "
                              "hierarchical or reduce-to-one")
        return tf.distribute.NcclAllReduce()
    if name == "hierarchical":
        return tf.distribute.HierarchicalCopyAllReduce()
    return tf.distribute.ReductionToOneDevice()


def _single(setup: DeviceSetup, cross_device_ops: str) -> tf.distribute.Strategy:
    if setup.replicas != 1:
        raise ConfigError(f"--strategy single runs on one device but {setup.replicas} replicas "
                          "were asked for; use --replicas 1 or --strategy mirrored")
    return tf.distribute.OneDeviceStrategy(setup.devices[0])


def _mirrored(setup: DeviceSetup, cross_device_ops: str) -> tf.distribute.Strategy:
    return tf.distribute.MirroredStrategy(
        list(setup.devices), cross_device_ops=_cross_device_ops(cross_device_ops, setup))


def _central_storage(setup: DeviceSetup, cross_device_ops: str) -> tf.distribute.Strategy:
    # Variables live on the CPU (or the one GPU); compute is mirrored on the devices.
    return tf.distribute.experimental.CentralStorageStrategy(compute_devices=list(setup.devices))


_BUILDERS: dict[str, Callable[[DeviceSetup, str], tf.distribute.Strategy]] = {
    "single": _single,
    "mirrored": _mirrored,
    "central-storage": _central_storage,
}


def build_strategy(setup: DeviceSetup, *, kind: str = "auto",
                   cross_device_ops: str = "auto") -> tf.distribute.Strategy:
    """The strategy for ``setup``: auto is single on one device, mirrored on several."""
    if kind == "auto":
        kind = "single" if setup.replicas == 1 else "mirrored"
    if kind not in _BUILDERS:
        raise ConfigError(f"unknown strategy {kind!r}; choose one of: auto, {', '.join(_BUILDERS)}")
    return _BUILDERS[kind](setup, cross_device_ops)
