"""``mirrorfit.fit(checkpoint_dir=DIR, checkpoint_every=N)``: the model's state written at the
end of every epoch (and every N optimizer steps), and read back by the next ``fit`` with the
same DIR, which goes on from there: the epoch after it, or the step inside an epoch.

A checkpoint is a folder ``DIR/epoch-EEEEEE`` (E epochs done) or ``epoch-EEEEEE-step-SSSSSS``
(and S steps of the next), holding ``state.weights.h5`` (Keras's ``save_weights``: the
model's variables and its optimizer's) or, where the JAX engine splits the state over the
devices (``shard="optimizer"|"all"``), ``state/`` (Orbax: each process writes its own shards
in the background, committed when complete; the engine's ``checkpoint_state``), the variables
it leaves out or alters as they are (``seeds.npz``: the seed generators; ``lora.npz``: the
weights of LoRA layers, whose adapters Keras's save merges into the kernel and loads back as
zeros) and ``meta.json`` (the position,
NumPy's generator as that epoch began (its shuffle), what the model must match: see
:func:`_identity`, and the checksums of the other files), written in a hidden folder and
renamed into place: a run killed while writing leaves no half checkpoint. A damaged newest
checkpoint (a flipped bit, a cut file) is set aside as ``corrupt-epoch-...``, named in one
warning, and the one before it restored. The three latest are kept. One fit writes to DIR at
a time (a lock). On several workers the chief writes and every worker reads (DIR must be one
they all see).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from mirrorfit._frameworks import tensorflow_start_filtered
from mirrorfit.artifacts.commit import Commit
from mirrorfit.artifacts.checksums import file_sums, files_problem, seal_problem, sealed
from mirrorfit.artifacts.checkpoint_meta import (
    CheckpointError,
    StructureError,
    check_settings,
    discard,
    fit_checkpoints,
    list_checkpoints,
    set_aside,
    special_file,
)
from mirrorfit.errors import FitError

KEEP = 3  # checkpoints kept (as mirrorfit train keeps by default)
# 2: meta.json holds "format", "files" and "crc" (artifacts/checksums.py), "step_in_epoch"
# and "rng"
FORMAT = 2
_NAME = "epoch-"


@dataclass(frozen=True)
class Position:
    """Where a fit stands: ``epoch`` epochs done and ``step`` optimizer steps of the next;
    ``rng``: NumPy's global generator as that next epoch began (what its shuffle draws from),
    None where unknown (a checkpoint of format 1)."""

    epoch: int
    step: int = 0
    rng: dict | None = None

    @property
    def name(self) -> str:
        return f"{_NAME}{self.epoch:06d}" + (f"-step-{self.step:06d}" if self.step else "")


_STATE, _META = "state.weights.h5", "meta.json"
# Where a fit resumed from, at INFO (`mirrorfit train` shows it on its start screen).
log = logging.getLogger("mirrorfit.fit")
_SEEDS = "seeds.npz"  # the variables save_weights leaves out: the layers' seed generators
_LORA = "lora.npz"  # the weights of LoRA layers as they are (save_weights merges them)
_SPLIT = "state"  # a split JAX state: Orbax's folder (engine/jax/fit_state.py)
_JOIN_S = 300.0  # seconds a fit's end waits for a checkpoint still being written


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


checkpoints = fit_checkpoints  # the complete checkpoints in a folder, oldest first


def rng_state() -> dict:
    """NumPy's global generator's state as JSON values."""
    import numpy as np

    _, keys, pos, has_gauss, gauss = np.random.get_state()
    return {"keys": keys.tolist(), "pos": pos, "has_gauss": has_gauss, "gauss": gauss}


def set_rng_state(state: dict) -> None:
    """NumPy's global generator set to ``state`` (:func:`rng_state`'s, checked when its
    checkpoint was read)."""
    import numpy as np

    np.random.set_state(_rng_tuple(state))


def _rng_tuple(state) -> tuple:
    """``state`` as ``np.random.set_state`` takes it; ValueError if it is not one (a hand-made
    meta.json: damage, set aside)."""
    import numpy as np

    try:
        keys = np.asarray(state["keys"], dtype=np.int64)
        if keys.shape != (624,) or keys.min() < 0 or keys.max() >= 1 << 32:
            raise ValueError("keys")
        pos, has_gauss, gauss = state["pos"], state["has_gauss"], float(state["gauss"])
        if not (isinstance(pos, int) and 0 <= pos <= 624 and has_gauss in (0, 1)):
            raise ValueError("pos or has_gauss")
    except (KeyError, TypeError, ValueError, OverflowError) as e:
        raise ValueError(f"rng is no NumPy generator state ({type(e).__name__})") from None
    return ("MT19937", keys.astype(np.uint32), pos, int(has_gauss), gauss)


class Saver:
    """``fit``'s checkpoints in ``directory``: a Keras callback that restores at
    ``on_train_begin`` (:attr:`restored`, the position the run goes on from) and saves at
    every ``on_epoch_end``; the loop asks :meth:`due` after each call of steps and calls
    :meth:`save` then, and on a signal. ``writes``: this process keeps what it saves (the chief);
    ``every``: optimizer steps between saves inside an epoch (0: epoch ends only);
    ``optimizer``: :func:`optimizer_settings` as compiled; ``epochs``: the fit's, for the
    line a resume logs."""

    def __init__(
        self,
        directory: Path,
        *,
        writes: bool,
        every: int,
        optimizer: dict | None,
        allow_nan: bool = False,
        keep: int = KEEP,
        fresh: bool = False,
        epochs: int | None = None,
    ):
        import keras

        self.directory, self.writes, self.every = directory, writes, every
        self.allow_nan, self.keep, self.fresh = allow_nan, keep, fresh
        self.data: dict = {}  # what a resume inside an epoch must match (set_data)
        self.optimizer = optimizer
        self.restored: Position | None = None
        self.last: Path | None = None  # the newest checkpoint, once known
        self._epoch_rng: dict | None = None
        self._steps_done = 0  # this fit's optimizer steps, for `every`
        self.state = None  # the engine's checkpoint_state (use)
        self._pending: Commit | None = None  # a save still being written in the background
        saver = self

        class Checkpoints(keras.callbacks.Callback):
            def on_train_begin(self, logs=None):
                saver.restored = restore_newest(
                    self.model,
                    directory,
                    optimizer,
                    writes=writes,
                    data=saver.data,
                    state=saver.state,
                )
                at = saver.restored
                if at is not None:
                    where = directory / at.name
                    if epochs is not None and not at.step and at.epoch >= epochs:
                        line = "nothing to train: %d of %d epochs already done in %s"
                        log.info(line, at.epoch, epochs, where)
                    else:
                        line = "resuming from %s (epoch %d, step %d)"
                        log.info(line, where, at.epoch + 1, at.step)
                    self.model._initial_epoch = at.epoch
                    if at.rng is not None:
                        set_rng_state(at.rng)
                found = checkpoints(directory)
                saver.last = found[-1] if found else None

            def on_epoch_end(self, epoch, logs=None):
                saver.save(self.model, Position(epoch + 1, 0, rng_state()))

        self.callback = Checkpoints()

    def begin(self, barrier) -> None:
        """Before ``on_train_begin`` restores, once every argument was checked: ``fresh``'s
        checkpoints moved aside by the chief, then ``barrier()`` (every worker; none restores
        them meanwhile)."""
        if self.fresh:
            if self.writes:
                found = list_checkpoints(self.directory) + checkpoints(self.directory)
                aside = discard(self.directory, found)
                if aside is not None:  # said, as the earlier loop said it: nothing deleted
                    log.info("moved the existing checkpoints to %s, starting over", aside)
            barrier()

    def use(self, state) -> None:
        """The engine's reader and writer of the state it splits over the devices (its
        ``checkpoint_state``, once the runner is built), or None: Keras's ``save_weights``."""
        self.state = state

    def wait(self) -> None:
        """Block until a checkpoint still being written in the background is committed;
        raise what failed (StorageError for a full disk, CheckpointError otherwise)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.join()
            pending.result()

    def join(self) -> None:
        """Let a checkpoint still being written in the background end (at most
        :data:`_JOIN_S`: on several workers it waits for theirs, and one may have died); what
        failed is raised by the next :meth:`wait`. On the way out of a failed fit too."""
        if self._pending is not None:
            self._pending.join(timeout=_JOIN_S)

    def set_data(self, **data) -> None:
        """What fixes the batches of an epoch (the global batch, steps, shuffle, ...): a
        checkpoint inside an epoch holds it, and a resume there with other values is refused
        (its position would name other examples)."""
        self.data = json.loads(json.dumps(data, default=str))

    def epoch_begins(self) -> None:
        """Called before an epoch draws its shuffle: the generator state its checkpoints keep."""
        self._epoch_rng = rng_state()

    def due(self, steps: int, last: bool) -> bool:
        """After a call of ``steps`` optimizer steps: whether ``every`` steps have passed since
        the last save inside an epoch (not after the epoch's ``last`` call: its end saves)."""
        before = self._steps_done
        self._steps_done += steps
        return (
            bool(self.every) and not last and self._steps_done // self.every > before // self.every
        )

    def position(self, epoch: int, step: int) -> Position:
        return Position(epoch, step, self._epoch_rng)

    def save(self, model, position: Position) -> Path | None:
        """Write the checkpoint at ``position`` (the chief); every worker notes its path.
        Weights that are not finite are never written: DivergedError, or with ``allow_nan`` a
        warning (the latest checkpoint stays the last finite state, as mirrorfit train keeps
        it) and None."""
        from mirrorfit.artifacts.finite import first_non_finite

        bad = first_non_finite(model.weights) if self.writes or not self.allow_nan else None
        if bad is not None and not self.allow_nan:
            from mirrorfit.errors import DivergedError

            kept = f"the newest stays {self.last}" if self.last else "none was written"
            raise DivergedError(
                f"at {position.name} the weights are not finite ({bad}): not "
                f"checkpointed, {kept}; try a lower learning rate, or allow_nan=True "
                "(--allow-nan) to train on as Keras does"
            )
        if bad is not None:
            newest = checkpoints(self.directory)
            warnings.warn(
                f"the weights at {position.name} are not finite ({bad}): no checkpoint written "
                f"in {self.directory}; the latest stays "
                f"{newest[-1] if newest else 'none (no checkpoint yet)'}",
                stacklevel=2,
            )
            return None
        self.wait()  # the previous save, committed first
        self.last, self._pending = save(
            model,
            self.directory,
            position,
            self.optimizer,
            writes=self.writes,
            keep=self.keep,
            data=self.data,
            state=self.state,
        )
        return self.last


def restore_newest(
    model,
    directory: Path,
    optimizer: dict | None,
    *,
    writes: bool,
    data: dict | None = None,
    state=None,
) -> Position | None:
    """Restore the newest readable checkpoint of ``directory`` into ``model`` (a split state
    through ``state``, the engine's ``checkpoint_state``): the position to go on from, None
    without one. A damaged one is passed over (``writes``: set aside, with a
    warning naming it) for the one before; FitError if none can be read, or if one is of
    another model or optimizer settings (not damage: an older one is no better)."""

    def check(found: Path, meta: dict) -> None:
        if _settings(model):  # mirrorfit train's: a changed flag named as the CLI names it
            check_settings(found, meta, model.mirrorfit_settings)
        _check_identity(model, found, meta, optimizer)
        _check_engine(model, found, meta)
        _check_data(found, meta, data)

    if list_checkpoints(directory):  # alone, or beside fit's: which is newer cannot be told
        raise FitError(
            f"checkpoint_dir {directory} holds checkpoints of mirrorfit train's earlier loop "
            "(ckpt-NNNNNNNNN), which this one does not resume; set them aside with "
            "fresh=True (--fresh) to start over, or use another checkpoint_dir"
        )
    found, meta, damaged = _first_readable(directory, check, lambda f: _load(model, f, state))
    if found is None:
        if not damaged:
            return None
        path, reason = damaged[0]
        raise FitError(
            f"checkpoint {path} cannot be read ({reason}); delete it to fall back to an "
            "older one, or give another checkpoint_dir"
        )
    for path, reason in damaged:
        aside = set_aside(path) if writes else path
        warnings.warn(
            f"checkpoint {path} cannot be read ({reason}); "
            + (f"moved it to {aside.name} and " if writes else "")
            + f"resuming from the previous one, {found.name}",
            stacklevel=2,
        )
    return Position(meta["epoch"], meta.get("step_in_epoch", 0), meta.get("rng"))


def _first_readable(
    directory: Path,
    check: Callable[[Path, dict], None],
    read: Callable[[Path], str | None],
) -> tuple[Path | None, dict, list[tuple[Path, str]]]:
    """Newest first, the first checkpoint of ``directory`` whose meta.json, ``check`` (which
    raises for what is not damage: another model's), checksums and ``read`` (what made it
    unreadable, None: read) all pass: (its folder, its meta, [(folder, why)] of the newer ones
    passed over as damaged); (None, {}, those) where none passes."""
    damaged: list[tuple[Path, str]] = []
    for found in reversed(checkpoints(directory)):
        meta, why = _read_meta(found)
        if why is None:
            check(found, meta)
            why = files_problem(found, meta.get("files")) if meta.get("format") else None
        if why is None:
            why = read(found)
        if why is None:
            return found, meta, damaged
        damaged.append((found, why))
    return None, {}, damaged


def _read_meta(found: Path) -> tuple[dict, str | None]:
    """``found``'s meta.json and what makes it unusable (None: nothing)."""
    try:
        special = special_file(found)
        if special:
            return {}, special
        meta = json.loads((found / _META).read_text(encoding="utf-8"))
        if not isinstance(meta, dict):
            raise ValueError("not an object")
        epoch, step = meta["epoch"], meta.get("step_in_epoch", 0)
        for value in (epoch, step):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"epoch {epoch!r}, step {step!r}")
        if found.name != Position(epoch, step).name:
            raise ValueError(f"epoch {epoch}, step {step} in a folder named {found.name}")
        fmt = meta.get("format")
        newer = isinstance(fmt, int) and not isinstance(fmt, bool) and fmt > FORMAT
        if fmt is not None and fmt != FORMAT and not newer:
            raise ValueError(f"format {fmt!r}")
        if meta.get("rng") is not None:
            _rng_tuple(meta["rng"])
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as e:
        return {}, f"meta.json: {type(e).__name__}: {_one_line(e)}"
    if newer:  # not damage: an older checkpoint is no better, and this one is not read
        raise FitError(
            f"checkpoint {found} was written by a newer mirrorfit (format {fmt}, this one "
            f"reads up to {FORMAT}); upgrade mirrorfit, or give another checkpoint_dir"
        )
    return meta, seal_problem(meta) if "format" in meta else None


