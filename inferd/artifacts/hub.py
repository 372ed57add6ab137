"""Pulling a Hugging Face checkpoint into an artifact: `inferd pull`, `build_engines.py --hf-model`, `serve --model`.

The download is huggingface_hub's own `snapshot_download`, so everything its users know holds here: the
cache ($HF_HOME, $HF_HUB_CACHE), $HF_TOKEN for private and gated repos, $HF_ENDPOINT for a mirror, its
progress bars on a terminal, and a rerun after an interruption that keeps every file already complete
(a file cut off midway is fetched again from its start: huggingface_hub 2.4 writes each download to a
temporary file of its own process). A branch or tag is resolved to the commit it points at, and that
commit is what the manifest records (`revision`), so the artifact says exactly which files it holds.

Only the files the reference engine reads are fetched (PULL_PATTERNS): not .bin/.pth/.onnx/.gguf copies.
Not a terminal (a service, CI, a pipe): no bars, a `pull_progress` log line per file instead.
huggingface_hub is imported when a pull runs, never by `inferd engines verify` or the daemon's start.
"""
from __future__ import annotations

import logging
import os
import re
import sys
from pathlib import Path
from typing import Any

from inferd.artifacts.manifest import ArtifactError, Progress

# inferd.observability's event lines (an event + its fields), through the stdlib logger it wraps: importing it
# here would close an import cycle (observability -> engine -> artifacts)
_log = logging.getLogger("inferd.pull")


def _event(name: str, **fields: Any) -> None:
    _log.info(name, extra={"fields": fields})

PULL_PATTERNS = ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                 "special_tokens_map.json", "chat_template.jinja", "*.safetensors", "model.safetensors.index.json"]
# `org/name` as the hub spells repo ids (the hub's own rule is looser about length only)
HUB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
# A served model and artifact name: what inferd.config's MODEL_NAME_RE accepts (artifacts sits below config)
_NAME_BAD = re.compile(r"[^A-Za-z0-9._-]")


class HubError(Exception):
    """A pull failed for a reason the user can act on (unknown repo, gated, unreachable hub); one line."""


def looks_like_hub_id(text: str) -> bool:
    return bool(HUB_ID_RE.match(text)) and not Path(text).exists()


def artifact_name_for(source: str) -> str:
    """The artifact (and default served model) name of a hub id or a directory: its last part, made plain."""
    tail = source.rstrip("/").rsplit("/", 1)[-1]
    name = _NAME_BAD.sub("-", tail).lstrip("._-")[:64]
    if not name:
        raise ArtifactError(f"cannot derive an artifact name from {source!r}; give one with --name")
    return name


def hub_endpoint() -> str:
    """The hub asked: $HF_ENDPOINT read now (huggingface_hub reads it once, at its import)."""
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def download(repo_id: str, *, revision: str | None = None, cache_dir: Path | None = None,
             token: str | None = None, patterns: list[str] = PULL_PATTERNS) -> tuple[Path, str]:
    """The checkpoint's files (those matching `patterns`) in the hub cache: (snapshot directory, commit sha).
    Raises HubError."""
    from huggingface_hub import snapshot_download

    logging.getLogger("httpx2").setLevel(logging.WARNING)    # not a log line per HTTP request of the pull
    _remove_dead_partials(cache_dir, repo_id)
    try:
        folder = snapshot_download(repo_id, revision=revision, cache_dir=cache_dir, token=token,
                                   endpoint=hub_endpoint(), allow_patterns=patterns,
                                   tqdm_class=None if sys.stderr.isatty() else _logging_tqdm(repo_id))
    except Exception as exc:   # huggingface_hub's errors: each a sentence for the user, no traceback
        raise _hub_error(repo_id, revision, exc) from exc
    commit = Path(folder).name
    if not _COMMIT_RE.match(commit):      # snapshot folders are named by commit; a local_dir would not be
        raise HubError(f"{repo_id}: huggingface_hub returned {folder}, not a snapshot named by its commit")
    return Path(folder), commit


def _remove_dead_partials(cache_dir: Path | None, repo_id: str) -> None:
    """Delete the partial files a killed pull left in the cache (huggingface_hub does not reuse them, and a
    weight file's worth each is a lot of disk). One is dead when its download lock is free: a live
    download (another pull of the same repo) holds it, and a killed one's lock went with its process."""
    from filelock import FileLock, Timeout
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    folder = repo_folder_name(repo_id=repo_id, repo_type="model")
    root = Path(cache_dir or constants.HF_HUB_CACHE)
    for partial in (root / folder / "blobs").glob("*.incomplete"):
        etag = partial.name.split(".", 1)[0]
        try:
            with FileLock(root / ".locks" / folder / f"{etag}.lock", timeout=0):
                partial.unlink(missing_ok=True)
        except (Timeout, OSError):
            continue


