"""``mirrorfit.fit(checkpoint_dir=DIR)``: the model's state written at the end of every epoch,
and read back by the next ``fit`` with the same DIR, which goes on from the epoch after it.

A checkpoint is a folder ``DIR/epoch-NNNNNN`` holding ``state.weights.h5`` (Keras's
``save_weights``: the model's variables and its optimizer's) and ``meta.json`` (the epoch, the
model's class and weight count), written in a hidden temporary folder and renamed into place:
a run killed while writing leaves no half checkpoint. The three latest are kept. On several
workers the chief writes and every worker reads (DIR must be one they all see).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
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
    return path


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
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise FitError(
            f"{found / _META} is not a checkpoint's metadata ({type(e).__name__}: "
            f"{str(e)[:120]}); delete {found}, or give another checkpoint_dir"
        ) from None
    mine = _identity(model)
    if meta.get("model") != mine["model"] or meta.get("variables") != mine["variables"]:
        raise FitError(
            f"{found} holds a {meta.get('model')} with {meta.get('variables')} variables, "
            f"not this {mine['model']} with {mine['variables']}; give another checkpoint_dir"
        )
    try:
        model.load_weights(found / _STATE)
    except (OSError, ValueError, KeyError) as e:
        raise FitError(
            f"{found / _STATE} cannot be loaded into this model ({type(e).__name__}: "
            f"{str(e).strip().splitlines()[0][:160] if str(e).strip() else ''}); delete "
            f"{found}, or give another checkpoint_dir"
        ) from None
    return epoch


def save(model, directory: Path, epoch: int) -> Path | None:
    """Write the checkpoint of ``epoch`` (epochs done) and keep the :data:`KEEP` latest; None,
    with a warning, for weights that are not finite (the latest checkpoint stays the last
    finite state, as mirrorfit train keeps it)."""
    import warnings

    import numpy as np

    if not all(
        np.isfinite(w).all() for w in model.get_weights() if np.issubdtype(w.dtype, np.floating)
    ):
        warnings.warn(
            f"the weights after epoch {epoch} are not finite: no checkpoint written in "
            f"{directory}; the latest stays {latest(directory)}",
            stacklevel=2,
        )
        return None
    for stale in directory.glob("." + _NAME + "*"):  # a killed run's temporary folders
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix="." + _NAME, dir=directory))
    model.save_weights(tmp / _STATE)
    meta = {"epoch": epoch, **_identity(model)}
    with open(tmp / _META, "w", encoding="utf-8") as f:
        json.dump(meta, f)
        f.flush()
        os.fsync(f.fileno())
    final = directory / f"{_NAME}{epoch:06d}"
    if final.exists():  # a run started over from epoch 0 in the same folder
        shutil.rmtree(final)
    os.replace(tmp, final)
    done = sorted(
        p for p in directory.glob(_NAME + "*") if p.name[len(_NAME) :].isdigit() and p != final
    )
    for old in done[: max(0, len(done) - (KEEP - 1))]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _identity(model) -> dict:
    return {"model": type(model).__name__, "variables": len(model.weights)}
