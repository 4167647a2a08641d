"""serving.repository: version policies, load-before-unload, broken versions, labels, and the
lookup errors TF Serving gives. The loader is a stand-in here; the real one is exercised by
the server tests."""

import logging
import os
import time

import pytest

from mirrorfit.errors import ConfigError
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


def _version(base, v, saved_model=b"a SavedModel"):
    """A version folder; the stand-in loader reads nothing, but a folder without a SavedModel
    file is not loaded at all."""
    (base / f"{v:04d}").mkdir(parents=True, exist_ok=True)
    if saved_model is not None:
        (base / f"{v:04d}" / "saved_model.pb").write_bytes(saved_model)
    return base / f"{v:04d}"


def _repo(
    tmp_path, versions, policy=VersionPolicy(), labels=None, broken=(), clock=None, **options
):
    for v in versions:
        _version(tmp_path, v)
    (tmp_path / ".tmp-0009-123").mkdir(exist_ok=True)  # an export being written: ignored
    loader = _Loader(broken)
    repo = ModelRepository(
        [ModelConfig("m", str(tmp_path), policy, labels or {})],
        loader=loader,
        max_load_retries=2,
        retry_interval_s=60,
        clock=clock or _Clock(),
        **options,
    )
    repo.poll_once()
    return repo, loader


def _events(caplog, event):
    return [r for r in caplog.records if r.getMessage() == event]


def test_latest_serves_the_newest_and_swaps_when_a_new_one_lands(tmp_path):
    repo, loader = _repo(tmp_path, [1, 2])
    assert repo.resolve("m") == "m:2" and loader.calls == [2]
    _version(tmp_path, 3)
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
    repo, _ = _repo(
        other,
        [1, 2, 3],
        VersionPolicy(kind="specific", versions=(1, 3)),
        labels={"stable": 1, "canary": 3},
    )
    assert repo.resolve("m", label="stable") == "m:1"
    assert repo.resolve("m", label="canary") == "m:3" == repo.resolve("m")
    with pytest.raises(ServingError, match="Unrecognized servable version label: beta"):
        repo.resolve("m", label="beta")


def test_a_broken_new_version_never_serves_and_the_old_one_stays(tmp_path):
    clock = _Clock()
    repo, loader = _repo(tmp_path, [1], clock=clock)
    _version(tmp_path, 2)
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


def test_a_version_whose_copy_completes_is_loaded_once_it_stops_changing(tmp_path):
    # A slow, non-atomic copy into 0002: it fails while half there; once its folder has
    # changed and then stayed as it is over one poll, it is tried again, without waiting for
    # --load_retry_interval_micros (issue 27 item 2: it waited 60 s).
    clock = _Clock()
    repo, loader = _repo(tmp_path, [1], clock=clock)
    _version(tmp_path, 2, b"half")
    loader.broken.add(2)
    repo.poll_once()
    assert loader.calls.count(2) == 1 and repo.resolve("m") == "m:1"
    (tmp_path / "0002" / "saved_model.pb").write_bytes(b"the whole file")
    loader.broken.discard(2)
    repo.poll_once()  # changed since the failure, but maybe still being written
    assert loader.calls.count(2) == 1
    (tmp_path / "0002" / "variables").mkdir()  # ... and it was
    (tmp_path / "0002" / "variables" / "variables.index").write_bytes(b"x")
    repo.poll_once()
    assert loader.calls.count(2) == 1
    repo.poll_once()  # as it was at the poll before: the copy is over
    assert repo.resolve("m") == "m:2" and loader.calls.count(2) == 2
    assert {s.version: s.state for s in repo.status("m")} == {2: "AVAILABLE", 1: "END"}


def test_a_version_whose_retries_are_spent_is_tried_again_when_its_folder_changes(tmp_path):
    clock = _Clock()
    repo, loader = _repo(tmp_path, [1], clock=clock)
    _version(tmp_path, 2, b"half")
    loader.broken.add(2)
    for _ in range(4):
        repo.poll_once()
        clock.now += 60
    assert loader.calls.count(2) == 3 and repo.next_retry_in() is None
    (tmp_path / "0002" / "saved_model.pb").write_bytes(b"the whole file")
    loader.broken.discard(2)
    repo.poll_once()
    repo.poll_once()
    assert repo.resolve("m") == "m:2"


