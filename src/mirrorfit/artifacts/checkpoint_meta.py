"""A checkpoint folder's checkpoints, found, set aside and discarded, and the checks on them
that read no state: a folder entry that cannot be read safely, and ``settings`` (the flags
fixing the saved state's meaning; None: does not apply, not compared) changed since, named
before any state is read. The format itself: artifacts/epoch_checkpoint.py.
(why: docs/architecture.md#checkpoints)
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Any, Mapping

from mirrorfit.errors import MirrorfitError

_NAME = re.compile(r"ckpt-([0-9]+)")  # fullmatch, ASCII: \d and $ take "٣" and a newline


class CheckpointError(MirrorfitError):
    """A checkpoint that cannot be used: corrupt, or written by another model/optimizer."""

    def __init__(self, message: str, *, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason or message  # what is wrong, without the advice


class StructureError(Exception):
    """A checkpoint's state files were read, but hold other objects than this run's (another
    model or optimizer): the engines' state readers raise it (not damage: never set aside)."""


MAX_META_BYTES = 1 << 20  # meta.json is a few KB; a hand-made one may not take the memory


def special_file(path: Path) -> str | None:
    """What makes checkpoint folder ``path`` unreadable without blocking or reading without
    bound: an entry (links followed) that is no plain file or folder (opening a FIFO waits for
    a writer forever; /dev/zero never ends), or a meta.json over MAX_META_BYTES."""
    for entry in path.iterdir():
        try:
            info = entry.stat()
        except OSError:
            continue  # a dangling link: what reads it says so
        if not (stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode)):
            return f"{entry.name} is not a plain file"
        if entry.name == "meta.json" and info.st_size > MAX_META_BYTES:
            return f"meta.json is over {MAX_META_BYTES >> 20} MiB"
    return None


def settings_of(config) -> dict[str, Any]:
    """The flags of ``config`` (a TrainConfig) that fix what the checkpointed state means:
    another model, optimizer, learning-rate schedule or precision would not continue the same
    run (and Keras would keep the old rate: the learning rate is an optimizer variable), so a
    resume with any of them changed is refused by name, whichever loop trains. Free to
    change: --epochs, --steps-per-execution, --xla, --remat, --checkpoint-every and the
    outputs."""
    linear = config.lr_scaling == "linear"
    return {
        "--model": config.model,
        "--optimizer": config.optimizer.lower(),
        "--lr": config.lr,
        "--lr-scaling": config.lr_scaling,
        "--base-batch": config.base_batch if linear else None,
        "--warmup-epochs": config.warmup_epochs,
        "--precision": config.precision,
        "--backend": config.backend,
    }


# Settings whose None is a value of its own, not "does not apply": every example.
_NONE_IS_A_VALUE = ("--train-examples",)


def check_settings(path: Path, meta: dict, ours: Mapping[str, Any]) -> None:
    """Refuse a run whose settings differ from those ``path`` was written with, naming each
    changed flag, its original value, and --fresh."""
    theirs = meta.get("settings", {})
    changed = [
        f
        for f, v in ours.items()
        if f in theirs
        and theirs[f] != v
        and (f in _NONE_IS_A_VALUE or (v is not None and theirs[f] is not None))
    ]
    if changed:
        was = " ".join(as_flag(f, theirs[f]) for f in changed)
        now = " ".join(as_flag(f, ours[f]) for f in changed)
        raise CheckpointError(
            f"checkpoint {path} was written with {was}, this run has {now}: "
            f"resume with {was}, or pass --fresh to start over"
        )


def as_flag(flag: str, value: Any) -> str:
    return f"no {flag}" if value is None else f"{flag} {value}"


def list_checkpoints(directory: Path) -> list[Path]:
    """Complete checkpoint folders in ``directory``, oldest first (temp folders excluded)."""
    if not directory.is_dir():
        return []
    found = [p for p in directory.iterdir() if _NAME.fullmatch(p.name) and p.is_dir()]
    return sorted(found, key=lambda p: int(_NAME.fullmatch(p.name).group(1)))


