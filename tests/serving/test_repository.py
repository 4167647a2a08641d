"""serving.repository: version policies, load-before-unload, broken versions, labels, and the
lookup errors TF Serving gives. The loader is a stand-in here; the real one is exercised by
the server tests."""

import time

import pytest

from mirrorfit.serving.errors import ServingError
from mirrorfit.serving.model_config import ModelConfig, VersionPolicy
from mirrorfit.serving.repository import ModelRepository


class _Loader:
    def __init__(self, broken=()):
        self.broken, self.calls = set(broken), []

    def __call__(self, name, version, path):
        self.calls.append(version)
        if version in self.broken:
            raise OSError(f"cannot parse {path}/saved_model.pb")
        return f"{name}:{version}"


class _Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def _repo(tmp_path, versions, policy=VersionPolicy(), labels=None, broken=(), clock=None):
    for v in versions:
        (tmp_path / f"{v:04d}").mkdir(exist_ok=True)
    (tmp_path / ".tmp-0009-123").mkdir(exist_ok=True)  # an export being written: ignored
    loader = _Loader(broken)
    repo = ModelRepository([ModelConfig("m", str(tmp_path), policy, labels or {})],
                           loader=loader, max_load_retries=2, retry_interval_s=60,
                           clock=clock or _Clock())
    repo.poll_once()
    return repo, loader


def test_latest_serves_the_newest_and_swaps_when_a_new_one_lands(tmp_path):
    repo, loader = _repo(tmp_path, [1, 2])
    assert repo.resolve("m") == "m:2" and loader.calls == [2]
    (tmp_path / "0003").mkdir()
    repo.poll_once()
    assert repo.resolve("m") == "m:3"
    states = {s.version: s.state for s in repo.status("m")}
    assert states == {3: "AVAILABLE", 2: "END"}
    with pytest.raises(ServingError, match=r"Servable not found for request: Specific\(m, 2\)"):
        repo.resolve("m", version=2)


def test_all_and_specific_policies(tmp_path):
    repo, _ = _repo(tmp_path, [1, 2, 3], VersionPolicy(kind="all"))
    assert [repo.resolve("m", version=v) for v in (1, 2, 3)] == ["m:1", "m:2", "m:3"]
    other = tmp_path / "other"
    other.mkdir()
    repo, _ = _repo(other, [1, 2, 3], VersionPolicy(kind="specific", versions=(1, 3)),
                    labels={"stable": 1, "canary": 3})
    assert repo.resolve("m", label="stable") == "m:1"
    assert repo.resolve("m", label="canary") == "m:3" == repo.resolve("m")
    with pytest.raises(ServingError, match="Unrecognized servable version label: beta"):
        repo.resolve("m", label="beta")


def test_a_broken_new_version_never_serves_and_the_old_one_stays(tmp_path):
    clock = _Clock()
    repo, loader = _repo(tmp_path, [1], clock=clock)
    (tmp_path / "0002").mkdir()
    loader.broken.add(2)
    for _ in range(10):  # polls within the retry interval do not retry
        repo.poll_once()
    assert loader.calls.count(2) == 1
    assert repo.next_retry_in() == 60
    for _ in range(5):
        clock.now += 60
        repo.poll_once()
    assert repo.resolve("m") == "m:1"
    status = {s.version: s for s in repo.status("m")}
    assert status[2].state == "END" and "cannot parse" in status[2].error_message
    assert status[1].state == "AVAILABLE"
    # issue 10 item 7: the first attempt and --max_num_load_retries=2 retries (was 2 in all)
    assert loader.calls.count(2) == 3
    assert repo.next_retry_in() is None


def test_a_version_that_becomes_loadable_is_picked_up(tmp_path):
    # A slow, non-atomic copy into 0002: it fails while half there, is retried, and once
    # retries are spent it is tried again when its folder changes (the copy completed).
    clock = _Clock()
    repo, loader = _repo(tmp_path, [1], clock=clock)
    (tmp_path / "0002").mkdir()
    (tmp_path / "0002" / "saved_model.pb").write_bytes(b"half")
    loader.broken.add(2)
    for _ in range(4):
        repo.poll_once()
        clock.now += 60
    assert loader.calls.count(2) == 3 and repo.resolve("m") == "m:1"
    (tmp_path / "0002" / "saved_model.pb").write_bytes(b"the whole file")
    (tmp_path / "0002" / "variables").mkdir()
    (tmp_path / "0002" / "variables" / "variables.index").write_bytes(b"x")
    loader.broken.discard(2)
    repo.poll_once()
    assert repo.resolve("m") == "m:2"
    assert {s.version: s.state for s in repo.status("m")} == {2: "AVAILABLE", 1: "END"}


def test_a_retry_that_fails_on_new_content_starts_a_new_round(tmp_path):
    clock = _Clock()
    repo, loader = _repo(tmp_path, [1], clock=clock)
    (tmp_path / "0002").mkdir()
    loader.broken.add(2)
    repo.poll_once()
    (tmp_path / "0002" / "saved_model.pb").write_bytes(b"more")  # the copy goes on
    clock.now += 60
    repo.poll_once()
    assert loader.calls.count(2) == 2 and repo.next_retry_in() == 60  # retries not spent


@pytest.mark.parametrize("names", [["²"], ["٣"], ["-1", "+2", " 3", "1e3"],
                                   [str(2 ** 63), "not-a-version"]])
def test_folder_names_that_are_not_ascii_int64_are_ignored(tmp_path, names):
    # issue 10 item 7: "²".isdigit() is True and int("²") raises: start-up crashed and every
    # later poll failed, so a good 0003 was never loaded
    for name in names:
        (tmp_path / name).mkdir()
    repo, loader = _repo(tmp_path, [1])
    assert repo.resolve("m") == "m:1"
    (tmp_path / "0003").mkdir()
    repo.poll_once()
    assert repo.resolve("m") == "m:3" and loader.calls == [1, 3]


def test_retries_run_with_polling_off(tmp_path):
    loader = _Loader(broken={1})
    (tmp_path / "0001").mkdir()
    repo = ModelRepository([ModelConfig("m", str(tmp_path))], loader=loader,
                           max_load_retries=1, retry_interval_s=0.05)
    repo.poll_once()
    assert not repo.ready()
    loader.broken.clear()
    (tmp_path / "0002").mkdir()  # not seen: polling is off (TF Serving's 0: poll once)
    repo.start_polling(0)
    try:
        deadline = time.monotonic() + 5
        while not repo.ready() and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        repo.stop()
    assert repo.resolve("m") == "m:1" and loader.calls == [1, 1]


def test_a_broken_newest_version_at_start_falls_back_to_the_previous(tmp_path):
    repo, _ = _repo(tmp_path, [1, 2], broken={2})
    assert repo.resolve("m") == "m:1" and repo.ready()


def test_unknown_model_and_versions(tmp_path):
    repo, _ = _repo(tmp_path, [1])
    with pytest.raises(ServingError, match=r"Servable not found for request: Latest\(x\)"):
        repo.resolve("x")
    with pytest.raises(ServingError, match="Could not find any versions of model x"):
        repo.status("x")
    with pytest.raises(ServingError, match="Could not find version 7 of model m"):
        repo.status("m", 7)


def test_not_ready_until_every_model_serves(tmp_path):
    repo, _ = _repo(tmp_path, [])
    assert not repo.ready()
    (tmp_path / "0001").mkdir()
    repo.poll_once()
    assert repo.ready()