def _check_identity(
    model,
    found: Path,
    meta: dict,
    optimizer: dict | None,
    ignore: tuple[str, ...] = (),
    fix: str = "give another checkpoint_dir",
) -> None:
    mine = _identity(model)
    reasons = {
        "model": lambda a, b: f"a {a}; this is a {b}",
        "optimizer": lambda a, b: f"trained with {a}; this with {b}",
        "weights": _differs,
        "layers": lambda a, b: "its layers' classes or settings differ from this model's",
        "wiring": lambda a, b: "its layers are connected otherwise than this model's",
    }
    for key, reason in reasons.items():
        if key in ignore or (key == "wiring" and key not in meta):  # wiring: not yet recorded
            continue
        if meta.get(key) != mine[key]:
            raise FitError(
                f"{found} holds another model's checkpoint ({reason(meta.get(key), mine[key])}); "
                f"{fix}"
            )
    # (older checkpoints hold the inner optimizer's name)
    theirs = _without_names(meta.get("optimizer_settings"))
    if optimizer is None or not isinstance(theirs, dict) or theirs == optimizer:
        return
    name = next(k for k in sorted({*theirs, *optimizer}) if theirs.get(k) != optimizer.get(k))
    was, now = _shown(theirs.get(name)), _shown(optimizer.get(name))
    raise FitError(
        f"{found} was trained with {mine['optimizer']} {name}={was}; this model is compiled "
        f"with {name}={now}, and a resume would train on with the checkpoint's (the "
        "optimizer's state holds it); compile the model as the checkpoint was to resume, or "
        "give another checkpoint_dir to start over with these settings"
    )


