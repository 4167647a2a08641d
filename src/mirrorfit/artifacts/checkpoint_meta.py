"""A checkpoint's ``meta.json``: its schema, and the checks that decide whether a run may
resume from it, reading only meta.json so a refusal names the flag before any state is read.
``settings``: flags fixing the saved state's meaning (None: does not apply, not compared);
``data``: the :class:`~mirrorfit.data.pipeline.DataOrder`; ``flags``: the settings behind
each of its fields. (why: docs/architecture.md#checkpoints)
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from pathlib import Path
from typing import Any, Mapping

from mirrorfit.artifacts.checksums import files_problem, seal_problem
from mirrorfit.errors import MirrorfitError

# 2: adds "data", "flags", "examples_in_epoch"; 3: "settings", data "fingerprint"; 4:
# "epoch_logs" (see checkpoint.Checkpointer.save), and an epoch-end save at the step of a step
# hook's checkpoint rewrites its position to the next epoch's start; 5: "files" and "crc",
# the checksums of every file (artifacts/checksums.py).
FORMAT = 5
SEALED = 5  # the first format whose checkpoints carry checksums
_NAME = re.compile(r"ckpt-([0-9]+)")  # fullmatch, ASCII: \d and $ take "٣" and a newline
# What each DataOrder field is called in a message.
LABELS = {
    "seed": "seed",
    "examples": "training examples",
    "global_batch": "global batch",
    "fingerprint": "training data",
}
_SCALAR = (int, float, str, bool, type(None))
# epoch_logs: printed, written to --metrics-out and TensorBoard, so bounded and plain: metric
# names (no terminal escapes), at most _MAX_LOGS of them, values a float32 can hold (the
# metrics are float32; TensorBoard refuses more). A value that was not finite (a diverged
# run) is stored as null and restored as NaN: bare NaN is not JSON.
_LOG_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_./-]{0,63}")
_MAX_LOGS = 32
_LOG_BOUND = 3.4028234663852886e38  # float32's largest
# What the epoch end reads whatever the run's metrics (trainer._end_logs, train._epoch_line).
EPOCH_END_KEYS = ("loss", "learning_rate", "examples_per_sec")


class CheckpointError(MirrorfitError):
    """A checkpoint that cannot be used: corrupt, or written by another model/optimizer."""

    def __init__(self, message: str, *, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason or message  # what is wrong, without the advice


class StructureError(Exception):
    """A checkpoint's state files were read, but hold other objects than this run's (another
    model or optimizer): the engines' state readers raise it (not damage: never set aside)."""


class NewerFormatError(CheckpointError):
    """A checkpoint written by a newer mirrorfit (its meta format is unknown here)."""


def read_meta(path: Path, *, training: bool = True) -> dict:
    """The metadata of checkpoint folder ``path``, its whole schema checked (a hand edit must
    not become a traceback later); CheckpointError naming the file if it is unusable
    (``training``: its advice for a run that resumes, else for export and evaluate)."""
    file, meta = path / "meta.json", None
    try:
        special = special_file(path)  # before anything in it is opened
    except OSError as e:
        special = f"{type(e).__name__} listing it"
    if special:
        raise CheckpointError(
            f"checkpoint {path} is unusable ({special}); remove it, or pass --fresh to start over",
            reason=special,
        )
    try:
        meta = json.loads(file.read_text())
        problem = _schema_problem(meta)
    except (OSError, ValueError, RecursionError) as e:  # UnicodeDecodeError, JSONDecodeError
        problem = type(e).__name__
    if isinstance(meta, dict) and _count(meta.get("format")) and meta["format"] > FORMAT:
        # Before the schema, which a newer format may change. Not corrupt: falling back to an
        # older checkpoint, or reading it as ours, would be wrong; restore does not fall back.
        raise NewerFormatError(
            f"checkpoint {file} was written by a newer mirrorfit (meta format "
            f"{meta['format']}, this one reads up to {FORMAT}): upgrade mirrorfit to "
            + (
                "resume from it, or pass --fresh to start over"
                if training
                else "read it, or pass another --checkpoint-dir"
            ),
            reason=f"meta.json: format {meta['format']}",
        )
    if problem:
        raise CheckpointError(
            f"checkpoint {file} is corrupt or missing ({problem}); pass --fresh to start over",
            reason=f"meta.json: {problem}",
        )
    sealed = meta.get("format", 1) >= SEALED and seal_problem(meta)
    if sealed:
        raise CheckpointError(
            f"checkpoint {file} is corrupt ({sealed}); pass --fresh to start over",
            reason=sealed,
        )
    return meta


