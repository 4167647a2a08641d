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


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"backend": "torch"}, "backend='torch': mirrorfit trains on 'tensorflow' or 'jax'"),
        ({"devices": "/cpu:0"}, "devices='/cpu:0': give a list of device names"),
        ({"replicas": True}, "replicas=True: give a whole number of at least 1"),
        ({"precision": ["fp32"]}, "precision=['fp32']: choose one of"),
        ({"shard": None}, "shard=None: choose 'none'"),
        ({"sync_batchnorm": "yes"}, "sync_batchnorm='yes': give True or False"),
        ({"model_parallel": 0}, "model_parallel=0: give the devices each weight is split"),
        ({"model_parallel": True}, "model_parallel=True: give the devices each weight"),
        (
            {"backend": "tensorflow", "model_parallel": 2},
            "model_parallel=2 splits the weights on the JAX engine only",
        ),
    ],
)
def test_arguments_setup_cannot_use_are_a_value_error_in_its_words(kwargs, needle):
    """On main: backend='torch' raised ConfigError (no ValueError) saying --backend; a string
    of devices was split into characters; replicas=True was taken for 1; a list of
    precisions was a TypeError."""
    with pytest.raises(ValueError) as caught:
        mirrorfit.setup(**{"backend": "jax", **kwargs})
    assert needle in str(caught.value), str(caught.value)
    assert "--" not in str(caught.value) and "\n" not in str(caught.value)
    assert chosen.current() is None


def test_an_unknown_keras_backend_is_named_in_this_apis_words(fresh):
    fresh.setenv("KERAS_BACKEND", "torch")
    with pytest.raises(ValueError, match=r"^KERAS_BACKEND='torch': mirrorfit trains on"):
        mirrorfit.setup()


def test_keras_loaded_on_the_other_backend_is_named_in_this_apis_words():
    import keras

    loaded = keras.backend.backend()
    other = "jax" if loaded == "tensorflow" else "tensorflow"
    with pytest.raises(ValueError) as caught:
        mirrorfit.setup(backend=other)
    assert str(caught.value) == (
        f"backend={other!r}, but Keras was already imported with the {loaded} backend; pass "
        f"backend={loaded!r}, or call mirrorfit.setup(backend={other!r}) before importing keras"
    )


def test_the_api_loads_no_framework_before_setup():
    """``import mirrorfit`` and reaching ``setup``/``fit``/``evaluate``/``predict`` import
    neither Keras nor TensorFlow nor JAX: setup must set the devices before they start (once,
    an import in predict.py loaded Keras when ``mirrorfit.setup`` was reached). A fresh
    process: what an import loads is the point."""
    program = (
        "import sys, json, mirrorfit\n"
        "mirrorfit.setup, mirrorfit.fit, mirrorfit.evaluate, mirrorfit.predict\n"
        "print(json.dumps(sorted({'keras', 'tensorflow', 'jax'} & set(sys.modules))))\n"
    )
    env = {**_env(), "MIRRORFIT_TESTS_PRELOAD": "0"}  # not a forked, preloaded interpreter
    proc = subprocess.run(
        [sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.splitlines()[-1]) == []