def _check_engine(model, found: Path, meta: dict) -> None:
    """FitError for a resume on another Keras backend, or with other dtype policies (another
    precision): a run goes on as it began, as mirrorfit train's earlier loop refused them."""
    import keras

    theirs, mine = meta.get("backend"), keras.backend.backend()
    if isinstance(theirs, str) and theirs != mine:
        raise FitError(
            f"{found} was written on the {theirs} backend; this fit runs on {mine}: resume "
            f"on {theirs} (backend={theirs!r}, --backend {theirs}), or give another "
            "checkpoint_dir to start over"
        )
    theirs, mine = meta.get("dtype_policies"), _policies(model)
    if isinstance(theirs, list) and theirs != mine:
        was, now = ", ".join(map(str, theirs)), ", ".join(mine)
        raise FitError(
            f"{found} was trained with the dtype policy {was}; this model's is {now}: resume "
            "with the precision it had (mirrorfit.setup(precision=), --precision), or give "
            "another checkpoint_dir to start over"
        )


def _settings(model) -> bool:
    """Whether ``model`` carries mirrorfit train's flags (``mirrorfit_settings``)."""
    return isinstance(getattr(model, "mirrorfit_settings", None), dict)


def _policies(model) -> list[str]:
    """The dtype policies of the model's layers, sorted (one with the global policy)."""
    layers = model._flatten_layers(include_self=False, recursive=True)
    return sorted({layer.dtype_policy.name for layer in layers})


