"""``mirrorfit.setup``: what it refuses, in one line. The strategy's refusals come before any
framework starts (so they run in the test process); a setup after the model was built runs in
a fresh process."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

import mirrorfit
from conftest import _env

chosen = importlib.import_module("mirrorfit.fitting.setup")  # the package's setup: a function

TWO_WORKERS = json.dumps(
    {
        "cluster": {"worker": ["127.0.0.1:20001", "127.0.0.1:20002"]},
        "task": {"type": "worker", "index": 0},
    }
)


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.setattr(chosen, "_current", [])
    for name in ("TF_CONFIG", "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.mark.parametrize(
    "env, kwargs, needle",
    [
        ({}, {"strategy": "mirrored"}, "strategy='mirrored': choose 'auto'"),
        (
            {},
            {"strategy": "multi-worker"},
            "needs a cluster: start the script with `mirrorfit launch",
        ),
        (
            {"TF_CONFIG": TWO_WORKERS},
            {},
            "strategy='auto' trains alone; pass strategy='multi-worker'",
        ),
        ({"TF_CONFIG": "{not json"}, {"strategy": "multi-worker"}, "TF_CONFIG is not valid JSON"),
    ],
)
def test_a_strategy_the_environment_cannot_give_is_one_line(fresh, env, kwargs, needle):
    for name, value in env.items():
        fresh.setenv(name, value)
    with pytest.raises(ValueError) as caught:
        mirrorfit.setup(backend="jax", **kwargs)
    assert needle in str(caught.value) and "\n" not in str(caught.value)
    assert chosen.current() is None  # nothing was set up


@pytest.mark.parametrize("backend", ["jax", "tensorflow"])
def test_setup_after_the_model_is_built_says_to_call_it_first(backend):
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).parent / "late_setup_driver.py"), backend],
        env=dict(_env(), KERAS_BACKEND=backend),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"REFUSED: mirrorfit.setup() came after {backend} started" in proc.stdout
    assert "call it first in the script, before building the model" in proc.stdout
