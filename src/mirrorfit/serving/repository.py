"""The model repository: which versions exist on disk, which are loaded, and what a request gets.

A poll (every ``--file_system_poll_wait_seconds``) lists each model's numeric version folders
(ASCII digits that fit in int64, as TF Serving's ``SimpleAtoi``), applies the version policy,
loads and warms up new versions before they take traffic, then unloads the unwanted ones. The
table requests read is replaced whole (copy on write): no request fails during a swap. What an
operator does to the folders is not an outage. (why: docs/architecture.md#serving)
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from mirrorfit.serving import disk
from mirrorfit.serving.errors import ServingError, invalid, not_found
from mirrorfit.serving.loader import LoadedVersion
from mirrorfit.serving.log_limit import LogLimiter
from mirrorfit.serving.model_config import ModelConfig

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
    seen: int  # the same hash at the last poll: a change is retried once it stops changing


Loader = Callable[[str, int, str], LoadedVersion]  # (name, version, path) -> loaded


class ModelRepository:
    """Serves the models in ``configs``; ``loader`` loads one version folder."""

    def __init__(
        self,
        configs: list[ModelConfig],
        *,
        loader: Loader,
        max_load_retries: int = 5,
        retry_interval_s: float = 60.0,
        versions_always_present: bool = False,
        warn_every_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        on_unload: Callable[[str, int], None] = lambda name, version: None,
    ) -> None:
        self.configs = {c.name: c for c in configs}
        self._loader = loader
        self._on_unload = on_unload
        self._max_retries = max_load_retries
        self._retry_interval_s = retry_interval_s
        self._always_present = versions_always_present
        self._clock = clock
        self._folders: dict[str, dict[int, str]] = {}  # last listing: version -> folder name
        self._live: dict[str, dict[int, LoadedVersion]] = {c.name: {} for c in configs}
        self._status: dict[str, dict[int, VersionStatus]] = {c.name: {} for c in configs}
        self._failures: dict[tuple[str, int], _Failure] = {}
        # what has been logged about each model's folder, so each fault is told once
        self._unreadable: set[str] = set()
        self._empty: set[str] = set()
        self._incomplete: dict[str, set[int]] = {}
        self._warnings = LogLimiter(warn_every_s, clock)
        self._lock = threading.Lock()  # guards writers; readers take a reference to a table
        self._sync_lock = threading.RLock()  # one poll or reconfiguration at a time
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- requests ----------------------------------------------------------------------
    def resolve(
        self, name: str, version: int | None = None, label: str | None = None
    ) -> LoadedVersion:
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
        live = self._live
        return all(live.get(name) for name in self.configs)

    # ---- polling -----------------------------------------------------------------------
    def poll_once(self, rescan: bool = True) -> None:
        """Bring every model in line with what is on disk and its policy (with ``rescan``
        False, only retry the versions seen last time). A model whose folder cannot be read
        is logged and left as it is; the others go on."""
        with self._sync_lock:
            for config in list(self.configs.values()):
                try:
                    self._sync(config, rescan)
                except OSError as e:
                    self._unreadable.add(config.name)
                    self._warnings.log(
                        (config.name, "poll"),
                        logging.WARNING,
                        "poll failed",
                        model=config.name,
                        path=config.base_path,
                        error=f"{type(e).__name__}: {e}"[:500],
                        serving=sorted(self._live.get(config.name, ())),
                    )

    def _sync(self, config: ModelConfig, rescan: bool = True) -> None:
        name = config.name
        if rescan or name not in self._folders:
            self._folders[name] = disk.version_folders(Path(config.base_path))
            if name in self._unreadable:
                self._unreadable.discard(name)
                self._warnings.forget((name, "poll"))
                log.info(
                    "base path readable again", extra={"model": name, "path": config.base_path}
                )
        folders = self._folders[name]
        on_disk = sorted(v for v in folders if disk.has_saved_model(self._path(config, v)))
        self._note_incomplete(config, set(folders) - set(on_disk))
        for key in [k for k in self._failures if k[0] == name and k[1] not in on_disk]:
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
        if any(v in self._live[name] for v in wanted):
            for version in unwanted:  # only once a wanted one serves: availability first
                self._unload(name, version)
        self._note_empty(config, bool(folders))
        if not folders and not self._always_present:
            for version in unwanted:  # TF Serving's default: no versions, nothing served
                self._unload(name, version)

    def _note_empty(self, config: ModelConfig, has_versions: bool) -> None:
        """Log, when it starts, a base path that holds no version folders."""
        name = config.name
        if has_versions:
            self._empty.discard(name)
            return
        if name in self._empty:
            return
        self._empty.add(name)
        if not self._live[name]:
            action = "nothing to serve"
        elif self._always_present:
            action = "keeping the loaded versions (--servable_versions_always_present)"
        else:
            action = "unloading every version (--servable_versions_always_present keeps them)"
        log.warning(
            "no versions",
            extra={
                "model": name,
                "path": config.base_path,
                "looked_for": "folders named by a number",
                "action": action,
            },
        )

    def _note_incomplete(self, config: ModelConfig, incomplete: set[int]) -> None:
        """Log version folders without a SavedModel file once each (several in one line, at
        most one line per model and interval): a copy under way, or no model at all."""
        logged = self._incomplete.get(config.name, set()) & incomplete
        new = incomplete - logged
        if new and self._warnings.log(
            (config.name, "incomplete"),
            logging.WARNING,
            "no SavedModel",
            model=config.name,
            path=config.base_path,
            versions=sorted(new)[:20],
            count=len(new),
            looked_for=" or ".join(disk.SAVED_MODEL_FILES),
            action="not loaded until the file is there",
        ):
            logged |= new
        self._incomplete[config.name] = logged

    def _retry_due(self, config: ModelConfig, version: int, now: float) -> bool:
        key = (config.name, version)
        failure = self._failures.get(key)
        if failure is None:
            return False
        content = disk.content(self._path(config, version))
        self._failures[key] = replace(failure, seen=content)
        if content != failure.content:  # changed since it failed: retry once it settles
            return content == failure.seen
        return now >= failure.next_try and failure.retries < self._max_retries

    def next_retry_in(self) -> float | None:
        """Seconds until a failed version is due for a retry (None: none left to retry
        unless its folder changes)."""
        with self._sync_lock:  # a config reload may be loading in another thread
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
            key, content = (name, version), disk.content(path)
            before = self._failures.get(key)
            retries = before.retries + 1 if before and before.content == content else 0
            self._failures[key] = _Failure(
                retries, self._clock() + self._retry_interval_s, content, content
            )
            message = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e) else ''}"
            self._set_status(name, VersionStatus(version, END, "UNKNOWN", message[:500]))
            left = max(0, self._max_retries - retries)
            log.error(
                "load failed",
                extra={
                    "model": name,
                    "version": version,
                    "error": message[:500],
                    "retries_left": left,
                    "retry_in_s": self._retry_interval_s if left else None,
                    "also_retried": "when its folder changes",
                },
            )
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
            self._status = {**self._status, name: {**self._status[name], status.version: status}}

    # ---- a reloaded config file --------------------------------------------------------
    def reconfigure(self, configs: list[ModelConfig]) -> None:
        """Serve ``configs`` from now on: models added are loaded, models removed unloaded
        (their requests then get 404), a changed policy, labels or base path applies at once.
        With --servable_versions_always_present, a config naming a model with no versions
        is refused (ConfigError) and nothing changes, as in TF Serving."""
        new = {c.name: c for c in configs}
        with self._sync_lock:
            if self._always_present:
                disk.check_versions_present(configs)
            with self._lock:
                self._live = {**{n: {} for n in new}, **self._live}
                self._status = {**{n: {} for n in new}, **self._status}
            old, self.configs = self.configs, new
            for name, config in old.items():
                if name not in new or new[name].base_path != config.base_path:
                    self._forget_folder(name)
                if name not in new:
                    for version in list(self._live[name]):
                        self._unload(name, version)
                    with self._lock:
                        self._live = {n: t for n, t in self._live.items() if n != name}
                        self._status = {n: t for n, t in self._status.items() if n != name}
            self.poll_once()

    def _forget_folder(self, name: str) -> None:
        """What was seen and logged under a model's old base path."""
        self._folders.pop(name, None)
        self._failures = {k: f for k, f in self._failures.items() if k[0] != name}
        self._unreadable.discard(name)
        self._empty.discard(name)
        self._incomplete.pop(name, None)
        for kind in ("poll", "incomplete"):
            self._warnings.forget((name, kind))

    # ---- the poller thread -------------------------------------------------------------
    def start_polling(self, interval_s: float) -> None:
        """Poll every ``interval_s`` seconds in a background thread (TF Serving: 0 = poll
        once at start, which the caller did; negative = never), and sooner when a failed
        version is due for a retry (retries run with polling off too, on the versions seen)."""

        def wait_s() -> float | None:
            waits = [
                w
                for w in (interval_s if interval_s > 0 else None, self.next_retry_in())
                if w is not None
            ]
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


__all__ = [
    "ModelRepository",
    "VersionStatus",
    "START",
    "LOADING",
    "AVAILABLE",
    "UNLOADING",
    "END",
    "ServingError",
]