def _check_data(found: Path, meta: dict, data: dict | None) -> None:
    """FitError for a resume inside an epoch whose batches would differ from the ones the
    checkpoint's position counts (another batch size, data, shuffle, ...). Between epochs any
    may change, as under Keras."""
    theirs = meta.get("data")
    if not meta.get("step_in_epoch") or not isinstance(theirs, dict) or data is None:
        return
    for name in sorted({*theirs, *data}):
        if theirs.get(name) != data.get(name):
            raise FitError(
                f"{found} stopped {meta['step_in_epoch']} steps into epoch "
                f"{meta['epoch'] + 1} with {name}={_shown(theirs.get(name))}; this fit has "
                f"{name}={_shown(data.get(name))}, so the rest of that epoch would be other "
                "batches; give what the run had, or delete the step checkpoints to resume "
                "from the epoch's end (or fresh=True to start over)"
            )


def _shown(value) -> str:
    return f"{value:.6g}" if isinstance(value, float) else repr(value)


def _load(model, found: Path, state=None, seeds: bool = True) -> str | None:
    """Read ``found``'s state into ``model`` (a split one through ``state``; ``seeds``: the
    seed generators' too); what failed, or None."""
    split = found / _SPLIT
    if split.exists() or split.is_symlink():
        why = _load_split(found, state)
        return why if why is not None else _load_seeds(model, found)
    adapted = _lora_variables(model)
    if adapted and not (found / _LORA).is_file():  # not damage: written before it was kept
        raise FitError(
            f"{found} holds its LoRA layers' weights only as Keras's save_weights merges "
            "them (a resume would start the adapters again from zeros); give another "
            "checkpoint_dir to start over"
        )
    try:
        with tensorflow_start_filtered():  # Keras's h5 reader may load TensorFlow
            model.load_weights(found / _STATE)
    except (OSError, ValueError, KeyError) as e:
        return f"{_STATE}: {type(e).__name__}: {_one_line(e)}"
    if not seeds or not (found / _SEEDS).is_file():
        return None  # format 1: no seeds kept
    why = _load_seeds(model, found)
    if why is None and adapted:
        why = _assign_from(found / _LORA, adapted, "LoRA layers' weights")
    return why


