"""job.checks: what a run checks before any framework loads, in one place: its cluster, where it
writes (only the chief), this task's own port."""

import json
import socket

import pytest

from mirrorfit.config import load_config
from mirrorfit.errors import ConfigError
from mirrorfit.job.checks import check_run


def test_a_one_process_run_checks_its_outputs(tmp_path, monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    (tmp_path / "file").write_text("")
    assert check_run(load_config(checkpoint_dir=str(tmp_path / "ckpt"))) is None
    with pytest.raises(ConfigError, match="--checkpoint-dir"):
        check_run(load_config(checkpoint_dir=str(tmp_path / "file" / "ckpt")))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_cluster_task_checks_its_port_and_only_the_chief_its_outputs(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    bad_outputs = load_config(
        strategy="multi-worker", checkpoint_dir=str(tmp_path / "file" / "ckpt")
    )
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        free = _free_port()
        cluster = {"worker": [f"127.0.0.1:{taken}", f"127.0.0.1:{free}"]}
        monkeypatch.setenv(
            "TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 1}})
        )
        # not the chief: it writes nothing, so its outputs are not checked; its port is free
        assert check_run(bad_outputs).task_index == 1
        monkeypatch.setenv(
            "TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 0}})
        )
        with pytest.raises(ConfigError, match="--checkpoint-dir"):
            check_run(bad_outputs)  # the chief checks where it writes first
        with pytest.raises(ConfigError, match=f"this task's port {taken} .* is in use"):
            check_run(load_config(strategy="multi-worker"))
