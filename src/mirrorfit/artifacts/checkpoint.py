"""Step-exact checkpoints that survive preemption and crashes.

``DIR/ckpt-000000123/`` holds the engine's state files (``state.*`` on TensorFlow,
``state.npz`` or Orbax ``state/`` on JAX) and ``meta.json`` (the position in epochs, steps and
examples, and what the run was), written into a hidden temp folder and renamed into place. A
run whose data order or settings changed is refused by name, from ``meta.json`` alone
(:mod:`mirrorfit.artifacts.checkpoint_meta`). (docs/checkpoints.md;
why: docs/architecture.md#checkpoints)
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from mirrorfit import _io
from mirrorfit.artifacts.checksums import file_sums, sealed
from mirrorfit.artifacts.commit import Commit
from mirrorfit.artifacts.commit import why as _why
from mirrorfit.artifacts.checkpoint_meta import (
    EPOCH_END_KEYS,
    FIT_FOLDER,
    FORMAT,
    CheckpointError,
    NewerFormatError,
    check_backend,
    check_data,
    check_epoch_logs,
    check_files,
    StructureError,
    check_identity,
    check_settings,
    decode_epoch_logs,
    fit_checkpoints,
    encode_epoch_logs,
    list_checkpoints,
    read_meta,
    discard,
    require_checkpoints,
    set_aside,
)
from mirrorfit.data.pipeline import DataOrder
from mirrorfit.artifacts.position import Position
from mirrorfit.errors import DivergedError

__all__ = [
    "CheckpointError",
    "Checkpointer",
    "Restored",
    "identity",
    "list_checkpoints",
    "load_model",
    "read_meta",
]


@dataclass(frozen=True)
class Restored:
    """Where a restored run continues from."""

    path: Path
    epoch: int  # epochs completed
    step_in_epoch: int
    step: int
    # At an epoch's last step: whether that epoch's end counts as done (a checkpoint of format
    # < 4, which cannot tell) or is still to run (the resumed run runs it).
    ended: bool = False


def identity(trainer, model_spec: str) -> dict[str, Any]:
    """What must match for a checkpoint to be restorable into ``trainer``; the input shape and
    classes let ``export``/``evaluate`` rebuild the model the data shaped (not the default)."""
    model = trainer.model
    try:
        input_shape = [int(d) for d in model.inputs[0].shape[1:]]
        num_classes = int(model.outputs[0].shape[-1])
    except (AttributeError, IndexError, TypeError, ValueError):  # subclassed, unknown dims
        input_shape, num_classes = None, None
    return {
        "model": model_spec,
        "optimizer": type(trainer.optimizer).__name__,
        "weights": [list(map(int, w.shape)) for w in model.weights],
        "input_shape": input_shape,
        "num_classes": num_classes,
    }


class Checkpointer:
    """Save and restore a :class:`~mirrorfit.engine.controller.Trainer` in ``directory``.
    ``every``: optimizer steps between saves (0: epoch ends only); ``keep``: checkpoints kept;
    ``data``/``flags``/``settings``: what a resume must match, and the flags to name
    (docs/architecture.md#checkpoints); ``on_notice``: one line on a fallback; ``writer``: this
    process keeps what it saves (the chief); ``allow_nan``: save non-finite weights.
    """

    def __init__(
        self,
        directory: str | Path,
        *,
        trainer,
        model_spec: str,
        every: int = 0,
        keep: int = 3,
        data: DataOrder | None = None,
        flags: Mapping[str, Mapping[str, Any]] | None = None,
        settings: Mapping[str, Any] | None = None,
        on_notice: Callable[[str], None] = print,
        writer: bool = True,
        class_names: Sequence[str] | None = None,
        allow_nan: bool = False,
    ) -> None:
        self.directory = Path(directory)
        self.allow_nan = allow_nan
        self.trainer = trainer
        self.every, self.keep = every, keep
        self.identity = identity(trainer, model_spec)
        if data is not None and data.global_batch != trainer.global_batch:
            raise ValueError(
                f"the data's global batch {data.global_batch} is not the "
                f"trainer's {trainer.global_batch}"
            )
        # Without the data's order, the global batch (the step's unit) is still known.
        self.data = dataclasses.asdict(data) if data else {"global_batch": trainer.global_batch}
        self.flags = {k: dict(v) for k, v in (flags or {}).items()}
        self.settings = dict(settings or {})
        # Label i's name, for `mirrorfit export` to put into the SavedModel (None: unnamed).
        self.class_names = list(class_names) if class_names else None
        self._on_notice = on_notice
        self.writer = writer
        self._state = trainer.runner.checkpoint_state()  # the engine's files
        self._last_saved_step = -1
        self._pending: Commit | None = None  # a save still being written in the background

    # -- reading ---------------------------------------------------------------------------
    def checkpoints(self) -> list[Path]:
        """Complete checkpoints, oldest first."""
        return list_checkpoints(self.directory)

    def restore_latest(self) -> Restored | None:
        """Restore the newest readable checkpoint into the trainer; None if there is none. An
        unreadable one is moved aside (``corrupt-ckpt-...``) when an older one restores; if none can
        be read, CheckpointError names the newest; one of another run is refused before its state is
        read.
        """
        unreadable: list[tuple[Path, str]] = []  # (checkpoint, why), newest first
        if fit_checkpoints(self.directory):  # alone, or beside this loop's: never resumed
            raise CheckpointError(_of_fit(self.directory, self.identity["model"]))
        for path in reversed(self.checkpoints()):
            try:
                meta = read_meta(path)
            except NewerFormatError:
                raise  # not damage: an older checkpoint is no better
            except CheckpointError as e:
                unreadable.append((path, e.reason))
                continue
            check_backend(path, meta, self._state.backend)
            check_settings(path, meta, self.settings)
            check_identity(path, meta, self.identity)
            check_data(path, meta, self.data, self.flags)
            check_epoch_logs(path, meta, {*self.trainer.train_logs(), *EPOCH_END_KEYS})
            try:
                check_files(path, meta)
            except CheckpointError as e:
                unreadable.append((path, e.reason))
                continue
            try:
                self._state.read(path)
            except StructureError as e:  # the files were read: their structure differs
                raise CheckpointError(
                    f"checkpoint {path} was written with other settings ({e}); resume "
                    "with the settings it was written with, or pass --fresh to start over"
                ) from None
            except Exception as e:  # TF raises OpError, ValueError, IndexError... on bad files
                unreadable.append((path, _why(e)))
                continue
            self._set_aside(unreadable, path)
            position = Position(
                epoch=meta["epoch"],
                step_in_epoch=meta["step_in_epoch"],
                step=meta["step"],
                epoch_logs=decode_epoch_logs(meta.get("epoch_logs")),
                ended="epoch_logs" not in meta,
            )
            self.trainer.position = position
            self._last_saved_step = position.step
            return Restored(
                path, position.epoch, position.step_in_epoch, position.step, position.ended
            )
        if unreadable:
            raise _unreadable(*unreadable[0])
        return None

    def _set_aside(self, unreadable: list[tuple[Path, str]], good: Path) -> None:
        # Out of the way, so this run's own save at that step is not mistaken for done; kept
        # (not deleted) for whoever wants to look at it. Only the writer moves it.
        if not self.writer:
            return
        for path, why in unreadable:
            aside = set_aside(path)
            self._on_notice(
                f"checkpoint {path.name} cannot be read ({why}); moved it to "
                f"{aside.name} and resuming from the previous one, {good.name}"
            )
        if unreadable:
            _io.fsync_dir(self.directory)

    # -- writing ---------------------------------------------------------------------------
    def save(self) -> Path:
        """Write a checkpoint of the trainer's current position atomically and durably; prune old
        ones. StorageError (nothing changed) if the disk is full. A background engine (Orbax)
        commits when its files are complete; :meth:`wait` raises what failed. Every worker saves;
        only the chief's copy is kept. (why: docs/architecture.md#checkpoints)
        """
        self.wait()
        t = self.trainer
        self._check_finite()
        collective = getattr(self._state, "collective", False)
        if not self.writer and not collective:
            scratch = Path(tempfile.gettempdir()) / f"mirrorfit-worker-ckpt.tmp-{_io.temp_tag()}"
            try:
                scratch.mkdir()
                _finished(self._state.write(scratch))
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
            self._last_saved_step = t.step
            return self.directory / f"ckpt-{t.step:09d}"
        final = self.directory / f"ckpt-{t.step:09d}"
        # Several processes decide alike, from what each knows: not from the folder, which
        # the chief may be renaming into place this moment.
        if t.step == self._last_saved_step if collective else final.exists():
            if self.writer and final.exists():
                self._update_position(final)
            return final
        previous = self.checkpoints()
        keep = (
            f"the previous checkpoint {previous[-1]} is kept"
            if previous
            else "no checkpoint was written"
        )
        # One name every process knows (a step is saved once per run) or this writer's own.
        tmp = self.directory / (
            f".{final.name}.tmp-shared" if collective else f".{final.name}.tmp-{_io.temp_tag()}"
        )
        meta = self._meta()
        try:
            with _io.disk_full_hint(f"checkpoint {final}", keep):
                if self.writer:
                    self.directory.mkdir(parents=True, exist_ok=True)
                    _remove(tmp)  # a crashed run's, at this step
                    tmp.mkdir()
                pending = self._state.write(tmp)
        except BaseException:
            if self.writer:
                shutil.rmtree(tmp, ignore_errors=True)  # a failed write leaves nothing behind
            raise
        commit = Commit(
            final,
            lambda: self._commit(tmp, final, meta, pending),
            keep,
        )
        if pending is None:
            commit.run()
            commit.result()
        else:
            commit.start()
            self._pending = commit
        self._last_saved_step = t.step
        return final

    def wait(self) -> None:
        """Block until a checkpoint still being written in the background is committed;
        raise what failed (StorageError for a full disk, CheckpointError otherwise)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.join()
            pending.result()

    def _commit(self, tmp: Path, final: Path, meta: dict, pending) -> None:
        """After the state files are complete: meta.json, fsync, the rename that commits it
        (until then the previous checkpoint is the latest), then pruning. The chief only."""
        try:
            _finished(pending)
            if not self.writer:
                return
            meta = sealed({**meta, "files": file_sums(tmp)})
            (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
            _io.fsync_tree(tmp)  # TF's and Orbax's files too
            os.rename(tmp, final)
        finally:
            if self.writer:
                shutil.rmtree(tmp, ignore_errors=True)
        _io.fsync_dir(self.directory)
        for old in self.checkpoints()[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)

    def _check_finite(self) -> None:
        if self.allow_nan:
            return
        bad = self._state.first_non_finite()
        if bad is not None:
            found = self.checkpoints() if self.writer else []
            kept = (
                f"the previous checkpoint, {found[-1]}, stays the newest"
                if found
                else "no checkpoint was written"
            )
            raise DivergedError(
                f"global step {self.trainer.step}: the weights are not finite "
                f"({bad}); not saved, {kept}; try a lower --lr, or "
                "--allow-nan to save them anyway"
            )

    def _meta(self) -> dict[str, Any]:
        t = self.trainer
        meta = {
            "epoch": t.epoch,
            "step_in_epoch": t.step_in_epoch,
            "step": t.step,
            "examples_in_epoch": t.step_in_epoch * t.global_batch,
            "data": self.data,
            "flags": self.flags,
            "settings": self.settings,
            "identity": self.identity,
            "time": time.time(),
            "format": FORMAT,
            "backend": self._state.backend,
            "class_names": self.class_names,
        }
        # At an epoch's last step before its end: that epoch's training logs, else None. The
        # key's presence says that such a position's epoch has not ended (else it would be the
        # next epoch's step 0); a restored format < 4 position keeps its meaning: no key.
        if not t.position.ended:
            meta["epoch_logs"] = encode_epoch_logs(t.position.epoch_logs)
        return meta

    def _update_position(self, path: Path) -> None:
        """Saving at the step of an existing checkpoint: the state is the same (no step ran
        since), the position may not be: the epoch-end save after a step hook's save at the
        epoch's last step. Its meta.json is rewritten (atomically), so that a resume does not
        run that epoch's end again."""
        try:
            old = json.loads((path / "meta.json").read_text())
        except (OSError, ValueError):
            return  # unreadable: left as it is, for restore to judge
        meta = self._meta()
        if not isinstance(old, dict) or all(
            old.get(k) == meta[k] for k in ("epoch", "step_in_epoch", "step")
        ):
            return
        if "files" in old:  # the same state files: their sums stand
            meta = sealed({**meta, "files": old["files"]})
        # A full disk is one line naming the file; the old meta.json stays whole.
        _io.write_bytes_atomic(path / "meta.json", json.dumps(meta, indent=1).encode())

    def discard(self) -> Path | None:
        """Move existing checkpoints aside (``--fresh``); nothing is deleted. Returns where.
        Only the writer (the chief) moves anything."""
        found = self.checkpoints() + fit_checkpoints(self.directory)
        return discard(self.directory, found) if self.writer else None

    def clean_partial(self) -> list[Path]:
        """Remove temp folders left by a write that was killed (not those of a live writer)."""
        if not self.writer:  # its own scratch copies, left by a worker killed mid-save
            return _io.remove_stale_temps(tempfile.gettempdir(), r"mirrorfit-worker-ckpt\.tmp-")
        removed = _io.remove_stale_temps(self.directory, r"\.ckpt-[0-9]+\.tmp-")
        # Several processes' shared temp folders: none is being written before a run resumes.
        for stale in self.directory.glob(".ckpt-*.tmp-shared"):
            _remove(stale)
            removed.append(stale)
        return removed

    # -- trainer hooks ---------------------------------------------------------------------
    def step_hook(self, trainer) -> None:
        """Save every ``every`` steps (called after each compiled execution)."""
        if self.every and trainer.step // self.every > max(self._last_saved_step, 0) // self.every:
            self.save()

    def epoch_callback(self, epoch: int, logs: dict) -> None:
        self.save()


def _remove(path: Path) -> None:
    """Whatever is at ``path``: a folder's tree, or a file or link (not what it points to)."""
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        path.unlink()
    else:
        shutil.rmtree(path, ignore_errors=True)


def _finished(pending) -> None:
    """Wait for an engine's background write, if it returned one."""
    if pending is not None:
        pending.wait()


def _of_fit(directory: Path, spec: str | None) -> str:
    """The line for a folder of mirrorfit.fit's checkpoints that this loop's run would resume."""
    from mirrorfit.artifacts import epoch_checkpoint

    name = epoch_checkpoint.recorded_built_in(directory)
    if name is not None:
        by = f"--model {name}"
    else:
        by = "a compiled --model (mirrorfit.fit's epoch-NNNNNN checkpoints)"
    return (
        f"{directory} was written with {by}, this run has --model {spec}: resume with "
        f"{by.split(' (')[0]}, or pass --fresh"
    )


def _unreadable(path: Path, why: str, *, training: bool = True) -> "CheckpointError":
    instead = "pass --fresh to start over or " if training else ""
    return CheckpointError(
        f"checkpoint {path} cannot be read ({why}); {instead}delete that folder to fall back "
        "to an older one",
        reason=why,
    )


# Reads a model's variables from a checkpoint folder as the named engine wrote them:
# read_state(backend, folder, model) (mirrorfit.engine.backends.read_model).
ReadState = Callable[[str, Path, Any], None]


def load_model(
    directory: str | Path,
    *,
    read_state: ReadState,
    model: str | None = None,
    on_notice: Callable[[str], None] = lambda m: print(m, file=sys.stderr),
):
    """The model of the newest readable checkpoint in ``directory``, rebuilt outside any strategy,
    and its meta; only the model's variables are read, by ``read_state``. A user model is
    imported only when ``model`` names it too (a checkpoint folder must not choose which code
    runs).
    """

    directory = Path(directory)
    found = require_checkpoints(directory)
    if FIT_FOLDER.fullmatch(found[0].name):
        return _load_fit_model(directory, model, read_state, on_notice)
    unreadable: list[tuple[Path, str]] = []
    for path in reversed(found):
        try:
            meta = read_meta(path, training=False)
        except NewerFormatError:
            raise  # not damage: an older checkpoint is not the one asked for
        except CheckpointError as e:
            unreadable.append((path, e.reason))
            continue
        net = _build_checked(path, meta["identity"], model)
        try:
            check_files(path, meta)
            # format < 3 checkpoints name no backend: TensorFlow's
            read_state(meta.get("backend", "tensorflow"), path, net)
        except CheckpointError as e:
            unreadable.append((path, e.reason))
            continue
        except Exception as e:  # TF raises OpError, ValueError, IndexError... on bad files
            unreadable.append((path, _why(e)))
            continue
        for bad, why in unreadable:
            on_notice(
                f"checkpoint {bad.name} cannot be read ({why}); using the previous one, {path.name}"
            )
        return net, meta
    raise _unreadable(*unreadable[0], training=False)  # export, evaluate: no --fresh


def _load_fit_model(directory: Path, asked: str | None, read_state: ReadState, on_notice):
    """The model of ``mirrorfit.fit``'s newest readable checkpoint in ``directory`` (a user's
    ``--model`` is named by ``asked``: a checkpoint folder does not choose which code runs; a
    built-in one is found by the model's recorded name), and its meta with ``where``, the
    checkpoint's name."""
    import keras
    import numpy as np

    from mirrorfit.artifacts import epoch_checkpoint
    from mirrorfit.models.build import model_factory, needs_data_shape
    from mirrorfit.models.names import built_in_named

    recorded = epoch_checkpoint.recorded_built_in(directory)
    if asked is None:
        asked = recorded or built_in_named(epoch_checkpoint.recorded_name(directory))
    if asked is None:
        raise CheckpointError(
            f"{directory} holds mirrorfit.fit's checkpoints (epoch-NNNNNN) of a model that "
            "is not one of mirrorfit's own (or whose newest readable meta.json does not "
            "name one); pass --model package.module:function, the one that trained them"
        )
    # Built for the shapes it trained with (recorded in meta.json), where its function takes
    # them: --input-shape/--num-classes, or the data's; the identity check refuses a mismatch.
    inputs, outputs = epoch_checkpoint.model_shapes(directory)
    one_in = inputs[0][1:] if _plausible(inputs) else None
    one_out = outputs[0][-1] if _plausible(outputs, outputs=True) else None
    unknown = (
        f"the checkpoints in {directory} do not record the shapes the model trained on (a "
        "meta.json of mirrorfit before 2026-12-05, or a damaged one)"
    )
    build = model_factory(asked, input_shape=one_in, num_classes=one_out)  # imports it
    if needs_data_shape(asked, one_in, one_out):
        raise CheckpointError(
            f"{unknown}, which --model {asked} needs (its input_shape or num_classes has no "
            "default); give them defaults, the values training gave"
        )
    net = build()
    if not net.built and one_in is None:
        raise CheckpointError(
            f"{unknown}, and --model {asked} declares no keras.Input to build it from; "
            "start the model with keras.Input(shape), the shape it trained on"
        )
    if not net.built:  # no Input: built from the data, as it was
        batch = inputs[0][0]  # the first batch's size, which its InputLayer's config keeps
        try:
            if isinstance(net, keras.Sequential):  # its InputLayer keeps the batch size
                net.build((batch if type(batch) is int and batch > 0 else None, *one_in))
            else:  # a subclassed model: its layers build on a first call
                net(np.zeros((1, *one_in), "float32"))
        except Exception as e:  # Keras raises ValueError, TypeError... for a shape it refuses
            raise CheckpointError(
                f"--model {asked} cannot be built for the input shape {tuple(one_in)} that "
                f"{directory}'s meta.json records ({_why(e)}); pass the "
                "--model that trained it, or restore the file"
            ) from None

    def read_split(folder: Path, model) -> None:  # a state split over JAX devices: Orbax's
        read_state("jax", folder, model)

    pixels = epoch_checkpoint.recorded_pixels(directory)
    if pixels:  # trained on uint8 pixels scaled in the model: read as it trained
        from mirrorfit.models.build import inner_model, taking_pixels

        net = taking_pixels(net, one_in)
    path, meta = epoch_checkpoint.read_newest(net, directory, read_split, on_notice)
    return (inner_model(net) if pixels else net), {**meta, "where": path.name}


def _plausible(shapes, *, outputs: bool = False) -> bool:
    """Whether meta.json's recorded shapes (a hint, not trusted: the identity check decides)
    are one shape: a batch axis and up to 4 sizes (inputs: each at most MAX_IMAGE_SIDE, 2**26
    values in all; outputs: the last at most MAX_CLASSES), so that a hostile one cannot have
    a huge model built before the check refuses it."""
    import math

    from mirrorfit.config.checks import MAX_IMAGE_SIDE
    from mirrorfit.data.spec import MAX_CLASSES

    if not isinstance(shapes, list) or len(shapes) != 1 or not isinstance(shapes[0], list):
        return False
    sizes = shapes[0][1:]
    if not 1 <= len(sizes) <= 4:
        return False
    if outputs:
        return type(sizes[-1]) is int and 1 <= sizes[-1] <= MAX_CLASSES
    return all(type(n) is int and 1 <= n <= MAX_IMAGE_SIDE for n in sizes) and (
        math.prod(sizes) <= 1 << 26
    )


def position_of(meta: dict) -> str:
    """Where a checkpoint :func:`load_model` read stands, for messages: ``step N`` (mirrorfit
    train's) or its folder's name (``mirrorfit.fit``'s)."""
    return meta.get("where") or f"step {meta['step']}"


def _build_checked(path: Path, ident: dict, asked: str | None):
    """Build the checkpoint's model (its spec, input shape and classes): a built-in or a
    keras.applications name freely, a user model only if the caller asked for that very one."""
    from mirrorfit.models.build import model_factory

    spec = ident["model"]
    if asked is not None and asked != spec:
        raise CheckpointError(
            f"checkpoint {path} holds --model {spec}, not --model {asked}; pass --model {spec}"
        )
    if ":" in spec and asked is None:
        raise CheckpointError(
            f"checkpoint {path} holds the user model {spec}, whose code "
            f"would be imported and run; pass --model {spec} to allow it"
        )
    shape, classes = ident.get("input_shape"), ident.get("num_classes")
    return model_factory(spec, input_shape=tuple(shape) if shape else None, num_classes=classes)()