def test_a_retry_that_fails_on_new_content_starts_a_new_round(tmp_path):
    clock = _Clock()
    repo, loader = _repo(tmp_path, [1], clock=clock)
    _version(tmp_path, 2)
    loader.broken.add(2)
    repo.poll_once()
    (tmp_path / "0002" / "saved_model.pb").write_bytes(b"more")  # the copy goes on
    repo.poll_once()
    repo.poll_once()
    assert loader.calls.count(2) == 2 and repo.next_retry_in() == 60  # retries not spent


@pytest.mark.parametrize(
    "names", [["²"], ["٣"], ["-1", "+2", " 3", "1e3"], [str(2**63), "not-a-version"]]
)
def test_folder_names_that_are_not_ascii_int64_are_ignored(tmp_path, names):
    # issue 10 item 7: "²".isdigit() is True and int("²") raises: start-up crashed and every
    # later poll failed, so a good 0003 was never loaded
    for name in names:
        (tmp_path / name).mkdir()
    repo, loader = _repo(tmp_path, [1])
    assert repo.resolve("m") == "m:1"
    _version(tmp_path, 3)
    repo.poll_once()
    assert repo.resolve("m") == "m:3" and loader.calls == [1, 3]


def test_retries_run_with_polling_off(tmp_path):
    loader = _Loader(broken={1})
    _version(tmp_path, 1)
    repo = ModelRepository(
        [ModelConfig("m", str(tmp_path))], loader=loader, max_load_retries=1, retry_interval_s=0.05
    )
    repo.poll_once()
    assert not repo.ready()
    loader.broken.clear()
    _version(tmp_path, 2)  # not seen: polling is off (TF Serving's 0: poll once)
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
    _version(tmp_path, 1)
    repo.poll_once()
    assert repo.ready()


# ---- issue 27: an operator's faults -----------------------------------------------------


@pytest.mark.parametrize("fault", ["renamed", "link loop", "a file"])
def test_an_unreadable_base_path_keeps_what_is_loaded(tmp_path, caplog, fault):
    base, clock = tmp_path / "m", _Clock()
    repo, _ = _repo(base, [1], clock=clock)
    aside = tmp_path / "m.gone"
    base.rename(aside)
    if fault == "link loop":
        base.symlink_to(base)
    elif fault == "a file":
        base.write_text("not a folder")
    with caplog.at_level(logging.INFO, logger="mirrorfit.serving"):
        for _ in range(5):
            repo.poll_once()
        assert repo.resolve("m") == "m:1" and repo.ready()
        assert {s.state for s in repo.status("m")} == {"AVAILABLE"}
        [warning] = _events(caplog, "poll failed")  # one line, not one per poll
        assert warning.levelname == "WARNING" and warning.path == str(base)
        assert warning.serving == [1]
        error = {
            "renamed": "FileNotFoundError",
            "link loop": "Too many levels of symbolic links",
            "a file": "NotADirectoryError",
        }[fault]
        assert error in warning.error
        clock.now += 61  # the next interval: one more line, counting those held back
        repo.poll_once()
        assert [r.held_back for r in _events(caplog, "poll failed")[1:]] == [4]
        if base.is_symlink() or base.is_file():
            base.unlink()
        aside.rename(base)
        repo.poll_once()
        assert len(_events(caplog, "base path readable again")) == 1
    assert repo.resolve("m") == "m:1"


def test_a_base_path_with_no_versions_is_logged_when_found(tmp_path, caplog):
    (tmp_path / "passwd").write_text("like /etc")
    (tmp_path / "ssl").mkdir()
    with caplog.at_level(logging.WARNING, logger="mirrorfit.serving"):
        repo, _ = _repo(tmp_path, [])
        for _ in range(3):
            repo.poll_once()
        [warning] = _events(caplog, "no versions")
        assert warning.path == str(tmp_path) and warning.action == "nothing to serve"
        _version(tmp_path, 1)
        repo.poll_once()
        assert repo.ready()
        (tmp_path / "0001" / "saved_model.pb").unlink()
        (tmp_path / "0001").rmdir()
        repo.poll_once()  # no versions again: unloaded (the default), and said so
        assert not repo.ready() and len(_events(caplog, "no versions")) == 2
        assert _events(caplog, "no versions")[1].action.startswith("unloading every version")