def check_files(path: Path, meta: dict) -> None:
    """CheckpointError (damage: set aside) when a file of checkpoint ``path`` is missing, cut
    short or not the bytes it was written with; free for formats before checksums."""
    if meta.get("format", 1) < SEALED:
        return
    problem = files_problem(path, meta.get("files"))
    if problem:
        raise CheckpointError(
            f"checkpoint {path} is corrupt ({problem}); pass --fresh to start over",
            reason=problem,
        )


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


def _schema_problem(meta: Any) -> str | None:
    """What is wrong with ``meta``'s structure, or None."""
    if not isinstance(meta, dict):
        return f"not an object but {type(meta).__name__}"
    if "format" in meta and not (_count(meta["format"]) and meta["format"] >= 1):
        return f"format is {meta['format']!r}, not a format number"
    for key in ("epoch", "step_in_epoch", "step"):
        if not _count(meta.get(key)):
            return f"{key} is {meta.get(key)!r}, not a count >= 0"
    ident = meta.get("identity")
    if not isinstance(ident, dict):
        return f"identity is {type(ident).__name__}, not an object"
    if not isinstance(ident.get("model"), str) or not isinstance(ident.get("optimizer"), str):
        return "identity needs model and optimizer names"
    weights = ident.get("weights")
    if not isinstance(weights, list) or not all(
        isinstance(w, list) and all(_count(d) for d in w) for w in weights
    ):
        return "identity.weights is not a list of shapes"
    # The shape the model is rebuilt with (export/evaluate): bounded, as a bigger one would
    # cost its memory before the checkpoint's weights could refuse it.
    shape, classes = ident.get("input_shape"), ident.get("num_classes")
    if shape is not None and not (
        isinstance(shape, list)
        and 1 <= len(shape) <= 4
        and all(_count(d) and 1 <= d <= 16384 for d in shape)
        and math.prod(shape) <= 2**26
    ):
        return f"identity.input_shape is {shape!r}, not an example's shape"
    if classes is not None and not (_count(classes) and 1 <= classes <= 1_000_000):
        return f"identity.num_classes is {classes!r}, not a number of classes"
    for key in ("data", "settings"):  # absent in older formats
        if not isinstance(meta.get(key, {}), dict) or not all(
            isinstance(v, _SCALAR) for v in meta.get(key, {}).values()
        ):
            return f"{key} is not an object of plain values"
    flags = meta.get("flags", {})
    if not isinstance(flags, dict) or not all(
        isinstance(v, dict) and all(isinstance(x, _SCALAR) for x in v.values())
        for v in flags.values()
    ):
        return "flags is not an object of flag -> value objects"
    return _epoch_logs_problem(meta.get("epoch_logs"))  # absent before format 4


def _epoch_logs_problem(logs: Any) -> str | None:
    if logs is None:
        return None
    if not (
        isinstance(logs, dict)
        and all(
            v is None or isinstance(v, (int, float)) and not isinstance(v, bool)
            for v in logs.values()
        )
    ):
        return "epoch_logs is not an object of numbers"
    if len(logs) > _MAX_LOGS:
        return f"epoch_logs has {len(logs)} entries, more than {_MAX_LOGS}"
    bad = [k for k in logs if not _LOG_KEY.fullmatch(k)]
    if bad:  # repr: a name with escape sequences must not reach the terminal
        return f"epoch_logs has {bad[0][:80]!r}, not a metric name"
    missing = [k for k in EPOCH_END_KEYS if k not in logs]
    if missing:
        return f"epoch_logs lacks {', '.join(missing)}"
    for k, v in logs.items():
        # json.loads reads NaN, Infinity and 1e999 (inf): none is a value the trainer writes.
        if v is not None and not (math.isfinite(v) and abs(v) <= _LOG_BOUND):
            return f"epoch_logs {k} is {v!r}, not a finite float32 (null if not a number)"
    return None


def encode_epoch_logs(logs: Mapping[str, float] | None) -> dict[str, float | None] | None:
    """``logs`` as meta.json stores them: a value that is not a finite float32 (a diverged
    run's loss) as null, so that the file stays JSON and passes the check above."""
    if logs is None:
        return None
    return {
        k: float(v) if math.isfinite(v) and abs(v) <= _LOG_BOUND else None for k, v in logs.items()
    }


def decode_epoch_logs(logs: Mapping[str, float | None] | None) -> dict[str, float] | None:
    """Checked epoch_logs as the trainer uses them: null is NaN, "not a measured value"."""
    if logs is None:
        return None
    return {k: math.nan if v is None else float(v) for k, v in logs.items()}


