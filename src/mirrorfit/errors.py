"""User-facing errors.

Anything a user can fix (a flag, a config file, a data path, a model spec) raises
``MirrorfitError`` with one line naming the bad value and the fix. The CLI prints it and exits
with ``EXIT_USAGE``; it never lets a TensorFlow traceback reach the user for such input.
"""

EXIT_USAGE = 2
EXIT_DIVERGED = 65  # DivergedError: the numbers went non-finite; a rerun would repeat it


class MirrorfitError(Exception):
    """A problem with the user's input, explained in one line."""

    exit_code = EXIT_USAGE


class ConfigError(MirrorfitError):
    """A bad setting: unknown key, wrong type, or a value out of range."""


class FitError(ConfigError, ValueError):
    """What ``mirrorfit.fit``/``evaluate``/``setup`` cannot train, in one line: a ValueError, as
    Python callers of a Keras-like API expect."""


class DataError(MirrorfitError):
    """The data set is missing or malformed."""


class DataEndedError(DataError):
    """The training data ran out before the epoch's planned steps: a source that yields
    fewer examples than it held when counted (said in the source's words by
    ``data.file_errors.data_errors``)."""


class StorageError(MirrorfitError):
    """A write that cannot complete (the disk is full); what was there before is kept."""


class DivergedError(MirrorfitError):
    """The run's numbers are no longer finite (a NaN or infinite loss or weight), or no update
    was ever applied: exit 65 (sysexits' EX_DATAERR), and rerunning the same command repeats
    it, so a launcher does not restart it."""

    exit_code = EXIT_DIVERGED


class ClusterError(MirrorfitError):
    """Another task of the cluster did not come up, or stopped answering (not the user's input:
    exit 69, sysexits' EX_UNAVAILABLE; a launcher restarts the group)."""

    exit_code = 69