def _load_seeds(model, found: Path) -> str | None:
    return _assign_from(found / _SEEDS, _seed_variables(model), "seed generator states")


def _load_split(found: Path, state) -> str | None:
    """A split JAX state (``state/``) read through the engine's ``state``; what failed, or
    None. FitError where this run cannot read one (not damage)."""
    if state is None:
        raise FitError(
            f"{found} holds a state split over JAX devices (state/, written by a fit under "
            "shard='optimizer' or 'all'), which this run cannot read; resume it with the JAX "
            "backend and a model trained by mirrorfit's step, or give another checkpoint_dir"
        )
    try:
        state.read(found)
    except StructureError as e:
        raise FitError(
            f"{found} holds another model's checkpoint ({_one_line(e)}); give another "
            "checkpoint_dir"
        ) from None
    except (OSError, ValueError, KeyError) as e:
        return f"{_SPLIT}/: {type(e).__name__}: {_one_line(e)}"
    return None


def read_newest(model, directory: Path, read_split, on_notice) -> tuple[Path, dict]:
    """The newest readable checkpoint of ``directory`` read into ``model`` (built from the
    ``--model`` that trained it, compiled or not) for ``mirrorfit export``: its identity and
    checksums checked, its weights read (a split state by ``read_split(folder, model)``); a
    damaged one passed over (``on_notice`` says so) for the one before. Returns its folder and
    meta.json; FitError for another model's, CheckpointError if none can be read."""
    ignore = () if _optimizer(model) is not None else ("optimizer",)

    def check(found: Path, meta: dict) -> None:
        _check_identity(model, found, meta, None, ignore, "pass the --model that trained it")

    found, meta, damaged = _first_readable(
        directory, check, lambda f: _read_weights(model, f, read_split)
    )
    if found is None:
        path, reason = damaged[0]
        raise CheckpointError(f"checkpoint {path} cannot be read ({reason}); restore or delete it")
    for path, reason in damaged:
        on_notice(
            f"checkpoint {path.name} cannot be read ({reason}); using the previous one, "
            f"{found.name}"
        )
    return found, meta


def _optimizer(model):
    """The model's optimizer, None before a compile (an uncompiled model has no attribute)."""
    return getattr(model, "optimizer", None)


def model_shapes(directory: Path) -> tuple[list | None, list | None]:
    """(input shapes, output shapes), batch axis first, of the model whose checkpoints
    ``directory`` holds, as its newest readable meta.json records them; None where it does
    not (a model without declared inputs, a checkpoint written before they were kept)."""
    meta = _newest_meta(directory)
    shapes = meta.get("shapes") if isinstance(meta.get("shapes"), dict) else {}
    return shapes.get("inputs"), shapes.get("outputs")


def _class_names(model) -> bool:
    names = getattr(model, "class_names", None)
    return isinstance(names, list) and bool(names) and all(isinstance(n, str) for n in names)


def recorded_name(directory: Path) -> object:
    """The Keras name of the model whose checkpoints ``directory`` holds (its newest readable
    meta.json's; None before it was kept). A hint: the identity check decides."""
    return _newest_meta(directory).get("name")


