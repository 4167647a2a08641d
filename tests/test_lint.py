"""The whole tree passes ruff's check with pyproject.toml's rules ([tool.ruff]): pyflakes,
pycodestyle and bugbear at 100 columns, and is as ``ruff format`` writes it. A finding fails
here, naming file, line and rule (or the files to format). .ci/run runs both first too."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "command",
    [["check", "--no-cache", "--output-format", "concise"], ["format", "--check", "--no-cache"]],
)
def test_ruff_finds_nothing(command):
    proc = subprocess.run(
        [sys.executable, "-m", "ruff", *command, "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
