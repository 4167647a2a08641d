"""The model repository: which versions exist on disk, which are loaded, and what a request gets.

A poll (every ``--file_system_poll_wait_seconds``) lists each model's numeric version folders,
applies the version policy, loads and warms up new versions *before* they take traffic, and only
then unloads the versions the policy no longer wants. The table requests read is replaced
whole (copy on write), so a request holds the version it resolved until it finishes: no request
fails during a swap.

A version that fails to load is shown in the status and never served, while the newest version
that did load keeps serving. As in TF Serving it is retried ``--max_num_load_retries`` times
after the first attempt, ``--load_retry_interval_micros`` apart. Having given up, it is tried
again once its folder changes (a slow, non-atomic copy that has since completed). (TF Serving
would serve nothing at start-up when the newest version is broken; passing over it to the
previous one is a deliberate difference.)

A version folder's name is ASCII digits that fit in int64 (``00000123`` is 123), as TF
Serving's ``SimpleAtoi`` reads it; any other name (``²``, ``٣``, ``.tmp-0009``) is ignored.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from mirrorfit.serving.errors import ServingError, invalid, not_found
from mirrorfit.serving.loader import LoadedVersion
from mirrorfit.serving.model_config import ModelConfig
from mirrorfit.artifacts.version_names import parse_version

log = logging.getLogger("mirrorfit.serving")

# ModelVersionStatus.State names, as TF Serving reports them
START, LOADING, AVAILABLE, UNLOADING, END = "START", "LOADING", "AVAILABLE", "UNLOADING", "END"


@dataclass(frozen=True)
class VersionStatus:
    """What the status API reports for one version."""

    version: int
    state: str
    error_code: str = "OK"  # a tensorflow.error.Code name
    error_message: str = ""


@dataclass(frozen=True)
class _Failure:
    """A version that failed to load: when it may be tried again, and on what content."""

    retries: int  # attempts after the first one, on this content
    next_try: float  # clock time
    content: int  # a hash of the folder's files (names, sizes, mtimes) when it failed


Loader = Callable[[str, int, str], LoadedVersion]  # (name, version, path) -> loaded


class ModelRepository:
    """Serves the models in ``configs``; ``loader`` loads one version folder."""

    def __init__(self, configs: list[ModelConfig], *, loader: Loader,
                 max_load_retries: int = 5, retry_interval_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic,
                 on_unload: Callable[[str, int], None] = lambda name, version: None) -> None:
        self.configs = {c.name: c for c in configs}
        self._loader = loader
        self._on_unload = on_unload
        self._max_retries = max_load_retries
        self._retry_interval_s = retry_interval_s
        self._clock = clock
        self._folders: dict[str, dict[int, str]] = {}  # last listing: version -> folder name
        self._live: dict[str, dict[int, LoadedVersion]] = {c.name: {} for c in configs}
        self._status: dict[str, dict[int, VersionStatus]] = {c.name: {} for c in configs}
        self._failures: dict[tuple[str, int], _Failure] = {}
        self._lock = threading.Lock()  # guards writers; readers take a reference to a table
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- requests ----------------------------------------------------------------------
    def resolve(self, name: str, version: int | None = None,
                label: str | None = None) -> LoadedVersion:
        """The loaded version a request names (latest when neither version nor label)."""
        live = self._live.get(name) or {}
        if label is not None:
            config = self.configs.get(name)
            if config is None or label not in config.labels:
                raise invalid(f"Unrecognized servable version label: {label}")
            version = config.labels[label]
        if version is None and live:
            return live[max(live)]
        if version in live:
            return live[version]
        wanted = f"Latest({name})" if version is None else f"Specific({name}, {version})"
        raise not_found(f"Servable not found for request: {wanted}")

    def status(self, name: str, version: int | None = None) -> list[VersionStatus]:
        """Every known version's status (or one version's), newest first."""
        known = self._status.get(name)
        if not known:
            raise not_found(f"Could not find any versions of model {name}")
        if version is not None:
            if version not in known:
                raise not_found(f"Could not find version {version} of model {name}")
            return [known[version]]
        return [known[v] for v in sorted(known, reverse=True)]

    def ready(self) -> bool:
        """Every configured model has at least one version serving."""
        return all(self._live[name] for name in self.configs)

    # ---- polling -----------------------------------------------------------------------
    def poll_once(self, rescan: bool = True) -> None:
        """Bring every model in line with what is on disk and its policy (with ``rescan``
        False, only retry the versions seen last time). A model whose folder cannot be read
        is logged and left as it is; the others go on."""
        for config in self.configs.values():
            try:
                self._sync(config, rescan)
            except OSError as e:
                log.error("poll failed", extra={"model": config.name, "path": config.base_path,
                                                "error": f"{type(e).__name__}: {e}"[:500]})

    def _sync(self, config: ModelConfig, rescan: bool = True) -> None:
        name = config.name
        if rescan or name not in self._folders:
            self._folders[name] = _version_folders(Path(config.base_path))
        folders = self._folders[name]
        on_disk = sorted(folders)
        for key in [k for k in self._failures if k[0] == name and k[1] not in folders]:
            del self._failures[key]  # gone from disk: a new copy starts afresh
        now = self._clock()
        for version in config.policy.select(on_disk):  # retry broken versions the policy wants
            if version not in self._live[name] and self._retry_due(config, version, now):
                self._load(config, version)
        # Versions that failed are passed over, so an older good one keeps (or starts) serving:
        # select again after each failure (at most once per version on disk).
        while True:
            healthy = [v for v in on_disk if (name, v) not in self._failures]
            wanted = config.policy.select(healthy)
            missing = [v for v in wanted if v not in self._live[name]]
            for version in missing:
                self._load(config, version)
            if all(v in self._live[name] for v in missing):
                break
        unwanted = [v for v in self._live[name] if v not in wanted]
        if any(v in self._live[name] for v in wanted) or not on_disk:
            for version in unwanted:  # only once a wanted one serves: availability first
                self._unload(name, version)

    def _retry_due(self, config: ModelConfig, version: int, now: float) -> bool:
        failure = self._failures.get((config.name, version))
        if failure is None or now < failure.next_try:
            return False
        return failure.retries < self._max_retries or \
            _content(self._path(config, version)) != failure.content

    def next_retry_in(self) -> float | None:
        """Seconds until a failed version is due for a retry (None: none left to retry
        unless its folder changes)."""
        due = [f.next_try for f in self._failures.values() if f.retries < self._max_retries]
        return max(0.0, min(due) - self._clock()) if due else None

    def _path(self, config: ModelConfig, version: int) -> Path:
        return Path(config.base_path) / self._folders[config.name].get(version, str(version))

    def _load(self, config: ModelConfig, version: int) -> None:
        name = config.name
        self._set_status(name, VersionStatus(version, LOADING))
        path = self._path(config, version)
        log.info("loading", extra={"model": name, "version": version, "path": str(path)})
        try:
            loaded = self._loader(name, version, str(path))
        except Exception as e:  # noqa: BLE001 - any broken SavedModel: record, never serve
            key, content = (name, version), _content(path)
            before = self._failures.get(key)
            retries = before.retries + 1 if before and before.content == content else 0
            self._failures[key] = _Failure(retries, self._clock() + self._retry_interval_s,
                                           content)
            message = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e) else ''}"
            self._set_status(name, VersionStatus(version, END, "UNKNOWN", message[:500]))
            left = max(0, self._max_retries - retries)
            log.error("load failed", extra={"model": name, "version": version,
                                            "error": message[:500], "retries_left": left,
                                            "retry_in_s": self._retry_interval_s if left
                                            else None})
            return
        self._failures.pop((name, version), None)
        with self._lock:
            self._live = {**self._live, name: {**self._live[name], version: loaded}}
        self._set_status(name, VersionStatus(version, AVAILABLE))
        log.info("available", extra={"model": name, "version": version})

    def _unload(self, name: str, version: int) -> None:
        self._set_status(name, VersionStatus(version, UNLOADING))
        with self._lock:
            table = dict(self._live[name])
            table.pop(version, None)
            self._live = {**self._live, name: table}
        # Requests that resolved it keep their reference until they finish.
        self._on_unload(name, version)
        self._set_status(name, VersionStatus(version, END))
        log.info("unloaded", extra={"model": name, "version": version})

    def _set_status(self, name: str, status: VersionStatus) -> None:
        with self._lock:
            self._status = {**self._status,
                            name: {**self._status[name], status.version: status}}

    def start_polling(self, interval_s: float) -> None:
        """Poll every ``interval_s`` seconds in a background thread (TF Serving: 0 = poll
        once at start, which the caller did; negative = never), and sooner when a failed
        version is due for a retry (retries run with polling off too, on the versions seen)."""

        def wait_s() -> float | None:
            waits = [w for w in (interval_s if interval_s > 0 else None, self.next_retry_in())
                     if w is not None]
            return min(waits) if waits else None

        def loop() -> None:
            while (wait := wait_s()) is not None and not self._stop.wait(wait):
                try:
                    self.poll_once(rescan=interval_s > 0)
                except Exception as e:  # noqa: BLE001 - keep serving what is loaded
                    log.error("poll failed", extra={"error": f"{type(e).__name__}: {e}"[:500]})

        self._thread = threading.Thread(target=loop, name="model-poller", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)


def _version_folders(base: Path) -> dict[int, str]:
    """Version -> folder name, for child folders named by an int64 (``00000123`` is 123),
    as TF Serving reads them. Where two names give one number, the first in order wins."""
    if not base.is_dir():
        return {}
    out: dict[int, str] = {}
    for child in sorted(base.iterdir()):
        version = parse_version(child.name)  # the exporter's parser: what it writes, we see
        if version is not None and child.is_dir():
            out.setdefault(version, child.name)
    return out


def _content(path: Path) -> int:
    """A hash of the files under ``path`` (names, sizes, mtimes): changes as a copy goes on."""
    entries = []
    for root, _, files in os.walk(path):
        for f in files:
            try:
                st = os.stat(os.path.join(root, f))
            except OSError:  # removed while we looked
                continue
            entries.append((os.path.relpath(os.path.join(root, f), path), st.st_size,
                            st.st_mtime_ns))
    return hash(tuple(sorted(entries)))


__all__ = ["ModelRepository", "VersionStatus", "START", "LOADING", "AVAILABLE", "UNLOADING",
           "END", "ServingError"]
