"""The JAX engine's devices: the GPUs JAX sees, or N logical CPU devices (XLA's host platform
device count, what ``--replicas N`` splits the CPU into on TensorFlow too).

The CPU device count and the GPU memory settings are read when JAX initialises its backends
(the first ``jax.devices()``), so :func:`configure_devices` must come first in a process;
after that a different count is one ConfigError line, as on TensorFlow.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from mirrorfit.distribute import _host_memory
from mirrorfit.distribute._cpu_binding import usable_cpus
from mirrorfit.errors import ConfigError


@dataclass(frozen=True)
class DeviceSetup:
    """The devices one replica each runs on (``jax_devices``: the jax.Device objects, in the
    order of ``devices``). ``shared_cores``: logical splits of one CPU, which share its cores."""

    kind: str  # "GPU" or "CPU"
    devices: tuple[str, ...]
    physical: tuple[str, ...]
    shared_cores: bool
    jax_devices: tuple = field(default=(), compare=False, repr=False)

    @property
    def replicas(self) -> int:
        return len(self.devices)

    def describe(self) -> str:
        """One line for the start of a run."""
        line = f"{self.replicas} replica(s) on {', '.join(self.devices)} (JAX)"
        if self.shared_cores and self.replicas > 1:
            line += (f" (logical CPU devices sharing the same {usable_cpus()} CPU(s): "
                     "useful for testing and measuring distribution overhead, not for speed-up)")
        return line


def configure_devices(*, replicas: int | None = None, devices: tuple[str, ...] = (),
                      visible_devices: str | None = None, memory_growth: bool = True,
                      memory_limit_mb: int | None = None, threads: int | None = None,
                      keep_freed_memory: bool = False, cluster=None,
                      collective_timeout_s: float | None = None) -> DeviceSetup:
    """The devices to replicate over, as :func:`mirrorfit.engine.tensorflow.devices.
    configure_devices` chooses them: GPUs (``visible_devices`` "0,2" picks them by index,
    ``replicas`` takes the first N), else ``replicas`` logical CPU devices. ``memory_growth``
    (the default) lets JAX take GPU memory as it needs it instead of 75% up front;
    ``memory_limit_mb`` caps what it takes (MB per GPU). ``threads``: 1 runs XLA's CPU
    computations on one thread (N workers on N cores); JAX has no setting for other counts.

    ``cluster`` (a :class:`~mirrorfit.distribute.cluster.Cluster`, for ``--strategy
    multi-worker``): join its job first (:func:`mirrorfit.engine.jax.processes.join`, waiting
    up to ``collective_timeout_s`` for the others); the devices returned are this process's,
    the mesh (``build_distribution``) spans every process's."""
    if threads not in (None, 1):
        raise ConfigError(f"--threads-per-worker {threads}: the JAX engine can run a worker's CPU "
                          "work on one thread (1) or on all of its cores (leave it out)")
    _before_backends(replicas or (len(devices) if devices else 1), memory_growth,
                     memory_limit_mb, threads)
    if cluster is not None:
        from mirrorfit.engine.jax import processes

        processes.join(cluster, **({} if collective_timeout_s is None
                                   else {"timeout_s": collective_timeout_s}))
    import jax

    gpus = _gpus(jax)
    if visible_devices is not None:
        gpus = _select(gpus, visible_devices)
    if gpus:
        kind, found = "GPU", gpus
        physical = tuple(f"{d.platform}:{d.id} {getattr(d, 'device_kind', '')}".strip()
                         for d in gpus)
    else:
        kind, found = "CPU", jax.local_devices(backend="cpu")
        physical = ("cpu",)
    names = [f"/{kind.lower()}:{i}" for i in range(len(found))]
    chosen = list(devices) if devices else names
    unknown = [d for d in chosen if _norm(d) not in {_norm(a) for a in names}]
    if unknown:
        raise ConfigError(f"unknown device(s) {', '.join(unknown)}; available: "
                          f"{', '.join(names)} (see `mirrorfit devices --backend jax`)")
    n = replicas or len(chosen)
    if n > len(chosen):
        raise ConfigError(f"asked for {n} replicas but only {len(chosen)} {kind} device(s) are "
                          f"available ({', '.join(chosen)}); use --replicas {len(chosen)} or fewer")
    picked = [found[names.index(_norm_name(d, names))] for d in chosen[:n]]
    if keep_freed_memory:
        _host_memory.keep_freed_memory()
    return DeviceSetup(kind=kind, devices=tuple(_norm_name(d, names) for d in chosen[:n]),
                       physical=physical, shared_cores=kind == "CPU", jax_devices=tuple(picked))


def _before_backends(cpu_devices: int, memory_growth: bool, memory_limit_mb: int | None,
                     threads: int | None) -> None:
    """What JAX reads when its backends start: the CPU device count, GPU memory, CPU threads.
    Settings the user made in the environment win."""
    if memory_limit_mb:
        total = _gpu_memory_mb()
        if total:
            os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION",
                                  f"{min(0.99, memory_limit_mb / total):.4f}")
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "true")
    elif memory_growth:
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    if threads == 1 and "xla_cpu_multi_thread_eigen" not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                                   + " --xla_cpu_multi_thread_eigen=false").strip()
    import jax

    try:
        if jax.config.jax_num_cpu_devices != cpu_devices and cpu_devices > 1:
            jax.config.update("jax_num_cpu_devices", cpu_devices)
    except RuntimeError as e:  # the backends already started with another count
        raise ConfigError("devices can only be configured before JAX starts; in your own script "
                          f"call configure_devices() first, or run it in a fresh process ({e})"
                          ) from None


def _gpus(jax) -> list:
    try:
        return list(jax.local_devices(backend="gpu"))
    except RuntimeError:  # no CUDA/ROCm backend in this jaxlib, or no GPU
        return []


def _gpu_memory_mb() -> int | None:
    try:
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
        return pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).total >> 20
    except Exception:  # no NVML, no GPU: no cap to apply
        return None


def _select(gpus: list, spec: str) -> list:
    try:
        wanted = [int(i) for i in spec.split(",") if i.strip()]
    except ValueError:
        raise ConfigError(f"--visible-devices {spec!r} must be comma-separated GPU indices "
                          "like 0,1") from None
    bad = [i for i in wanted if not 0 <= i < len(gpus)]
    if bad:
        raise ConfigError(f"--visible-devices {spec!r}: no GPU {bad[0]}; this host has "
                          f"{len(gpus)} GPU(s)")
    return [gpus[i] for i in wanted]


def _norm(name: str) -> str:
    return name.lower().replace("/device:", "/").replace("/job:localhost/replica:0/task:0", "")


def _norm_name(name: str, names: list[str]) -> str:
    return next(a for a in names if _norm(a) == _norm(name))


def list_devices() -> list[dict[str, str]]:
    """What JAX sees on this host (for ``mirrorfit devices --backend jax``)."""
    import jax

    out = [{"type": "CPU", "name": "/cpu:0"}]
    for i, d in enumerate(_gpus(jax)):
        out.append({"type": "GPU", "name": f"/gpu:{i}", "model": getattr(d, "device_kind", "")})
    return out
