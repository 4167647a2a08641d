"""``mirrorfit.fit(checkpoint_dir=DIR)``: the model's state written at the end of every epoch,
and read back by the next ``fit`` with the same DIR, which goes on from the epoch after it.

A checkpoint is a folder ``DIR/epoch-NNNNNN`` holding ``state.weights.h5`` (Keras's
``save_weights``: the model's variables and its optimizer's) and ``meta.json`` (the epoch and
what the model must match: see :func:`_identity`), written in a hidden folder and renamed into
place: a run killed while writing leaves no half checkpoint. The three latest are kept. One fit
writes to DIR at a time (a lock). On several workers the chief writes and every worker reads
(DIR must be one they all see).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path

from mirrorfit.errors import FitError

KEEP = 3  # checkpoints kept (as mirrorfit train keeps by default)
_NAME = "epoch-"
_STATE, _META = "state.weights.h5", "meta.json"


def checked_dir(value, *, writes: bool) -> Path:
    """``checkpoint_dir`` as a Path, made if missing; FitError (one line) for anything that
    cannot hold checkpoints."""
    if not isinstance(value, (str, os.PathLike)) or not str(value).strip():
        raise FitError(f"checkpoint_dir={value!r}: give a folder path (str or os.PathLike)")
    path = Path(value).expanduser().absolute()
    if path.exists() and not path.is_dir():
        raise FitError(f"checkpoint_dir={str(value)!r} is a file; give a folder")
    if writes:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise FitError(
                f"checkpoint_dir={str(value)!r} cannot be made ({e.strerror}); give a "
                "folder this process can write"
            ) from None
        if not os.access(path, os.W_OK | os.X_OK):
            raise FitError(
                f"checkpoint_dir={str(value)!r} is not writable; give a folder this "
                "process can write"
            )
    if path.is_dir():
        strays = sorted(
            p.name for p in path.glob(_NAME + "*") if not (p.is_dir() and (p / _META).is_file())
        )
        if strays:
            raise FitError(
                f"checkpoint_dir={str(value)!r} holds {strays[0]}, which is not a checkpoint "
                "(no meta.json); move it out, or give another checkpoint_dir"
            )
    return path


@contextlib.contextmanager
def locked(directory: Path):
    """Hold ``directory``'s lock while a fit writes there; FitError (one line) if another
    process holds it."""
    import fcntl

    with open(directory / ".lock", "a+", encoding="utf-8") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            raise FitError(
                f"checkpoint_dir={str(directory)!r} is being written by {holder}; wait for it "
                "to end, or give another checkpoint_dir"
            ) from None
        f.seek(0)
        f.truncate()
        f.write(f"process {os.getpid()}")
        f.flush()
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def latest(directory: Path) -> Path | None:
    """The newest complete checkpoint in ``directory``, or None."""
    found = sorted(
        (int(p.name[len(_NAME) :]), p)
        for p in directory.glob(_NAME + "*")
        if p.name[len(_NAME) :].isdigit() and (p / _META).is_file()
    )
    return found[-1][1] if found else None


def callback(directory: Path, *, writes: bool):
    """The Keras callback that restores at ``on_train_begin`` and (``writes``: the chief)
    saves at every ``on_epoch_end``."""
    import keras

    class Checkpoints(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            found = latest(directory)
            if found is not None:
                self.model._initial_epoch = restore(self.model, found)

        def on_epoch_end(self, epoch, logs=None):
            if writes:
                save(self.model, directory, epoch + 1)

    return Checkpoints()


def restore(model, found: Path) -> int:
    """Load the checkpoint ``found`` into ``model``; the epoch to start from."""
    try:
        meta = json.loads((found / _META).read_text(encoding="utf-8"))
        epoch = meta["epoch"]
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
            raise ValueError(f"epoch {epoch!r}")
        if found.name != f"{_NAME}{epoch:06d}":
            raise ValueError(f"epoch {epoch} in a folder named {found.name}")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise FitError(
            f"{found / _META} is not a checkpoint's metadata ({type(e).__name__}: "
            f"{_one_line(e)}); delete {found}, or give another checkpoint_dir"
        ) from None
    mine = _identity(model)
    reasons = {
        "model": lambda a, b: f"a {a}; this is a {b}",
        "optimizer": lambda a, b: f"trained with {a}; this with {b}",
        "weights": _differs,
        "layers": lambda a, b: "its layers' classes or settings differ from this model's",
    }
    for key, reason in reasons.items():
        if meta.get(key) != mine[key]:
            raise FitError(
                f"{found} holds another model's checkpoint ({reason(meta.get(key), mine[key])}); "
                "give another checkpoint_dir"
            )
    try:
        model.load_weights(found / _STATE)
    except (OSError, ValueError, KeyError) as e:
        raise FitError(
            f"{found / _STATE} cannot be loaded into this model ({type(e).__name__}: "
            f"{_one_line(e)}); delete {found}, or give another checkpoint_dir"
        ) from None
    return epoch


def _differs(theirs, mine) -> str:
    if isinstance(theirs, list) and isinstance(mine, list):
        for a, b in zip(theirs, mine):
            if a != b:
                return f"a weight of {a} where this model has {b}"
        return f"{len(theirs)} weights where this model has {len(mine)}"
    return f"weights {theirs} where this model has {mine}"


def _one_line(error: Exception) -> str:
    return " ".join(str(error).split())[:200]


def save(model, directory: Path, epoch: int) -> Path | None:
    """Write the checkpoint of ``epoch`` (epochs done) and keep the :data:`KEEP` latest; None,
    with a warning, for weights that are not finite (the latest checkpoint stays the last
    finite state, as mirrorfit train keeps it)."""
    import warnings

    from mirrorfit._io import fsync_dir, fsync_tree, remove_stale_temps, temp_tag
    from mirrorfit.artifacts.finite import first_non_finite

    bad = first_non_finite(model.weights)
    if bad is not None:
        warnings.warn(
            f"the weights after epoch {epoch} are not finite ({bad}): no checkpoint written in "
            f"{directory}; the latest stays {latest(directory) or 'none (no checkpoint yet)'}",
            stacklevel=2,
        )
        return None
    remove_stale_temps(directory, r"\." + _NAME)  # a killed run's temporary folders
    tmp = directory / f".{_NAME}{temp_tag()}"
    tmp.mkdir()
    model.save_weights(tmp / _STATE)
    with open(tmp / _META, "w", encoding="utf-8") as f:
        json.dump({"epoch": epoch, **_identity(model)}, f)
    fsync_tree(tmp)
    final = directory / f"{_NAME}{epoch:06d}"
    if final.exists():  # a run started over from epoch 0 in the same folder
        shutil.rmtree(final)
    os.replace(tmp, final)
    fsync_dir(directory)
    done = sorted(
        p for p in directory.glob(_NAME + "*") if p.name[len(_NAME) :].isdigit() and p != final
    )
    for old in done[: max(0, len(done) - (KEEP - 1))]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _identity(model) -> dict:
    """What a checkpoint must match: the model's and optimizer's classes, each weight's shape
    and dtype, and a CRC of its layers' classes and settings (names left out: Keras numbers
    them per process)."""
    return {
        "model": type(model).__name__,
        "optimizer": type(model.optimizer).__name__,
        "weights": [f"{tuple(w.shape)} {w.dtype}" for w in model.weights],
        "layers": _layers_crc(model),
    }


def _layers_crc(model) -> int:
    import zlib

    def unnamed(value):
        if isinstance(value, dict):
            return {k: unnamed(v) for k, v in value.items() if k != "name"}
        if isinstance(value, (list, tuple)):
            return [unnamed(v) for v in value]
        return value

    described = []
    for layer in model._flatten_layers(include_self=False, recursive=True):
        try:
            config = unnamed(layer.get_config())
        except Exception:  # noqa: BLE001 - a custom layer without get_config: its class only
            config = None
        described.append([type(layer).__name__, config])
    text = json.dumps(described, sort_keys=True, default=lambda o: type(o).__name__)
    return zlib.crc32(text.encode())
