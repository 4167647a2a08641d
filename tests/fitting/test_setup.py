"""``mirrorfit.setup``'s ``strategy``: what it refuses, in one line, before any framework
starts (so these run in the test process)."""

from __future__ import annotations

import importlib
import json

import pytest

import mirrorfit

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