def recorded_built_in(directory: Path) -> str | None:
    """The ``--model`` of mirrorfit's own (``mlp``, ``ResNet50``) whose checkpoints
    ``directory`` holds, as its newest readable meta.json records it; None: a user's model.
    Plain Python."""
    from mirrorfit.models.names import built_in_named

    return built_in_named(_newest_meta(directory).get("built_in"))


def recorded_default_compile(directory: Path) -> bool:
    """Whether ``directory``'s newest readable checkpoint is of a user's uncompiled ``--model``
    that mirrorfit train compiled as its own models (sparse categorical crossentropy, accuracy,
    [0, 1] images). Plain Python."""
    return _newest_meta(directory).get("default_compile") is True


def _default_compile(model) -> bool:
    return getattr(model, "mirrorfit_default_compile", False) is True


def recorded_pixels(directory: Path) -> bool:
    """Whether ``directory``'s newest readable checkpoint is of a model that took uint8 pixels
    through models.build.taking_pixels. Plain Python."""
    return _newest_meta(directory).get("pixels") is True


def _built_in(model) -> str | None:
    """The --model of mirrorfit's own that ``model`` is (set by mirrorfit train), else None."""
    from mirrorfit.models.names import built_in_named

    return built_in_named(getattr(model, "mirrorfit_built_in", None))


def recorded_backend(directory: Path) -> str | None:
    """The Keras backend that wrote ``directory``'s newest readable checkpoint (as meta.json
    records it), None where it does not say (written before it was kept). Plain Python."""
    backend = _newest_meta(directory).get("backend")
    return backend if isinstance(backend, str) else None


def _newest_meta(directory: Path) -> dict:
    """The meta.json of ``directory``'s newest readable checkpoint, {} where none is."""
    for found in reversed(checkpoints(directory)):
        meta, why = _read_meta(found)
        if why is None:
            return meta
    return {}


def _shapes(model) -> dict:
    """The model's input and output shapes (batch axis first: None), for ``mirrorfit export``
    to rebuild it for them; empty where it declares none (a subclassed model)."""
    try:
        inputs, outputs = model.inputs, model.outputs
    except (AttributeError, ValueError):
        return {}
    if not inputs or not outputs:
        return {}
    return {
        "inputs": [list(t.shape) for t in inputs],
        "outputs": [list(t.shape) for t in outputs],
    }


def _read_weights(model, found: Path, read_split) -> str | None:
    """``found``'s weights into ``model`` (not its optimizer's state, unless compiled);
    what failed, or None."""
    if (found / _SPLIT).exists() or (found / _SPLIT).is_symlink():
        try:
            read_split(found, model)
        except StructureError as e:
            raise FitError(
                f"{found} holds another model's checkpoint ({_one_line(e)}); pass the --model "
                "that trained it"
            ) from None
        except (OSError, ValueError, KeyError) as e:
            return f"{_SPLIT}/: {type(e).__name__}: {_one_line(e)}"
        return None
    optimizer = _optimizer(model)
    if optimizer is not None and not optimizer.built:
        optimizer.build(model.trainable_variables)  # the file holds its state too
    # not the seed generators': they draw no value at inference, and the engines keep them in
    # other dtypes (JAX uint32, TensorFlow int64)
    return _load(model, found, seeds=False)


def _assign_from(path: Path, variables: list, what: str) -> str | None:
    """Assign ``path``'s arrays (``np.savez``'s order) to ``variables``; what failed, or None."""
    import numpy as np

    try:
        with np.load(path, allow_pickle=False) as f:
            values = [f[f"arr_{i}"] for i in range(len(f.files))]
    except (OSError, ValueError, KeyError) as e:
        return f"{path.name}: {type(e).__name__}: {_one_line(e)}"
    # NumPy writes the dtypes it does not know (bfloat16) as raw bytes of their size
    values = [
        v.view(np.dtype(var.dtype)) if v.dtype.kind == "V" else v
        for v, var in zip(values, variables)
    ]
    theirs = [(v.shape, v.dtype.name) for v in values]
    mine = [(tuple(s.shape), np.dtype(s.dtype).name) for s in variables]
    if theirs != mine:
        return f"{path.name} holds {what} {theirs}, this model has {mine}"
    for var, value in zip(variables, values):
        var.assign(value)
    return None


def _lora_variables(model) -> list:
    """The weights of the model's LoRA layers (``enable_lora``), in a fixed order: Keras's
    ``save_weights`` stores their kernel with the adapters merged in, and its load sets the
    adapters to zeros."""
    return [
        v
        for layer in model._flatten_layers(include_self=False, recursive=True)
        if getattr(layer, "lora_enabled", False)
        for v in layer.weights
    ]


