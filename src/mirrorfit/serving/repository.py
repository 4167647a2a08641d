"""The model repository: which versions exist on disk, which are loaded, and what a request gets.

A poll (every ``--file_system_poll_wait_seconds``) lists each model's numeric version folders,
applies the version policy, loads and warms up new versions *before* they take traffic, and only
then unloads the versions the policy no longer wants. The table requests read is replaced
whole (copy on write), so a request holds the version it resolved until it finishes: no request
fails during a swap. A version that fails to load is shown in the status and never served; it is retried on later
polls (``--max_num_load_retries``) while the newest version that did load keeps serving. (TF
Serving would serve nothing at start-up when the newest version is broken; passing over it to
the previous one is a deliberate difference.)
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from mirrorfit.serving.errors import ServingError, invalid, not_found
from mirrorfit.serving.loader import LoadedVersion
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


Loader = Callable[[str, int, str], LoadedVersion]  # (name, version, path) -> loaded


class ModelRepository:
    """Serves the models in ``configs``; ``loader`` loads one version folder."""

    def __init__(self, configs: list[ModelConfig], *, loader: Loader,
                 max_load_retries: int = 5,
                 on_unload: Callable[[str, int], None] = lambda name, version: None) -> None:
        self.configs = {c.name: c for c in configs}
        self._loader = loader
        self._on_unload = on_unload
        self._max_retries = max_load_retries
        self._live: dict[str, dict[int, LoadedVersion]] = {c.name: {} for c in configs}
        self._status: dict[str, dict[int, VersionStatus]] = {c.name: {} for c in configs}
        self._failures: dict[tuple[str, int], int] = {}
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
    def poll_once(self) -> None:
        """Bring every model in line with what is on disk and its policy."""
        for config in self.configs.values():
            self._sync(config)

    def _sync(self, config: ModelConfig) -> None:
        name = config.name
        on_disk = _numeric_versions(Path(config.base_path))
        for version in config.policy.select(on_disk):  # retry broken versions the policy wants
            tries = self._failures.get((name, version), 0)
            if 0 < tries < self._max_retries and version not in self._live[name]:
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

    def _load(self, config: ModelConfig, version: int) -> None:
        name = config.name
        self._set_status(name, VersionStatus(version, LOADING))
        path = str(Path(config.base_path) / _folder(Path(config.base_path), version))
        log.info("loading", extra={"model": name, "version": version, "path": path})
        try:
            loaded = self._loader(name, version, path)
        except Exception as e:  # noqa: BLE001 - any broken SavedModel: record, never serve
            key = (name, version)
            self._failures[key] = self._failures.get(key, 0) + 1
            message = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e) else ''}"
            self._set_status(name, VersionStatus(version, END, "UNKNOWN", message[:500]))
            log.error("load failed", extra={"model": name, "version": version,
                                            "error": message[:500]})
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
        once at start, which the caller did; negative = never)."""
        if interval_s <= 0:
            return

        def loop() -> None:
            while not self._stop.wait(interval_s):
                try:
                    self.poll_once()
                except Exception:  # noqa: BLE001 - keep serving what is loaded
                    log.exception("poll failed")

        self._thread = threading.Thread(target=loop, name="model-poller", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)


def _numeric_versions(base: Path) -> list[int]:
    """Child folders whose names parse as int64 (``00000123`` is 123), as TF Serving reads."""
    if not base.is_dir():
        return []
    out = []
    for child in base.iterdir():
        if child.is_dir() and child.name.isdigit() and int(child.name) < 2 ** 63:
            out.append(int(child.name))
    return sorted(set(out))


def _folder(base: Path, version: int) -> str:
    for child in base.iterdir():
        if child.name.isdigit() and int(child.name) == version:
            return child.name
    return str(version)


__all__ = ["ModelRepository", "VersionStatus", "START", "LOADING", "AVAILABLE", "UNLOADING",
           "END", "ServingError"]
