"""Where a run writes (``--metrics-out``, ``--save-keras``, ``--export-dir``,
``--checkpoint-dir``, ``--logdir``), checked before any work with plain file-system checks
(no TensorFlow): each failure is one ConfigError line naming the flag, value and fix. Nothing
is created: writing is tested with an ``O_TMPFILE`` file. (why: docs/architecture.md#output-paths)
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path

from mirrorfit.errors import ConfigError

_NAME_MAX = 255  # bytes per path component (Linux; other systems count differently)
_PATH_MAX = 4096
# A file is written beside itself under a longer temporary name, then renamed: Keras's
# ".{stem}.tmp-{host}-{pid}-{32 hex}.keras" adds up to ~61 bytes, JSON's ".{name}.XXXXXXXX.tmp"
# 14. A name that leaves no room for them would fail at the end of the run.
_TEMP_NAME_ROOM = 64


def check_output_file(flag: str, path: str | Path | None) -> None:
    """ConfigError, one line, for a file a run writes at its end (``--metrics-out``,
    ``--save-keras``) that could not be written there. The file is replaced atomically, so an
    existing one must be a regular file: not a folder, nor a device such as /dev/null."""
    if not path:
        return
    target = _checked_name(flag, path)
    if len(os.fsencode(target.name)) > _NAME_MAX - _TEMP_NAME_ROOM:
        raise ConfigError(
            f"{flag} {str(path)[:200]}: the file name is over "
            f"{_NAME_MAX - _TEMP_NAME_ROOM} bytes (it is written under a longer "
            "temporary name first); give a shorter name"
        )
    found = _nearest(flag, target)
    if found == target:
        if target.is_symlink():  # safe: the stat above reached it
            # The file is replaced (temp file + rename), not written through: the link would
            # become a plain file and its target (a log, /dev/stdout) would get nothing.
            raise ConfigError(
                f"{flag} {path} is a symbolic link ({os.readlink(target)}); the "
                "file is replaced, not written through: pass the file's own path"
            )
        mode = _stat(flag, target, target).st_mode
        if stat.S_ISDIR(mode):
            raise ConfigError(
                f"{flag} {path} is a folder; pass a file path such as {target / 'metrics.json'}"
                if flag == "--metrics-out"
                else f"{flag} {path} is a folder; pass a file path"
            )
        if not stat.S_ISREG(mode):
            raise ConfigError(
                f"{flag} {path} is not a regular file (a device, pipe or "
                "socket) and would be replaced; pass a file path"
            )
        _check_replaceable(flag, path, target)
        found = target.parent
    elif found != target.parent:
        _need_folder(flag, path, found, "pass a path in a folder")
        raise ConfigError(f"{flag} {path}: folder {target.parent} does not exist; create it first")
    _need_folder(flag, path, found, "pass a path in a folder")
    _check_writable(flag, path, found, read=True)  # the file is renamed in, the folder fsynced


def check_output_folder(flag: str, path: str | Path | None, example: str = "runs/NAME") -> None:
    """ConfigError, one line, for a folder a run creates (with its parents) or writes into
    (``--checkpoint-dir``, ``--export-dir``, ``--logdir``) that could not be."""
    if not path:
        return
    target = _checked_name(flag, path)
    found = _nearest(flag, target)
    if found == target and not stat.S_ISDIR(_stat(flag, target, target).st_mode):
        raise ConfigError(f"{flag} {path} is a file; give a folder like {example}")
    _need_folder(flag, path, found, f"give a folder like {example}")
    # Checkpoints and exports are renamed into the folder itself and it is fsynced (read);
    # a folder the run creates is its own, and TensorBoard only writes.
    _check_writable(flag, path, found, read=found == target and flag != "--logdir")


def check_export_dir(base: str | Path) -> Path:
    """``base`` as a Path; ConfigError if it cannot be the export folder."""
    check_output_folder("--export-dir", base, example="models/mnist")
    return Path(base)


def check_keras_path(path: str | Path) -> Path:
    """``path`` as a Path; ConfigError unless it ends in .keras (Keras requires it)."""
    path = Path(path)
    if path.suffix != ".keras":
        raise ConfigError(f"--save-keras {path}: the file name must end in .keras")
    return path


def _checked_name(flag: str, path: str | Path) -> Path:
    text = str(path)
    if "\0" in text:  # the OS cannot take it: ValueError deep in pathlib or open()
        raise ConfigError(f"{flag} {text!r} contains a NUL character; give a path without it")
    target = Path(text)
    head = target.parts[0] if target.parts else ""
    if head.startswith("~") and os.path.expanduser(head) != head and not os.path.lexists(head):
        # Only a shell expands ~ (not a config file, nor a quoted flag): a folder named "~"
        # would be made here.
        raise ConfigError(
            f"{flag} {text}: ~ is not expanded here; write the full path, such "
            f"as {os.path.expanduser(text)}"
        )
    try:
        encoded = [os.fsencode(p) for p in target.parts]
        cwd = "" if target.is_absolute() else os.getcwd()
    except UnicodeEncodeError:
        raise ConfigError(
            f"{flag} {text!r} cannot be encoded as a file name; give a path without it"
        ) from None
    except FileNotFoundError:
        raise ConfigError(
            f"{flag} {text}: the current folder no longer exists (it was "
            "removed); cd to an existing folder or give an absolute path"
        ) from None
    long = [p for p, b in zip(target.parts, encoded) if len(b) > _NAME_MAX]
    if long or len(os.fsencode(cwd)) + 1 + sum(len(b) + 1 for b in encoded) > _PATH_MAX:
        what = (
            f"the name {long[0][:40]}... is over {_NAME_MAX} bytes"
            if long
            else f"the path is over {_PATH_MAX} bytes"
        )
        raise ConfigError(f"{flag} {text[:200]}: {what}; give a shorter path")
    return target


def _nearest(flag: str, target: Path) -> Path:
    """``target`` or its nearest ancestor that exists (links followed); ConfigError for a link
    to nothing or a loop of links on the way, or an ancestor this user may not look into."""
    current = target
    while True:
        try:
            os.stat(current)
            return current
        except (FileNotFoundError, NotADirectoryError):
            if current.is_symlink():  # lstat: the link is there, what it points to is not
                raise ConfigError(
                    f"{flag} {target}: {current} is a link to nothing "
                    f"({os.readlink(current)}); remove it or point it at "
                    "something that exists"
                ) from None
            if current.parent == current:
                return current
            current = current.parent
        except OSError as e:
            raise _unreachable(flag, target, current, e) from None


def _stat(flag: str, path: str | Path, at: Path) -> os.stat_result:
    try:
        return os.stat(at)
    except OSError as e:
        raise _unreachable(flag, path, at, e) from None


def _need_folder(flag: str, path: str | Path, found: Path, fix: str) -> None:
    if not stat.S_ISDIR(_stat(flag, path, found).st_mode):
        raise ConfigError(f"{flag} {path}: {found} is a file, not a folder; {fix}")


def _unreachable(flag: str, path: str | Path, at: Path, e: OSError) -> ConfigError:
    if e.errno == errno.ELOOP:
        return ConfigError(
            f"{flag} {path}: a loop of symbolic links on the way to {at}; point them at a folder"
        )
    return ConfigError(
        f"{flag} {path}: cannot reach {at} ({e.strerror or e}); choose a place "
        "this user may write to"
    )


def _check_replaceable(flag: str, path: str | Path, target: Path) -> None:
    """In a sticky folder (/tmp), only the file's or the folder's owner may rename over a
    file: another user's file there passed the write test and failed after training."""
    folder, file = os.stat(target.parent), os.stat(target)
    me = os.geteuid()
    if (
        folder.st_mode & stat.S_ISVTX
        and me not in (file.st_uid, folder.st_uid)
        and not _has_fowner()
    ):
        raise ConfigError(
            f"{flag} {path} belongs to another user (uid {file.st_uid}) in a "
            f"folder where only its owner may replace it ({target.parent} is "
            "sticky, like /tmp); pass another file name"
        )


