"""Workers of one job agree on the settings that must match, before the first step: every worker
hashes each such setting, small gathers compare them, and a difference is one line on every
worker naming the flag and each worker's value (exit 2).
(why: docs/architecture.md#settings-the-workers-agree-on)
"""

from __future__ import annotations

import dataclasses
import hashlib

from mirrorfit.config import TrainConfig
from mirrorfit.data.spec import KINDS
from mirrorfit.errors import ConfigError

# What may differ from worker to worker: where this process finds things or writes its own
# outputs (paths differ between hosts: the data are compared by what they hold, below), how
# it uses its own host, and what only the chief writes. Every other setting, a new one too,
# must match.
PER_WORKER = frozenset(
    {
        "data",
        "data_dir",
        "cache",
        "checkpoint_dir",
        "devices",
        "visible_devices",
        "memory_growth",
        "threads_per_worker",
        "gpu_memory_limit",
        "collective_timeout",
        "logdir",
        "metrics_out",
        "progress",
        "keep_checkpoints",
        "export_dir",
        "export_preprocessing",
        "save_keras",
        "dataset",  # the older name of --data
        # compared as what they resolve to (--batch-size 32 on 2 replicas is --global-batch-size 64)
        "replicas",
        "batch_size",
        "global_batch_size",
        "eval_batch_size",
    }
)
_TEXT = 60  # bytes of a value shown in the message
_COLUMNS = 3  # a setting's hash: 63 bits, as 3 values of 21 bits (exact in every gather)


def must_match(config: TrainConfig, replicas: int, local_replicas: int) -> dict[str, str]:
    """The settings every worker must share: flag -> its value as text (``replicas``: over
    all workers, for the batch sizes they resolve to)."""
    values = {
        "--" + f.name.replace("_", "-"): _text(getattr(config, f.name))
        for f in dataclasses.fields(config)
        if f.name not in PER_WORKER
    }
    values["--optimizer"] = config.optimizer.lower()  # as a resume compares it
    _, global_batch = config.batch_sizes(replicas)
    values["--replicas"] = f"{local_replicas} per worker"
    values["--global-batch-size"] = str(global_batch)
    values["--eval-batch-size"] = str(config.eval_batch_size or global_batch)
    return values


def data_summary(data) -> dict[str, str]:
    """What the workers' training data must share, whatever their paths: its examples, the
    shape of one and the classes, and the hash of its bytes where the source's fingerprint
    is one (arrays: MNIST, a .npz, a function's; not files, whose fingerprint holds their
    times, which differ between two hosts' copies)."""
    summary = {
        "the training data": f"{data.train_examples} examples of shape "
        f"{tuple(data.input_shape)}, {data.num_classes} classes"
    }
    if not KINDS[data.kind].files:
        summary["the training data's content"] = f"hash {data.fingerprint}"
    return summary


def check_agreement(settings: dict[str, str], dist) -> None:
    """ConfigError on every worker when ``settings`` (from :func:`must_match`) differ between
    workers of ``dist`` (a distribution or placement with ``gather``): the first differing
    flag with each worker's value, and the others by name. Free on one process."""
    if dist.workers == 1:
        return
    names = sorted(settings)
    # First the list itself, in a gather of one shape whatever it holds: two versions of
    # mirrorfit would otherwise meet in a gather of two shapes (an abort, not a line).
    counts = dist.gather([len(names), *_hash("\n".join(names))])
    if len({tuple(row) for row in counts.tolist()}) > 1:
        raise ConfigError(
            f"{dist.task}: the workers run different versions of mirrorfit "
            f"({', '.join(str(row[0]) for row in counts.tolist())} settings); "
            "install the same one on every worker"
        )
    table = dist.gather([part for n in names for part in _hash(settings[n])])
    differ = [
        n
        for i, n in enumerate(names)
        if len({tuple(row[i * _COLUMNS : (i + 1) * _COLUMNS]) for row in table.tolist()}) > 1
    ]
    if not differ:
        return
    flag = differ[0]
    texts = dist.gather(list(_encode(settings[flag])))
    each = ", ".join(f"worker {w}: {flag} {_decode(row)}" for w, row in enumerate(texts))
    also = f" (they differ in {', '.join(differ[1:])} too)" if len(differ) > 1 else ""
    same = f"the same {flag}" if flag.startswith("--") else "the same data (copies of it)"
    raise ConfigError(
        f"{dist.task}: the workers disagree on {flag} ({each}){also}; give every "
        f"worker {same}, or they train different models"
    )


def _text(value) -> str:
    return value if isinstance(value, str) else repr(value)


def _hash(text: str) -> list[int]:
    digest = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")
    return [(digest >> (21 * i)) & ((1 << 21) - 1) for i in range(_COLUMNS)]


def _encode(text: str) -> bytes:
    raw = text.encode()
    if len(raw) > _TEXT:  # cut on a character, marked
        raw = raw[: _TEXT - 3].decode(errors="ignore").encode() + "…".encode()
    return raw + b"\0" * (_TEXT - len(raw))


def _decode(row) -> str:
    raw = bytes(int(b) for b in row).rstrip(b"\0")
    return raw.decode(errors="replace")
