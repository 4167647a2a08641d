"""Workers of one job agree on the settings that must match, before the first step.

Two workers with different ``--seed`` or ``--lr`` train different models without a word, and
different ``--epochs`` or ``--steps-per-execution`` end in a collective that never matches
(a gloo abort, a "stopped answering" that blames the wrong thing). At start-up every worker
hashes each such setting; one small gather compares them, and a difference is one line on
every worker naming the flag and each worker's value (exit 2).
"""

from __future__ import annotations

import dataclasses
import hashlib

from mirrorfit.config import TrainConfig
from mirrorfit.errors import ConfigError

# What may differ from worker to worker: where this process finds things or writes its own
# outputs, how it uses its own host, and what only the chief writes. Every other setting,
# a new one too, must match.
PER_WORKER = frozenset({
    "data_dir", "cache", "devices", "visible_devices", "memory_growth", "threads_per_worker",
    "gpu_memory_limit", "collective_timeout", "logdir", "metrics_out", "progress",
    "keep_checkpoints", "export_dir", "export_preprocessing", "save_keras",
    "dataset",  # the older name of --data, which is compared
    "replicas",  # compared as the replicas each worker resolved (None on one, 2 on another)
})
_TEXT = 60  # bytes of a value shown in the message


def must_match(config: TrainConfig, local_replicas: int) -> dict[str, str]:
    """The settings every worker must share: flag -> its value as text."""
    values = {"--" + f.name.replace("_", "-"): _text(getattr(config, f.name))
              for f in dataclasses.fields(config) if f.name not in PER_WORKER}
    values["--replicas"] = f"{local_replicas} per worker"
    return values


def check_agreement(settings: dict[str, str], dist) -> None:
    """ConfigError on every worker when ``settings`` (from :func:`must_match`) differ between
    workers of ``dist`` (a distribution or placement with ``gather``): the first differing
    flag with each worker's value, and the others by name. Free on one process."""
    if dist.workers == 1:
        return
    names = sorted(settings)
    table = dist.gather([_hash(settings[n]) for n in names])
    differ = [n for i, n in enumerate(names) if len(set(table[:, i].tolist())) > 1]
    if not differ:
        return
    flag = differ[0]
    texts = dist.gather(list(_encode(settings[flag])))
    each = ", ".join(f"worker {w}: {flag} {_decode(row)}" for w, row in enumerate(texts))
    also = f" (they differ in {', '.join(differ[1:])} too)" if len(differ) > 1 else ""
    raise ConfigError(f"{dist.task}: the workers disagree on {flag} ({each}){also}; give every "
                      f"worker the same {flag}, or they train different models")


def _text(value) -> str:
    return value if isinstance(value, str) else repr(value)


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=3).digest(), "big")


def _encode(text: str) -> bytes:
    raw = text.encode()[:_TEXT]
    return raw + b"\0" * (_TEXT - len(raw))


def _decode(row) -> str:
    raw = bytes(int(b) for b in row).rstrip(b"\0")
    return raw.decode(errors="replace")