# mirrorfit.fit's checkpoints (artifacts/epoch_checkpoint.py): epoch-EEEEEE[-step-SSSSSS]
FIT_FOLDER = re.compile(r"epoch-([0-9]{6,9})(?:-step-([0-9]{6,9}))?", re.ASCII)  # fullmatch


def fit_checkpoints(directory: Path) -> list[Path]:
    """``mirrorfit.fit``'s complete checkpoints in ``directory`` (with a meta.json), oldest
    first."""
    found = []
    for p in Path(directory).glob("epoch-*"):
        named = FIT_FOLDER.fullmatch(p.name)
        if named and (p / "meta.json").is_file():
            found.append(((int(named[1]), int(named[2] or 0)), p))
    return [p for _, p in sorted(found)]


def require_checkpoints(directory: str | Path) -> list[Path]:
    """``mirrorfit.fit``'s checkpoints in ``directory`` (:func:`fit_checkpoints`), or
    CheckpointError, one line, when there is none, the folder cannot be read, or it holds the
    earlier loop's (:func:`list_checkpoints`). Plain Python: ``export`` and ``evaluate`` call
    it before TensorFlow loads."""
    directory = Path(directory)
    try:
        if not stat.S_ISDIR(os.stat(directory).st_mode):
            raise CheckpointError(
                f"--checkpoint-dir {directory} is a file; give the folder "
                "that training wrote its checkpoints to"
            )
        train_loop, fit = list_checkpoints(directory), fit_checkpoints(directory)
        found = train_loop or fit
    except FileNotFoundError:
        found = []
        if os.path.islink(directory):
            raise CheckpointError(
                f"--checkpoint-dir {directory} is a link to nothing ({os.readlink(directory)})"
            ) from None
    except (OSError, ValueError) as e:  # a loop of links, a folder this user may not read
        raise CheckpointError(
            f"cannot read --checkpoint-dir {directory}: "
            f"{(getattr(e, 'strerror', None) or str(e)).lower()}"
        ) from None
    if not found:
        raise CheckpointError(
            f"no checkpoint in {directory}; train with --checkpoint-dir {directory} first"
        )
    if train_loop and fit:  # which is the newer run cannot be told: never the stale one
        raise CheckpointError(
            f"{directory} holds checkpoints of two runs, {train_loop[-1].name} (the earlier "
            f"loop's) and {fit[-1].name} (mirrorfit.fit's); move the run you do not mean "
            "to another folder"
        )
    if train_loop:  # one checkpoint format since the one loop: the earlier one is not read
        raise CheckpointError(
            f"{directory} holds checkpoints of mirrorfit train's earlier loop "
            f"({train_loop[-1].name}), which this version no longer reads; export them with "
            "the mirrorfit that wrote them, or train again"
        )
    return found


def set_aside(path: Path) -> Path:
    """Move checkpoint folder ``path`` out of the way as ``corrupt-NAME-TIME`` beside it (kept
    for whoever wants to look at it, never read again as a checkpoint); the new path."""
    import time

    aside = _unused(path.parent, f"corrupt-{path.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    os.rename(path, aside)
    return aside


def _unused(folder: Path, name: str) -> Path:
    """``folder / name``, or ``name-2``, ``name-3``... if taken (two set-asides in a second)."""
    path, n = folder / name, 1
    while os.path.lexists(path):
        n += 1
        path = folder / f"{name}-{n}"
    return path


def discard(directory: Path, found: list[Path]) -> Path | None:
    """Move the checkpoints ``found`` in ``directory`` into a new ``discarded-TIME`` folder
    there (``--fresh``, ``fit(fresh=True)``); nothing is deleted. Returns it (None: none)."""
    import time

    from mirrorfit._io import fsync_dir

    if not found:
        return None
    for n in range(1, 1000):  # --fresh twice in one second: a new name, not an error
        aside = directory / (
            f"discarded-{time.strftime('%Y%m%d-%H%M%S')}" + (f"-{n}" if n > 1 else "")
        )
        try:
            aside.mkdir()
            break
        except FileExistsError:
            continue
    for p in found:
        os.rename(p, aside / p.name)
    fsync_dir(directory)
    return aside
