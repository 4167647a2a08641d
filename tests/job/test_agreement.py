"""Workers of one job agree on the settings that must match (job/agreement.py): a difference
is one line on every worker naming the flag and each worker's value, exit 2, before the first
step; with real processes under hand-made TF_CONFIGs and under `mirrorfit launch`."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, _env

from mirrorfit.config import TrainConfig
from mirrorfit.distribute.launch import free_ports
from mirrorfit.errors import ConfigError
from mirrorfit.job import agreement
from mirrorfit.job.agreement import PER_WORKER, check_agreement, must_match

HERE = Path(__file__).parent
RUN = ("--threads-per-worker", "1", "--train-examples", "1024", "--epochs", "1", "--no-progress")


def test_every_setting_but_the_per_worker_ones_must_match():
    settings = must_match(TrainConfig(), replicas=2, local_replicas=1)
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    assert {
        "--seed",
        "--lr",
        "--epochs",
        "--steps-per-execution",
        "--train-examples",
        "--allow-nan",
        "--model",
        "--optimizer",
    } <= set(settings)
    compared = {k[2:].replace("-", "_") for k in settings}
    resolved = {"replicas", "global_batch_size", "eval_batch_size"}
    assert compared == (fields - PER_WORKER) | resolved
    assert not {
        "--data-dir",
        "--metrics-out",
        "--threads-per-worker",
        "--checkpoint-dir",
        "--data",
        "--batch-size",
    } & set(settings)
    assert settings["--replicas"] == "1 per worker"


def test_settings_are_compared_as_they_resolve():
    """The same run spelled two ways is the same run: the batch by replica or in all, the
    evaluation batch left to its default, the optimizer's name in any case."""
    one = must_match(TrainConfig(batch_size=32, optimizer="Adam"), 2, 1)
    other = must_match(
        TrainConfig(global_batch_size=64, eval_batch_size=64, optimizer="adam"), 2, 1
    )
    assert one == other
    assert must_match(TrainConfig(seed=2914), 2, 1) != must_match(TrainConfig(seed=7535), 2, 1)
    # 24 bits of hash let these two seeds pass as equal; 63 do not
    assert agreement._hash("2914") != agreement._hash("7535")


def test_a_long_value_is_cut_on_a_character_and_marked():
    text = agreement._decode(agreement._encode("/data/" + "é" * 40))
    assert text.endswith("…") and "\ufffd" not in text and len(text.encode()) <= 60


class _Workers:
    """Two workers' settings behind a distribution's ``gather`` (one row per worker): for each
    call, what each side of check_agreement sends at that point."""

    def __init__(self, mine: dict, theirs: dict):
        self.sides, self.workers, self.task, self.calls = [mine, theirs], 2, "worker 0", 0

    def _sent(self, side: dict, call: int) -> list[int]:
        names = sorted(side)
        if call == 1:
            return [len(names), *agreement._hash("\n".join(names))]
        if call == 2:
            return [p for n in names for p in agreement._hash(side[n])]
        flag = next(n for n in names if side[n] != self.sides[1 - self.sides.index(side)][n])
        return list(agreement._encode(side[flag]))

    def gather(self, values):
        self.calls += 1
        rows = [self._sent(side, self.calls) for side in self.sides]
        assert list(values) == rows[0]  # what this worker sent
        return np.array(rows)


def test_the_first_differing_flag_is_named_with_both_values_and_the_rest_listed():
    a = must_match(TrainConfig(seed=1, lr=0.5), 2, 1)
    b = must_match(TrainConfig(seed=2), 2, 1)
    workers = _Workers(a, b)
    with pytest.raises(ConfigError) as e:
        check_agreement(a, workers)
    assert str(e.value) == (
        "worker 0: the workers disagree on --lr (worker 0: --lr 0.5, "
        "worker 1: --lr 0.01) (they differ in --seed too); give every "
        "worker the same --lr, or they train different models"
    )
    same = _Workers(a, dict(a))
    check_agreement(a, same)  # no error: the list of settings, then their hashes
    assert same.calls == 2
    newer = _Workers(a, {**a, "--new-flag": "1"})
    with pytest.raises(
        ConfigError,
        match=r"^worker 0: the workers run different versions of "
        r"mirrorfit \(\d+, \d+ settings\); install the same",
    ):
        check_agreement(a, newer)