def pull(source: str, engines_root: Path, *, name: str | None = None, revision: str | None = None,
         cache_dir: Path | None = None, progress: Progress | None = None) -> Path:
    """Download (a hub id) or take (a local directory) an HF checkpoint and pack it into
    `engines_root/<name>/<version>`; returns that artifact's directory. Raises HubError or ArtifactError."""
    from inferd.artifacts.build.reference import pack_hf

    local = Path(source).expanduser()
    if local.is_dir():
        return pack_hf(local, name or artifact_name_for(str(local.resolve())), engines_root, progress,
                       source=f"local:{local.resolve()}")
    if not HUB_ID_RE.match(source):
        raise HubError(f"{source!r} is neither a directory nor a Hugging Face model id such as "
                       "HuggingFaceTB/SmolLM2-135M-Instruct")
    # config.json first: a model the engine cannot run is refused before gigabytes of weights are fetched
    folder, commit = download(source, revision=revision, cache_dir=cache_dir, patterns=["config.json"])
    _check_architecture(folder / "config.json")
    folder, commit = download(source, revision=commit, cache_dir=cache_dir)      # that same commit
    _event("pulled", repo=source, revision=revision or "main", commit=commit, path=str(folder))
    return pack_hf(folder, name or artifact_name_for(source), engines_root, progress,
                   source=f"hf:{source}", revision=commit)


def _check_architecture(config_path: Path) -> None:
    from inferd.artifacts.build.reference import SUPPORTED_ARCHITECTURES, read_json_object

    architectures = read_json_object(config_path).get("architectures") if config_path.is_file() else None
    if not architectures or architectures[0] not in SUPPORTED_ARCHITECTURES:
        raise ArtifactError(f"config.json: architectures = {architectures!r}; the reference engine runs only "
                            f"{', '.join(SUPPORTED_ARCHITECTURES)}", "config.json")


def _hub_error(repo_id: str, revision: str | None, exc: Exception) -> HubError:
    from huggingface_hub import errors

    where = hub_endpoint()
    if isinstance(exc, errors.GatedRepoError):
        return HubError(f"{repo_id} is gated on {where}: accept its terms there, then set HF_TOKEN to a token "
                        "of that account")
    if isinstance(exc, errors.RevisionNotFoundError):
        return HubError(f"{repo_id} has no revision {revision!r} on {where}")
    if isinstance(exc, errors.RepositoryNotFoundError):
        return HubError(f"{repo_id}: no such model on {where} (a private one needs HF_TOKEN set to a token "
                        "that can read it)")
    if isinstance(exc, errors.HfHubHTTPError):
        status = exc.response.status_code if exc.response is not None else "?"
        return HubError(f"{repo_id}: the hub at {where} answered HTTP {status}: {str(exc).splitlines()[0]}")
    if isinstance(exc, (errors.LocalEntryNotFoundError, errors.OfflineModeIsEnabled, OSError)):
        return HubError(f"{repo_id}: cannot download from {where} and no complete copy is cached: "
                        f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")
    return HubError(f"{repo_id}: download failed: {type(exc).__name__}: {exc}")


class _Sink:
    """Where the log-only bars draw: nowhere (their numbers go to the log)."""

    def write(self, _text: str) -> None:
        pass

    def flush(self) -> None:
        pass


def _logging_tqdm(repo_id: str) -> type:
    """A tqdm class for snapshot_download off a terminal: the per-file bar logs `pull_progress` per file done,
    with the bytes the byte bar has counted so far."""
    from huggingface_hub.utils import tqdm as hf_tqdm

    counted = {"bytes": 0}

    class LoggingTqdm(hf_tqdm):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.update(disable=False, file=_Sink())       # huggingface_hub disables bars off a terminal
            super().__init__(*args, **kwargs)

        def update(self, n: float | None = 1) -> bool | None:
            shown = super().update(n)
            if self.unit == "B":
                counted["bytes"] = max(counted["bytes"], int(self.n))
            elif self.total:
                _event("pull_progress", repo=repo_id, files_done=int(self.n), files_total=int(self.total),
                         bytes_done=counted["bytes"])
            return shown

    return LoggingTqdm
