"""Version folder names as TF Serving reads them (``SimpleAtoi`` into an int64): ASCII digits
only, ``00000123`` is 123. One parser for the exporter and the server, so that what one writes
the other sees."""

from __future__ import annotations

import re

MAX_VERSION = 2**63 - 1  # int64: a larger number is ignored by TF Serving
_DIGITS = re.compile(r"[0-9]+")  # not str.isdigit: it also takes "²" and "٣"


def version_number(name: str) -> int | None:
    """The number a folder name spells in ASCII digits, of any size; None for other names."""
    return int(name) if _DIGITS.fullmatch(name) else None


def parse_version(name: str) -> int | None:
    """The version a folder name is to TF Serving; None if it is not one (not ASCII digits,
    or past int64)."""
    number = version_number(name)
    return number if number is not None and number <= MAX_VERSION else None