def _seed_variables(model) -> list:
    """The model's variables ``save_weights`` leaves out (its layers' seed generators, which
    draw Dropout's masks), in a fixed order."""
    weights = {id(w) for w in model.weights}
    return [v for v in model.non_trainable_variables if id(v) not in weights]


def optimizer_settings(model) -> dict | None:
    """The settings of ``model``'s optimizer as JSON values (its class's ``get_config`` but
    the name), or None where it has trained already: its settings (a learning rate a callback
    lowered) are then no longer the ones it was compiled with."""
    from keras import ops

    opt = model.optimizer
    if int(ops.convert_to_numpy(opt.iterations)) > 0:
        return None
    config = json.dumps(opt.get_config(), sort_keys=True, default=lambda o: type(o).__name__)
    return _without_names(json.loads(config))


def _without_names(config):
    """``config`` less every ``name``, nested ones too: Keras numbers the optimizers a
    process makes (``sgd``, ``sgd_1``), and fp16's LossScaleOptimizer holds its inner one's
    config, so a notebook's rerun of the same cell named another optimizer."""
    if isinstance(config, dict):
        return {k: _without_names(v) for k, v in config.items() if k != "name"}
    if isinstance(config, list):
        return [_without_names(v) for v in config]
    return config


def _differs(theirs, mine) -> str:
    if isinstance(theirs, list) and isinstance(mine, list):
        for a, b in zip(theirs, mine):
            if a != b:
                return f"a weight of {a} where this model has {b}"
        return f"{len(theirs)} weights where this model has {len(mine)}"
    return f"weights {theirs} where this model has {mine}"


def _one_line(error: Exception) -> str:
    return " ".join(str(error).split())[:200]


def save(
    model,
    directory: Path,
    position: Position,
    optimizer: dict | None,
    *,
    writes: bool = True,
    keep: int = KEEP,
    data: dict | None = None,
    state=None,
) -> tuple[Path, Commit | None]:
    """Write the checkpoint at ``position`` and keep the ``keep`` latest (``writes``: else only
    its path is returned, but a split state over several processes, whose shards every process
    writes); its weights were checked finite (:meth:`Saver.save`). Returns its path and, where
    ``state`` splits the state (Orbax, in the background), the commit still running (its
    ``result`` raises what failed), else None: committed."""
    import keras

    from mirrorfit._io import disk_full_hint, remove_stale_temps, temp_tag

    final = directory / position.name
    split = state is not None and state.split
    collective = split and state.collective
    if not writes and not collective:
        return final, None
    # One name every process knows (a position is saved once per run) or this writer's own.
    tmp = directory / (f".{final.name}.tmp-shared" if collective else f".{_NAME}{temp_tag()}")
    if writes:
        remove_stale_temps(directory, r"\." + _NAME)  # a killed run's temporary folders
        # several workers' shared ones: no other fit writes here (the lock), and this one's
        # earlier saves are committed (Saver.save waits)
        for stale in directory.glob(f".{_NAME}*.tmp-shared"):
            if stale.is_dir() and not stale.is_symlink():
                shutil.rmtree(stale, ignore_errors=True)
            else:  # a file or a link (rmtree refuses both: left there, and the next one
                stale.unlink(missing_ok=True)  # mkdir of that name failed)
        tmp.mkdir()
    before = [p for p in checkpoints(directory) if p != final]
    kept = f"the previous checkpoint {before[-1]} is kept" if before else "none was written"
    try:
        with disk_full_hint(f"checkpoint {final}", kept):
            pending = _write_state(model, tmp, writes, split, state)
    except BaseException:
        if writes:
            shutil.rmtree(tmp, ignore_errors=True)  # a failed write leaves nothing behind
        raise
    meta = {
        "format": FORMAT,
        "backend": keras.backend.backend(),  # what evaluate scores it on (losses differ)
        "epoch": position.epoch,
        "step_in_epoch": position.step,
        "rng": position.rng,
        **_identity(model),
        "dtype_policies": _policies(model),  # a resume keeps the precision (_check_engine)
        # mirrorfit train's flags that fix the run (checkpoint_meta.settings_of)
        **({"settings": model.mirrorfit_settings} if _settings(model) else {}),
        "name": model.name,  # a built-in model's (mlp): what export rebuilds without --model
        # mirrorfit train's own model (mlp, cnn; its --model), trained on [0, 1] pixels: scored
        # and exported as one, with the data's class names
        **({"built_in": _built_in(model)} if _built_in(model) else {}),
        # ...on uint8 pixels scaled in the model (models.build.taking_pixels)
        **({"pixels": True} if getattr(model, "mirrorfit_pixels", False) is True else {}),
        # a user's uncompiled --model, trained as the built-in ones are: scored and exported so
        **({"default_compile": True} if _default_compile(model) else {}),
        **({"class_names": list(model.class_names)} if _class_names(model) else {}),
        **({"shapes": _shapes(model)} if _shapes(model) else {}),
        **({"optimizer_settings": optimizer} if optimizer is not None else {}),
        **({"data": data} if data else {}),
    }
    keeps = keep if writes else None
    commit = Commit(
        final,
        lambda: _commit(tmp, final, meta, pending, keeps),
        kept,
        cleanup=lambda: shutil.rmtree(tmp, ignore_errors=True) if writes else None,
    )
    if pending is None:
        commit.run()
        commit.result()
        return final, None
    commit.start()
    return final, commit


