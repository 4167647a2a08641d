"""Discover and configure the local devices replicas run on.

Must run before TensorFlow initialises its runtime (the first op, strategy or model): logical
device splits and memory settings cannot change afterwards. That is why multi-replica tests run
in subprocesses.
"""

from __future__ import annotations

import tensorflow as tf

from mirrorfit.distribute import _host_memory

# threads_note is re-exported: job.train's way to it.
from mirrorfit.distribute._cpu_binding import threads_note  # noqa: F401
from mirrorfit.engine.device_setup import DeviceSetup, choose, visible_indices
from mirrorfit.errors import ConfigError

__all__ = ["DeviceSetup", "configure_devices", "list_devices"]


def configure_devices(
    *,
    replicas: int | None = None,
    devices: tuple[str, ...] = (),
    visible_devices: str | None = None,
    memory_growth: bool = True,
    memory_limit_mb: int | None = None,
    threads: int | None = None,
    keep_freed_memory: bool = False,
    cluster=None,
    collective_timeout_s: float | None = None,
) -> DeviceSetup:
    """Make the requested devices visible; return the ones to replicate over. ``visible_devices``
    ("0,2") selects GPUs like CUDA_VISIBLE_DEVICES; ``memory_limit_mb`` caps each GPU (MB;
    replaces memory growth, on by default); ``replicas`` takes the first N GPUs, or splits the CPU
    into N logical devices; ``threads`` sizes TF's thread pools (None: every core). (why, and
    ``keep_freed_memory``: docs/architecture.md#tensorflow-devices)
    """
    if threads:
        try:
            tf.config.threading.set_intra_op_parallelism_threads(threads)
            tf.config.threading.set_inter_op_parallelism_threads(threads)
        except RuntimeError as e:
            raise ConfigError(
                f"thread pools can only be sized before TensorFlow starts ({e})"
            ) from None
    gpus = tf.config.list_physical_devices("GPU")
    if visible_devices is not None:
        gpus = _select_gpus(gpus, visible_devices)
    try:
        if gpus:
            for gpu in gpus:
                if memory_limit_mb:  # a fixed cap and memory growth are exclusive in TF
                    tf.config.set_logical_device_configuration(
                        gpu, [tf.config.LogicalDeviceConfiguration(memory_limit=memory_limit_mb)]
                    )
                else:
                    tf.config.experimental.set_memory_growth(gpu, memory_growth)
            kind, available = "GPU", [f"/gpu:{i}" for i in range(len(gpus))]
            physical = tuple(g.name for g in gpus)
        else:
            cpu = tf.config.list_physical_devices("CPU")[0]
            n = replicas or (len(devices) if devices else 1)
            _split_cpu(cpu, n)
            kind, available = "CPU", [f"/cpu:{i}" for i in range(n)]
            physical = (cpu.name,)
    except RuntimeError as e:  # TF already initialised with another layout
        raise ConfigError(
            "devices can only be configured before TensorFlow starts; in your own script call "
            f"configure_devices() first, or run it in a fresh process ({e})"
        ) from None

    chosen = choose(available, devices, replicas, kind, "mirrorfit devices")
    if keep_freed_memory:  # only once the request is known to be good
        _host_memory.keep_freed_memory()
    return DeviceSetup(
        kind=kind, devices=tuple(chosen), physical=physical, shared_cores=kind == "CPU"
    )


def _split_cpu(cpu: tf.config.PhysicalDevice, n: int) -> None:
    current = tf.config.get_logical_device_configuration(cpu)
    if n <= (len(current) if current else 1):
        return  # enough logical devices already: use the first n
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * n)


def _select_gpus(gpus: list, spec: str) -> list:
    selected = [gpus[i] for i in visible_indices(spec, len(gpus))]
    try:
        tf.config.set_visible_devices(selected, "GPU")
    except RuntimeError as e:
        raise ConfigError(f"cannot change visible GPUs after TensorFlow started ({e})") from None
    return selected


def list_devices() -> list[dict[str, str]]:
    """What this host offers: physical devices with type and name (for ``mirrorfit devices``)."""
    out = []
    for dev in tf.config.list_physical_devices():
        info = {"type": dev.device_type, "name": dev.name}
        if dev.device_type == "GPU":
            details = tf.config.experimental.get_device_details(dev)
            info["model"] = details.get("device_name", "")
        out.append(info)
    return out