def _has_fowner() -> bool:
    """Whether this process has CAP_FOWNER (root usually does): it may replace any file.
    Read from /proc; where that cannot be read, assume it has, and let the write say."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            caps = next(line for line in f if line.startswith("CapEff:"))
        return bool(int(caps.split()[1], 16) & (1 << 3))  # CAP_FOWNER is capability 3
    except (OSError, ValueError, StopIteration, IndexError):
        return True


def _check_writable(flag: str, path: str | Path, folder: Path, *, read: bool) -> None:
    # Creating a file is the only test that holds for root, read-only mounts and ACLs alike
    # (os.access says yes to root on a read-only sysfs). TemporaryFile uses O_TMPFILE on
    # Linux: a file with no name, so nothing is left in the folder, whatever happens.
    try:
        with tempfile.TemporaryFile(prefix=".mirrorfit-probe-", dir=folder):
            pass
    except OSError as e:
        raise ConfigError(
            f"{flag} {path}: cannot write in {folder} ({e.strerror or e}); "
            "choose a place this user may write to"
        ) from None
    if not read:
        return
    try:  # what is renamed into the folder is made durable by fsyncing it, which reads it
        os.close(os.open(folder, os.O_RDONLY))
    except OSError as e:
        raise ConfigError(
            f"{flag} {path}: cannot read {folder} ({e.strerror or e}), which "
            "writing there safely needs (fsync); choose a place this user may "
            "read and write"
        ) from None
