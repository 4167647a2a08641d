"""The whole tree passes ruff's check with pyproject.toml's rules ([tool.ruff]): pyflakes,
pycodestyle and bugbear at 100 columns, and is as ``ruff format`` writes it; mypy finds no
error in the engine contract and the public API ([tool.mypy]). A finding fails here, naming
file, line and rule. .ci/run runs the three first too."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "command",
    [
        ["ruff", "check", "--no-cache", "--output-format", "concise", "."],
        ["ruff", "format", "--check", "--no-cache", "."],
        ["mypy"],  # the files pyproject.toml's [tool.mypy] names
    ],
)
def test_the_tools_find_nothing(command):
    proc = subprocess.run(
        [sys.executable, "-m", *command],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
