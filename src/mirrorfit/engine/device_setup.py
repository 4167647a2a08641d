"""What both engines' device set-up shares: the chosen devices as one value, and the checks of
what a user asked for (``--devices``, ``--replicas``, ``--visible-devices``) against what the
host has. Each engine's ``devices`` module finds the devices its framework sees."""

from __future__ import annotations

from dataclasses import dataclass, field

from mirrorfit.distribute._cpu_binding import usable_cpus
from mirrorfit.errors import ConfigError


@dataclass(frozen=True)
class DeviceSetup:
    """The devices one replica each runs on. ``shared_cores``: logical splits of one CPU, sharing
    its physical cores (more replicas then measure distribution overhead, not extra compute).
    ``handles``: the framework's device objects in ``devices``' order (JAX's; empty on TensorFlow,
    which names devices by string). ``engine``: said after the devices at a run's start ("" for the
    default engine).
    """

    kind: str  # "GPU" or "CPU"
    devices: tuple[str, ...]
    physical: tuple[str, ...]
    shared_cores: bool
    engine: str = ""
    handles: tuple = field(default=(), compare=False, repr=False)

    @property
    def replicas(self) -> int:
        return len(self.devices)

    def describe(self) -> str:
        """One line for the start of a run."""
        line = f"{self.replicas} replica(s) on {', '.join(self.devices)}"
        if self.engine:
            line += f" ({self.engine})"
        if self.shared_cores and self.replicas > 1:
            line += (
                f" (logical CPU devices sharing the same {usable_cpus()} CPU(s): "
                "useful for testing and measuring distribution overhead, not for speed-up)"
            )
        return line


def choose(
    available: list[str], devices: tuple[str, ...], replicas: int | None, kind: str, listing: str
) -> list[str]:
    """The names of the devices to replicate over, of ``available`` (as the engine names
    them): ``devices`` if given, else all; the first ``replicas`` of those. ``listing`` is
    the command that lists them, for the error line."""
    chosen = list(devices) if devices else list(available)
    known = {norm(a): a for a in available}
    unknown = [d for d in chosen if norm(d) not in known]
    if unknown:
        raise ConfigError(
            f"unknown device(s) {', '.join(unknown)}; available: "
            f"{', '.join(available)} (see `{listing}`)"
        )
    n = replicas or len(chosen)
    if n > len(chosen):
        raise ConfigError(
            f"asked for {n} replicas but only {len(chosen)} {kind} device(s) are "
            f"available ({', '.join(chosen)}); use --replicas {len(chosen)} or fewer"
        )
    return [known[norm(d)] for d in chosen[:n]]


def visible_indices(spec: str, count: int) -> list[int]:
    """``--visible-devices`` ("0,2", like CUDA_VISIBLE_DEVICES) as indices of ``count`` GPUs."""
    try:
        wanted = [int(i) for i in spec.split(",") if i.strip()]
    except ValueError:
        raise ConfigError(
            f"--visible-devices {spec!r} must be comma-separated GPU indices like 0,1"
        ) from None
    bad = [i for i in wanted if not 0 <= i < count]
    if bad:
        raise ConfigError(
            f"--visible-devices {spec!r}: no GPU {bad[0]}; this host has {count} GPU(s)"
        )
    return wanted


def norm(name: str) -> str:
    """A device name without TensorFlow's long prefixes, lower case: "/cpu:0"."""
    return name.lower().replace("/device:", "/").replace("/job:localhost/replica:0/task:0", "")