def _ports(n: int) -> list[str]:
    return [f"127.0.0.1:{port}" for port in free_ports(n)]


def _two_workers(backend: str, per_worker: list[list[str]]) -> list[tuple[int, str]]:
    """``mirrorfit train`` as two multi-worker tasks under hand-made TF_CONFIGs, worker i with
    ``per_worker[i]`` added: (exit code, stderr) of each."""
    workers = _ports(2)
    procs = []
    for index in (0, 1):
        env = dict(
            _env(),
            TF_CONFIG=json.dumps(
                {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
            ),
        )
        argv = ["train", "--backend", backend, "--strategy", "multi-worker", *RUN]
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "mirrorfit", *argv, *per_worker[index]],
                env=env,
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    errs = [p.communicate(timeout=300)[1] for p in procs]
    return [(p.returncode, err) for p, err in zip(procs, errs)]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["jax", "tensorflow"])
def test_workers_with_different_seeds_both_exit_2_naming_the_seed(backend):
    for index, (code, err) in enumerate(_two_workers(backend, [["--seed", "1"], ["--seed", "2"]])):
        assert code == 2, err[-3000:]
        assert err.strip().splitlines()[-1] == (
            f"mirrorfit: error: worker {index}: the workers disagree on --seed (worker 0: "
            "--seed 1, worker 1: --seed 2); give every worker the same --seed, or they train "
            "different models"
        )


def _npz(path: Path, shift: int) -> str:
    rng = np.random.default_rng(0)
    x = rng.integers(0, 255, size=(1024, 8, 8), dtype=np.uint8)
    y = rng.integers(0, 10, size=1024)
    y[:shift] = (y[:shift] + 1) % 10  # the same shapes and classes, other labels
    np.savez(path, x_train=x, y_train=y)
    return str(path)


def test_a_summary_of_array_data_holds_their_bytes(tmp_path):
    from mirrorfit.data.sources import load_data

    def data(spec):
        return load_data(spec, global_batch=64, seed=0, workers=2, eval_batch=64)

    assert agreement.data_summary(data(_npz(tmp_path / "a.npz", 0))) != agreement.data_summary(
        data(_npz(tmp_path / "b.npz", 20))
    )
    same = agreement.data_summary(data(_npz(tmp_path / "c.npz", 0)))
    assert same == agreement.data_summary(data(_npz(tmp_path / "a.npz", 0)))  # not the path
    assert "the training data's content" in same


@pytest.mark.slow
def test_workers_reading_other_labels_both_exit_2_naming_the_data(tmp_path):
    """Worker 1's copy of the data has 20 labels changed: on main both trained on, exit 0 (the
    counts and shapes agreed); now both stop before the first step."""
    files = [_npz(tmp_path / "w0.npz", 0), _npz(tmp_path / "w1.npz", 20)]
    ran = _two_workers("jax", [["--model", "mlp", "--data", f] for f in files])
    for index, (code, err) in enumerate(ran):
        assert code == 2, err[-3000:]
        last = err.strip().splitlines()[-1]
        assert f"worker {index}: the workers disagree on the training data's content" in last
        assert "give every worker the same data (copies of it)" in last


@pytest.mark.slow
def test_under_launch_the_group_stops_on_the_usage_error(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mirrorfit",
            "launch",
            "--workers",
            "2",
            "--max-restarts",
            "2",
            "--",
            sys.executable,
            str(HERE / "task_seed_driver.py"),  # each task's --seed: 1 on worker 0, 2 on 1
            "train",
            "--backend",
            "tensorflow",
            "--strategy",
            "multi-worker",
            *RUN,
        ],
        env=_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    assert "the workers disagree on --seed (worker 0: --seed 1, worker 1: --seed 2)" in out
    assert "(a usage error, which a restart would repeat)" in out
    assert "restart 1" not in out