def check_epoch_logs(path: Path, meta: dict, ours: set[str]) -> None:
    """Refuse a checkpoint whose epoch_logs are not the metrics this run writes at an epoch's
    end (``ours``): a hand edit, or another run's metrics; its end would print or record
    other or missing values."""
    logs = meta.get("epoch_logs")
    if logs is None or set(logs) == ours:
        return
    lacks, extra = sorted(ours - set(logs)), sorted(set(logs) - ours)
    why = "; ".join(
        filter(
            None,
            (
                lacks and "lacks " + ", ".join(lacks),
                extra and "has " + ", ".join(extra) + " this run does not write",
            ),
        )
    )
    raise CheckpointError(
        f"checkpoint {path / 'meta.json'}: epoch_logs {why}; resume with the "
        "metrics it was written with, or pass --fresh to start over"
    )


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def check_backend(path: Path, meta: dict, ours: str) -> None:
    """Refuse a checkpoint another engine wrote (their state files differ); checkpoints without
    the key are TensorFlow's."""
    theirs = meta.get("backend", "tensorflow")
    if theirs != ours:
        raise CheckpointError(
            f"checkpoint {path} was written with --backend {theirs}, this run "
            f"has --backend {ours}: resume with --backend {theirs}, or pass "
            "--fresh to start over (mirrorfit export reads either)"
        )


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


def check_identity(path: Path, meta: dict, ours: Mapping[str, Any]) -> None:
    """Refuse a checkpoint of another model, optimizer or weight shapes (for callers that do
    not pass the flags: the Python API)."""
    theirs = meta["identity"]
    for key, flag in (("num_classes", "--num-classes"), ("input_shape", "--input-shape")):
        old, mine = theirs.get(key), ours.get(key)
        if old is not None and mine is not None and old != mine:  # named before the weights
            old, mine = (",".join(map(str, v)) if isinstance(v, list) else v for v in (old, mine))
            raise CheckpointError(
                f"checkpoint {path} was trained with {key.replace('_', ' ')} {old}, this run's "
                f"model has {mine} (from {flag} or the data): resume with {flag} {old} and the "
                "data it was trained on, or pass --fresh to start over"
            )
    for key in ("model", "optimizer", "weights"):
        if theirs.get(key) != ours[key]:
            what = "weight shapes" if key == "weights" else key
            detail = "" if key == "weights" else f": {theirs.get(key)!r} vs {ours[key]!r}"
            raise CheckpointError(
                f"checkpoint {path} was written by another run ({what} differ{detail}); "
                "pass --fresh to start over, or use another --checkpoint-dir"
            )


def check_data(
    path: Path, meta: dict, ours: Mapping[str, Any], our_flags: Mapping[str, Mapping[str, Any]]
) -> None:
    """Refuse a resume that would repeat or skip examples (another data order), naming the
    flag behind the field that changed."""
    theirs = meta.get("data", {})  # format 1 checkpoints did not record it
    for key, mine in ours.items():
        old = theirs.get(key)
        if old is None or mine is None or old == mine:
            continue
        their_flags, flags = meta.get("flags", {}).get(key, {}), our_flags.get(key, {})
        changed = [f for f in flags if f in their_flags and their_flags[f] != flags[f]]
        if key in ("examples", "fingerprint") and not changed and "--data" in flags:
            # The same flags, other contents: files added, removed or rewritten (names, sizes,
            # modification times), or another file at the same path.
            raise CheckpointError(
                f"checkpoint {path} was trained on other data than --data {flags['--data']} "
                f"holds now ({LABELS.get(key, key)} {old}, now {mine}: files added, removed "
                "or changed): resume with the data it was trained on, or pass --fresh to start "
                "over (resuming would train on other examples)"
            )
        why = ", ".join(f"{f} {their_flags[f]} -> {flags[f]}" for f in changed)
        fix = " ".join(as_flag(f, their_flags[f]) for f in changed) or "the original settings"
        if key == "global_batch" and changed and "--global-batch-size" not in changed:
            fix += f" (or --global-batch-size {old})"  # e.g. on a host with fewer GPUs
        if type(old) is not type(mine):  # a hand edit ("64" for 64): show which is which
            old, mine = repr(old), repr(mine)
        raise CheckpointError(
            f"checkpoint {path} was trained with {LABELS.get(key, key)} {old}, this run has "
            f"{mine}" + (f" ({why})" if why else "") + f": resume with {fix}, or pass --fresh "
            "to start over (resuming would repeat or skip examples)"
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


def fits_checkpoints(directory: str | Path) -> bool:
    """Whether ``directory``'s checkpoints are ``mirrorfit.fit``'s (a compiled ``--model``'s),
    not ``mirrorfit train``'s built-in loop's. Plain Python."""
    found = require_checkpoints(directory)
    return bool(FIT_FOLDER.fullmatch(found[0].name))


def require_checkpoints(directory: str | Path) -> list[Path]:
    """:func:`list_checkpoints`, else ``mirrorfit.fit``'s (:func:`fit_checkpoints`: a compiled
    ``--model``'s), or CheckpointError, one line, when there is none (or the folder cannot be
    read). Plain Python: ``export`` and ``evaluate`` call it before TensorFlow loads."""
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
