"""``mirrorfit.fit`` with Keras callbacks on 2 worker processes (``mirrorfit launch``, real
processes on loopback), on both engines, against 1 process with 2 devices
(tests/fitting/workers.py).

The two sides add the same two gradient halves in the same order (one per device), so their
weights, histories and evaluations agree bit for bit here (measured: 0.0 apart on both
engines); 1e-6 leaves room for a BLAS that sums a process's matmuls in another order.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT, _env, keras_file_weights

pytestmark = pytest.mark.slow
DRIVER = Path(__file__).resolve().parent / "workers.py"


def _weights(path: Path) -> list[np.ndarray]:
    with np.load(path) as f:
        return [f[k] for k in sorted(f.files, key=lambda k: int(k.split("_")[1]))]


def _apart(a: list, b: list) -> float:
    assert len(a) == len(b) and a
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b, strict=True))


@pytest.fixture(scope="module", params=["jax", "tensorflow"])
def sides(request, tmp_path_factory):
    backend = request.param
    two, one = tmp_path_factory.mktemp(f"two-{backend}"), tmp_path_factory.mktemp(f"one-{backend}")
    launched = subprocess.Popen(
        [sys.executable, "-m", "mirrorfit", "launch", "--workers", "2", "--"]
        + [sys.executable, str(DRIVER), backend, str(two)],
        env=dict(_env(), TMPDIR=str(two)),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    alone = subprocess.run(
        [sys.executable, str(DRIVER), backend, str(one)],
        env=_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=400,
    )
    log, _ = launched.communicate(timeout=400)
    assert launched.returncode == 0, log[-4000:]
    assert alone.returncode == 0, alone.stderr[-4000:]
    results = {
        name: json.loads((two / f"result-{name}.json").read_text()) for name in ("0-2", "1-2")
    }
    results["one"] = json.loads((one / "result-0-1.json").read_text())
    return two, one, results


def test_every_worker_trains_the_one_process_run(sides):
    two, one, r = sides
    assert (r["0-2"]["workers"], r["0-2"]["replicas"], r["one"]["replicas"]) == (2, 2, 2)
    reference = _weights(one / "plain-0-1.npz")
    for w in ("0-2", "1-2"):
        assert _apart(_weights(two / f"plain-{w}.npz"), reference) < 1e-6
        np.testing.assert_allclose(
            r[w]["plain_history"]["loss"], r["one"]["plain_history"]["loss"], rtol=1e-6
        )
        assert r[w]["evaluate"] == pytest.approx(r["one"]["evaluate"], rel=1e-6)
    assert r["one"]["plain_history"]["loss"][1] < r["one"]["plain_history"]["loss"][0]
    saved = keras_file_weights(two / "plain.keras")  # saved by the chief alone, mid-script
    for weight in _weights(two / "plain-0-2.npz"):
        assert any(a.shape == weight.shape and np.array_equal(a, weight) for a in saved)


def test_early_stopping_restores_the_best_weights_on_every_worker(sides):
    two, _, r = sides
    for w in ("0-2", "1-2"):
        assert r[w]["epochs_run"] == 4  # best at epoch 1, patience 2
        assert r[w]["restored_is_best"] and r[w]["restored_differs_from_last"]
        assert r[w]["history"] == r["0-2"]["history"]  # one merged history, shuffled alike
        # shuffled as 1 process with 2 devices is (the chief's NumPy generator on every worker)
        np.testing.assert_allclose(r[w]["history"]["loss"], r["one"]["history"]["loss"], rtol=1e-6)
    # worker 1 drew its starting weights with another seed: both start from the chief's
    assert _apart(_weights(two / "early-0-2.npz"), _weights(two / "early-1-2.npz")) == 0.0


def test_the_chief_alone_writes_and_its_checkpoint_is_the_best_epoch(sides):
    two, _, r = sides
    assert r["0-2"]["chief"] and not r["1-2"]["chief"]
    assert r["0-2"]["saves"] == 4 and r["1-2"]["saves"] == 0  # ModelCheckpoint ran on one
    saved = keras_file_weights(two / "best.keras")  # the weights, then the optimizer's
    for weight in _weights(two / "best-epoch-0-2.npz"):
        assert any(a.shape == weight.shape and np.array_equal(a, weight) for a in saved)
    assert sorted(p.name for p in two.glob("e*.weights.h5")) == [
        f"e{i}.weights.h5" for i in (1, 2, 3, 4)
    ]
    assert len((two / "log.csv").read_text().strip().splitlines()) == 1 + 4


def test_the_rate_a_scheduler_sets_is_the_rate_every_worker_steps_with(sides):
    _, _, r = sides
    for w in ("0-2", "1-2", "one"):
        assert r[w]["rates_seen"] == [pytest.approx(0.05), 0.0, 0.0]
        assert r[w]["frozen_after_rate_0"]  # a rate of 0 stops the weights


def test_data_that_differ_in_one_example_stop_every_worker_in_one_line(sides):
    _, _, r = sides
    for w in ("0-2", "1-2"):
        said = r[w]["differ"]
        assert said.startswith("worker(s) 1 read other batches than worker 0 at block 1")
        assert "same data in the same order" in said and "\n" not in said


def test_what_one_worker_does_alone_does_not_set_them_apart(sides):
    two, _, r = sides
    # weights worker 1 set between two fits: the second started from the chief's
    assert _apart(_weights(two / "after-set-0-2.npz"), _weights(two / "after-set-1-2.npz")) == 0
    for w in ("0-2", "1-2"):
        assert r[w]["stopped_after"] == 2  # worker 1's callback stopped both after epoch 2
        assert "were called with epochs [2, 3] (worker order)" in r[w]["other_epochs"]
    assert "is a file; give a folder" in r["1-2"]["one_refused"]
    assert r["0-2"]["one_refused"].startswith("worker(s) 1 refused this call")


def test_backup_and_restore_resumes_every_worker_where_the_chief_saved(sides):
    _, _, r = sides
    for w in ("0-2", "1-2"):
        assert r[w]["preempted"] == "preempted" and r[w]["resumed_epochs"] == 2
        assert r[w]["resumed_is_whole"]
        assert r[w]["ckpt_resumed_epochs"] == 3 and r[w]["ckpt_resumed_is_whole"]