def test_versions_always_present_keeps_versions_when_the_base_path_is_emptied(tmp_path, caplog):
    repo, _ = _repo(tmp_path, [1], versions_always_present=True)
    (tmp_path / "0001").rename(tmp_path / ".0001-old")
    with caplog.at_level(logging.WARNING, logger="mirrorfit.serving"):
        repo.poll_once()
        repo.poll_once()
    assert repo.resolve("m") == "m:1" and repo.ready()
    [warning] = _events(caplog, "no versions")
    assert "--servable_versions_always_present" in warning.action
    # and a config naming a model with no versions is refused, as at start-up
    (tmp_path / ".0001-old").rename(tmp_path / "0001")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match=r"model 'e' has no versions under .*empty"):
        repo.reconfigure([ModelConfig("m", str(tmp_path)), ModelConfig("e", str(empty))])
    assert set(repo.configs) == {"m"}


def test_version_folders_without_a_saved_model_are_not_loaded_and_logged_once(tmp_path, caplog):
    # issue 27 item 5: a base path of /proc tried to load every process folder, one "load
    # failed" line each, one more per new process
    clock = _Clock()
    for pid in range(100, 140):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "status").write_text("a process")
    with caplog.at_level(logging.WARNING, logger="mirrorfit.serving"):
        repo, loader = _repo(tmp_path, [], clock=clock)
        for pid in range(140, 145):  # new processes
            (tmp_path / str(pid)).mkdir()
            repo.poll_once()
        assert loader.calls == [] and not _events(caplog, "load failed")
        [warning] = _events(caplog, "no SavedModel")
        assert warning.count == 40 and warning.versions[:2] == [100, 101]
        with pytest.raises(ServingError, match="Could not find any versions of model m"):
            repo.status("m")  # not versions yet: no status entries
        clock.now += 61
        repo.poll_once()
        assert [r.versions for r in _events(caplog, "no SavedModel")[1:]] == [
            [140, 141, 142, 143, 144]
        ]
        (tmp_path / "144" / "saved_model.pbtxt").write_text("now it is one")
        repo.poll_once()
    assert loader.calls == [144] and repo.resolve("m") == "m:144"


def test_reconfigure_adds_removes_and_changes_models(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for v in (1, 2):
        _version(a, v)
    _version(b, 5)
    unloaded = []
    repo = ModelRepository(
        [ModelConfig("a", str(a))],
        loader=_Loader(),
        clock=_Clock(),
        on_unload=lambda name, version: unloaded.append((name, version)),
    )
    repo.poll_once()
    assert repo.resolve("a") == "a:2"
    repo.reconfigure(
        [
            ModelConfig(
                "a", str(a), VersionPolicy("specific", versions=(1,)), labels={"stable": 1}
            ),
            ModelConfig("b", str(b)),
        ]
    )
    assert repo.resolve("a", label="stable") == "a:1" == repo.resolve("a")
    assert repo.resolve("b") == "b:5" and repo.ready()
    repo.reconfigure([ModelConfig("b", str(b))])
    with pytest.raises(ServingError, match=r"Servable not found for request: Latest\(a\)"):
        repo.resolve("a")
    with pytest.raises(ServingError, match="Could not find any versions of model a"):
        repo.status("a")
    assert ("a", 1) in unloaded and repo.ready()


def test_a_base_path_that_is_a_link_is_followed_on_each_poll(tmp_path):
    # a deploy that repoints models/m -> releases/N is seen (--model_base_path resolved the
    # link once, at start)
    from mirrorfit.serving.model_config import from_flags

    _version(tmp_path / "r1", 1)
    _version(tmp_path / "r2", 7)
    link = tmp_path / "m"
    link.symlink_to(tmp_path / "r1")
    [config] = from_flags("m", str(link))
    repo = ModelRepository([config], loader=_Loader(), clock=_Clock())
    repo.poll_once()
    assert repo.resolve("m") == "m:1"
    tmp = tmp_path / "m.new"
    tmp.symlink_to(tmp_path / "r2")
    os.replace(tmp, link)
    repo.poll_once()
    assert repo.resolve("m") == "m:7"
