"""Step-exact checkpoints that survive preemption and crashes.

Layout: ``DIR/ckpt-000000123/`` holds ``state.*`` (a ``tf.train.Checkpoint`` of the model,
including RNG seed state, and the optimizer with its slots and iteration count) and
``meta.json`` (position: epoch, step in epoch, global step; and what the run was: model,
optimizer, weight shapes). Each checkpoint is written into a hidden temp folder and renamed into
place, so a kill -9 mid-write leaves only a temp folder, and the last complete checkpoint is
still the latest. TF checkpoints do not depend on the strategy: a 2-replica run resumes on 1 or 4.
The input position needs no saving beyond (epoch, step): the data order depends only on
(seed, epoch), so a resumed run skips the batches it has seen.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tensorflow as tf

from mirrorfit.errors import MirrorfitError

EXIT_PREEMPTED = 75  # sysexits EX_TEMPFAIL: "try again"; rerun the same command to resume
_NAME = re.compile(r"^ckpt-(\d+)$")


class CheckpointError(MirrorfitError):
    """A checkpoint that cannot be used: corrupt, or written by another model/optimizer."""


class Preempted(Exception):
    """Raised by :class:`PreemptionGuard` after it saved a checkpoint on SIGTERM/SIGINT."""

    def __init__(self, signal_name: str, path: Path, epoch: int, step: int) -> None:
        super().__init__(f"{signal_name}: saved {path} at epoch {epoch + 1}, step {step}; "
                         "rerun the same command to resume")
        self.path = path


@dataclass(frozen=True)
class Restored:
    """Where a restored run continues from."""

    path: Path
    epoch: int  # epochs completed
    step_in_epoch: int
    step: int


def identity(trainer, model_spec: str) -> dict[str, Any]:
    """What must match for a checkpoint to be restorable into ``trainer``."""
    return {"model": model_spec, "optimizer": type(trainer.optimizer).__name__,
            "weights": [list(map(int, w.shape)) for w in trainer.model.weights]}


class Checkpointer:
    """Save and restore a :class:`~mirrorfit.engine.trainer.Trainer` in ``directory``.

    ``every`` is in optimizer steps (checked after each compiled execution; 0: epoch ends
    only); ``keep`` is how many recent checkpoints stay on disk.
    """

    def __init__(self, directory: str | Path, *, trainer, model_spec: str, every: int = 0,
                 keep: int = 3) -> None:
        self.directory = Path(directory)
        self.trainer = trainer
        self.every, self.keep = every, keep
        self.identity = identity(trainer, model_spec)
        # Keras's seed-generator state (Dropout's RNG) is a model variable that the model's
        # own checkpoint dependencies miss: list every model variable explicitly too.
        self._state = tf.train.Checkpoint(model=trainer.model, optimizer=trainer.optimizer,
                                          variables=[v.value for v in trainer.model.variables])
        self._last_saved_step = -1

    # -- reading ---------------------------------------------------------------------------
    def checkpoints(self) -> list[Path]:
        """Complete checkpoints, oldest first."""
        return list_checkpoints(self.directory)

    def restore_latest(self) -> Restored | None:
        """Restore the newest checkpoint into the trainer; None if there is none."""
        found = self.checkpoints()
        if not found:
            return None
        path = found[-1]
        meta = read_meta(path)
        self._check_identity(path, meta)
        try:
            self._state.read(str(path / "state")).assert_existing_objects_matched()
        except Exception as e:  # TF raises OpError, ValueError, IndexError... on bad files
            raise CheckpointError(f"checkpoint {path} cannot be read ({type(e).__name__}: "
                                  f"{str(e).splitlines()[0][:200]}); pass --fresh to start over "
                                  "or delete that folder to fall back to an older one") from None
        t = self.trainer
        t.epoch, t.step_in_epoch, t.step = meta["epoch"], meta["step_in_epoch"], meta["step"]
        self._last_saved_step = t.step
        return Restored(path, t.epoch, t.step_in_epoch, t.step)

    def _check_identity(self, path: Path, meta: dict) -> None:
        theirs, ours = meta.get("identity", {}), self.identity
        for key in ("model", "optimizer", "weights"):
            if theirs.get(key) != ours[key]:
                what = "weight shapes" if key == "weights" else key
                detail = "" if key == "weights" else f": {theirs.get(key)!r} vs {ours[key]!r}"
                raise CheckpointError(
                    f"checkpoint {path} was written by another run ({what} differ{detail}); "
                    "pass --fresh to start over, or use another --checkpoint-dir")

    # -- writing ---------------------------------------------------------------------------
    def save(self) -> Path:
        """Write a checkpoint of the trainer's current position atomically; prune old ones."""
        t = self.trainer
        final = self.directory / f"ckpt-{t.step:09d}"
        if final.exists():
            return final
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self.directory / f".{final.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        self._state.write(str(tmp / "state"))
        meta = {"epoch": t.epoch, "step_in_epoch": t.step_in_epoch, "step": t.step,
                "identity": self.identity, "time": time.time(), "format": 1}
        with open(tmp / "meta.json", "w") as f:
            json.dump(meta, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(tmp)
        os.rename(tmp, final)  # the commit point: before it, the previous checkpoint is latest
        _fsync_dir(self.directory)
        self._last_saved_step = t.step
        for old in self.checkpoints()[:-self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        return final

    def discard(self) -> Path | None:
        """Move existing checkpoints aside (``--fresh``); nothing is deleted. Returns where."""
        found = self.checkpoints()
        if not found:
            return None
        aside = self.directory / f"discarded-{time.strftime('%Y%m%d-%H%M%S')}"
        aside.mkdir()
        for p in found:
            os.rename(p, aside / p.name)
        return aside

    def clean_partial(self) -> None:
        """Remove temp folders left by a write that was killed."""
        if self.directory.is_dir():
            for p in self.directory.glob(".ckpt-*.tmp-*"):
                shutil.rmtree(p, ignore_errors=True)

    # -- trainer hooks ---------------------------------------------------------------------
    def step_hook(self, trainer) -> None:
        """Save every ``every`` steps (called after each compiled execution)."""
        if self.every and trainer.step // self.every > max(self._last_saved_step, 0) // self.every:
            self.save()

    def epoch_callback(self, epoch: int, logs: dict) -> None:
        self.save()


def list_checkpoints(directory: Path) -> list[Path]:
    """Complete checkpoint folders in ``directory``, oldest first (temp folders excluded)."""
    if not directory.is_dir():
        return []
    found = [p for p in directory.iterdir() if _NAME.match(p.name) and p.is_dir()]
    return sorted(found, key=lambda p: int(_NAME.match(p.name).group(1)))


def read_meta(path: Path) -> dict:
    """The metadata of checkpoint folder ``path``; CheckpointError if unreadable."""
    try:
        meta = json.loads((path / "meta.json").read_text())
        for key in ("epoch", "step_in_epoch", "step"):
            int(meta[key])
        return meta
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"checkpoint {path / 'meta.json'} is corrupt or missing "
                              f"({type(e).__name__}); pass --fresh to start over") from None


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class PreemptionGuard:
    """On SIGTERM or SIGINT, finish the steps in flight, save, and raise :class:`Preempted`.

    Use as a context manager around ``fit`` and pass ``guard.hook`` in ``hooks``. Python runs
    signal handlers between compiled executions, so at most ``steps_per_execution`` steps
    finish after the signal.
    """

    def __init__(self, checkpointer: Checkpointer) -> None:
        self.checkpointer = checkpointer
        self.signal_name: str | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> "PreemptionGuard":
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._on_signal)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _on_signal(self, signum, frame) -> None:
        self.signal_name = signal.Signals(signum).name

    def hook(self, trainer) -> None:
        if self.signal_name:
            path = self.checkpointer.save()
            raise Preempted(self.signal_name, path, trainer.epoch, trainer.step)


def load_model(directory: str | Path):
    """The model of the newest checkpoint in ``directory``, rebuilt outside any strategy.

    Returns (model, meta). Only the model's variables are read (not the optimizer's).
    """
    from mirrorfit.models import model_factory

    directory = Path(directory)
    found = list_checkpoints(directory)
    if not found:
        raise CheckpointError(f"no checkpoint in {directory}; train with --checkpoint-dir "
                              f"{directory} first")
    meta = read_meta(found[-1])
    model = model_factory(meta["identity"]["model"])()
    try:
        tf.train.Checkpoint(model=model).read(str(found[-1] / "state")).expect_partial() \
            .assert_existing_objects_matched()
    except Exception as e:  # TF raises OpError, ValueError, IndexError... on bad files
        raise CheckpointError(f"checkpoint {found[-1]} cannot be read ({type(e).__name__}); "
                              "is it from this model?") from None
    return model, meta