def _write_state(model, tmp: Path, writes: bool, split: bool, state):
    """The state files into ``tmp``: the engine's split state (its background write
    returned) or Keras's weights file, and the variables that file leaves out."""
    import numpy as np

    pending = state.write(tmp) if split else None
    if writes:
        if not split:
            with tensorflow_start_filtered():  # Keras's h5 writer may load TensorFlow
                model.save_weights(tmp / _STATE)
        np.savez(tmp / _SEEDS, *[np.asarray(v.value) for v in _seed_variables(model)])
        adapted = _lora_variables(model)
        if adapted and not split:  # Orbax keeps them as they are
            np.savez(tmp / _LORA, *[np.asarray(v.value) for v in adapted])
    return pending


def _commit(tmp: Path, final: Path, meta: dict, pending, keep: int | None) -> None:
    """After the state files are complete (``pending``: an engine's background write, or
    None): meta.json with the files' checksums, fsync, the rename that commits the
    checkpoint (until then the one before is the newest), then pruning to ``keep``; None:
    not the writer (it waits for its own shards only)."""
    from mirrorfit._io import fsync_dir, fsync_tree

    if pending is not None:
        pending.wait()
    if keep is None:
        return
    directory = final.parent
    with open(tmp / _META, "w", encoding="utf-8") as f:
        json.dump(sealed({**meta, "files": file_sums(tmp)}), f)
    fsync_tree(tmp)
    if final.exists():  # a run started over from epoch 0 in the same folder
        shutil.rmtree(final)
    os.replace(tmp, final)
    fsync_dir(directory)
    done = [p for p in checkpoints(directory) if p != final]
    for old in done[: max(0, len(done) - (keep - 1))]:
        shutil.rmtree(old, ignore_errors=True)


def _identity(model) -> dict:
    """What a checkpoint must match: the model's and optimizer's classes, each weight's shape
    and dtype, a CRC of its layers' classes and settings (names left out: Keras numbers
    them per process) and one of how a functional model's layers are connected."""
    return {
        "model": type(model).__name__,
        "optimizer": type(_optimizer(model)).__name__,
        "weights": [f"{tuple(w.shape)} {w.dtype}" for w in model.weights],
        "layers": _layers_crc(model),
        "wiring": _wiring_crc(model),
    }


def _wiring_crc(model) -> int | None:
    """A CRC of a functional model's graph: for every call of a layer, the layers (by their
    place in the model) whose outputs it takes, in order; None for a model without one
    (Sequential's order is its layers' CRC already; a subclassed model's is its code)."""
    import zlib

    operations = getattr(model, "_operations", None)
    by_depth = getattr(model, "_nodes_by_depth", None)
    if not operations or not isinstance(by_depth, dict):
        return None
    place = {id(op): i for i, op in enumerate(operations)}
    calls = []
    for depth in sorted(by_depth):
        for node in by_depth[depth]:
            takes = [
                [place.get(id(t._keras_history.operation)), t._keras_history.tensor_index]
                for t in node.arguments.keras_tensors
            ]
            calls.append([place.get(id(node.operation)), takes])
    return zlib.crc32(json.dumps(sorted(calls, key=json.dumps)).encode())


def _layers_crc(model) -> int:
    import zlib

    def unnamed(value):
        if isinstance(value, dict):
            return {k: unnamed(v) for k, v in value.items() if k != "name"}
        if isinstance(value, (list, tuple)):
            return [unnamed(v) for v in value]
        return value

    def config_of(layer):
        try:
            return unnamed(layer.get_config())
        except Exception:  # noqa: BLE001 - a custom layer without get_config: its class only
            return None

    with tensorflow_start_filtered():  # get_config's serialisation asks whether TF is there
        described = [
            [type(layer).__name__, config_of(layer)]
            for layer in model._flatten_layers(include_self=False, recursive=True)
        ]
    text = json.dumps(described, sort_keys=True, default=lambda o: type(o).__name__)
    return zlib.crc32(text.encode())
