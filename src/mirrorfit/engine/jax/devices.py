"""The JAX engine's devices: the GPUs JAX sees, or N logical CPU devices (XLA's host platform
device count). JAX reads these settings at its first ``jax.devices()``, so
:func:`configure_devices` comes first in a process; a later, different count is a ConfigError.
"""

from __future__ import annotations

import os

from mirrorfit.distribute import _host_memory
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
    """The devices to replicate over, chosen as on TensorFlow: GPUs (``visible_devices`` "0,2"
    by index, ``replicas`` the first N), else ``replicas`` logical CPU devices;
    ``memory_limit_mb`` caps GPU memory (MB per GPU); ``threads``: only 1 (XLA on one thread).
    With ``cluster``, join its job first (waiting up to ``collective_timeout_s`` seconds): the
    devices returned are this process's. (why: docs/architecture.md#jax-devices)
    """
    if threads not in (None, 1):
        raise ConfigError(
            f"--threads-per-worker {threads}: the JAX engine can run a worker's CPU "
            "work on one thread (1) or on all of its cores (leave it out)"
        )
    _before_backends(
        replicas or (len(devices) if devices else 1), memory_growth, memory_limit_mb, threads
    )
    if cluster is not None:
        from mirrorfit.engine.jax import processes

        processes.join(
            cluster, **({} if collective_timeout_s is None else {"timeout_s": collective_timeout_s})
        )
    import jax

    _start(jax)
    gpus = _gpus(jax)
    if visible_devices is not None:
        gpus = _select(gpus, visible_devices)
    if gpus:
        kind, found = "GPU", gpus
        physical = tuple(
            f"{d.platform}:{d.id} {getattr(d, 'device_kind', '')}".strip() for d in gpus
        )
    else:
        kind, found = "CPU", jax.local_devices(backend="cpu")
        physical = ("cpu",)
    names = [f"/{kind.lower()}:{i}" for i in range(len(found))]
    chosen = choose(names, devices, replicas, kind, "mirrorfit devices --backend jax")
    if keep_freed_memory:
        _host_memory.keep_freed_memory()
    return DeviceSetup(
        kind=kind,
        devices=tuple(chosen),
        physical=physical,
        shared_cores=kind == "CPU",
        engine="JAX",
        handles=tuple(found[names.index(d)] for d in chosen),
    )


def _before_backends(
    cpu_devices: int, memory_growth: bool, memory_limit_mb: int | None, threads: int | None
) -> None:
    """What JAX reads when its backends start: the CPU device count, GPU memory, CPU threads.
    Settings the user made in the environment win."""
    if memory_limit_mb:
        total = _gpu_memory_mb()
        if total:
            os.environ.setdefault(
                "XLA_PYTHON_CLIENT_MEM_FRACTION", f"{min(0.99, memory_limit_mb / total):.4f}"
            )
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "true")
    elif memory_growth:
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    if threads == 1 and "xla_cpu_multi_thread_eigen" not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (
            os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false"
        ).strip()
    import jax

    try:
        if jax.config.jax_num_cpu_devices != cpu_devices and cpu_devices > 1:
            jax.config.update("jax_num_cpu_devices", cpu_devices)
    except RuntimeError as e:  # the backends already started with another count
        raise ConfigError(
            "devices can only be configured before JAX starts; in your own script "
            f"call configure_devices() first, or run it in a fresh process ({e})"
        ) from None


def _start(jax) -> None:
    """Start JAX's backends; the platforms ``JAX_PLATFORMS`` names that this host cannot run
    (cuda without a GPU, a typo) are one ConfigError line instead of JAX's AssertionError."""
    try:
        jax.devices()
    except (RuntimeError, AssertionError) as e:
        asked = os.environ.get("JAX_PLATFORMS", "")
        said = (str(e).strip().splitlines() or [""])[0][:200]
        raise ConfigError(
            f"JAX_PLATFORMS={asked!r}: JAX cannot start "
            f"{'it' if asked else 'a backend'} on this host"
            + (f" ({said})" if said else "")
            + "; unset JAX_PLATFORMS to use the devices there are, or set it "
            "to cpu" + ("; for NVIDIA GPUs install jax[cuda12]" if "cuda" in asked else "")
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
    return [gpus[i] for i in visible_indices(spec, len(gpus))]


def list_devices() -> list[dict[str, str]]:
    """What JAX sees on this host (for ``mirrorfit devices --backend jax``)."""
    import jax

    _start(jax)
    out = [{"type": "CPU", "name": "/cpu:0"}]
    for i, d in enumerate(_gpus(jax)):
        out.append({"type": "GPU", "name": f"/gpu:{i}", "model": getattr(d, "device_kind", "")})
    return out
