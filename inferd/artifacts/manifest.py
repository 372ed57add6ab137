"""Engine artifacts: `engines/<name>/<version>/` directories with a manifest of every file's sha256.

- The version id is derived from the content (sha256 over the sorted (path, sha256) list), so the
  same inputs give the same version and a version directory is never modified in place.
- Publishing stages files in `engines/<name>/.tmp-*`, writes the manifest, then renames the
  directory into place (atomic on one filesystem). `engines/<name>/LATEST` holds the version id
  of the most recent build, replaced atomically.
- Verification streams every file through sha256 and names the first changed, missing or
  unexpected file.
- An `[embedding]` table marks an embedding model (pooling, normalization, Matryoshka truncation);
  those settings live only in the manifest, so publishing the same files with other settings is refused.
- `manifest.sig` beside the manifest, when present, is a detached signature over the manifest's
  bytes (inferd.artifacts.signing); it is not one of the artifact's files, so signing an artifact
  neither changes its version nor breaks its verification.

`inferd engines verify | keygen | sign` live in inferd.artifacts.engines_cli.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Literal

import msgspec

from inferd import tomllib

MANIFEST_FILE = "manifest.toml"
SIGNATURE_FILE = "manifest.sig"             # inferd.artifacts.signing
LATEST_FILE = "LATEST"
MANIFEST_FORMAT = 1
_CHUNK = 1 << 20
_VERSION_HEX = 12

Progress = Callable[[str], None]


class ArtifactError(Exception):
    """An artifact is missing, malformed or altered. `file` names the culprit when there is one."""

    def __init__(self, message: str, file: str | None = None) -> None:
        super().__init__(message)
        self.file = file


class FileEntry(msgspec.Struct, frozen=True, kw_only=True):
    sha256: str
    size: int


class Architecture(msgspec.Struct, frozen=True, kw_only=True):
    """Summary of the model's config.json, enough to size an engine without reading weights."""

    architecture: str
    model_type: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    max_position_embeddings: int
    rope_theta: float
    tie_word_embeddings: bool
    dtype: str
    num_parameters: int


class DefaultSampling(msgspec.Struct, frozen=True, kw_only=True):
    """The checkpoint's generation_config.json sampling defaults (temperature 0 = greedy)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0


class EmbeddingSpec(msgspec.Struct, frozen=True, kw_only=True):
    """How an embedding model turns its final hidden states into one vector (decoder embedders such as
    e5-mistral pool the last token, gte-style ones the mean over tokens)."""

    pooling: Literal["last", "mean"]
    normalize: bool = True                  # L2-normalize the pooled vector
    # Smallest `dimensions` a request may truncate to (Matryoshka training); None: no truncation.
    matryoshka_min_dimensions: Annotated[int, msgspec.Meta(ge=1)] | None = None


class Manifest(msgspec.Struct, frozen=True, kw_only=True):
    format: int = MANIFEST_FORMAT
    name: str
    version: str
    target: str                      # "reference" | "trtllm"
    source: str                      # "synthetic:tiny", "hf:<dir name>", "hf:<org>/<repo>" (pulled), ...
    # The hub commit (40 hex) a pulled checkpoint was downloaded at: `source` + `revision` fetch the same files
    # again. None: not from a hub (synthetic, a local checkout).
    revision: str | None = None
    architecture: Architecture
    sampling: DefaultSampling = DefaultSampling()
    embedding: EmbeddingSpec | None = None   # an embedding model (None: a generative one)
    # How its chat template writes tool calls (inferd.api.wire.tool_calls parses them back): "hermes"
    # (<tool_call> JSON, ChatML models), "llama3_json" (Llama 3.x); None: its template has no tools.
    tool_call_format: Literal["hermes", "llama3_json"] | None = None
    # Target-specific build settings (e.g. trtllm max_batch_size, tp_size); scalars only.
    build: dict[str, str | int | float | bool] = {}
    files: dict[str, FileEntry] = {}


# --- hashing and versions --------------------------------------------------------------------

def sha256_file(path: Path) -> str:
    """Stream the file: weight files are far larger than we want in memory."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def content_version(files: dict[str, FileEntry]) -> str:
    digest = hashlib.sha256()
    for rel in sorted(files):
        digest.update(f"{rel}\0{files[rel].sha256}\n".encode())
    return digest.hexdigest()[:_VERSION_HEX]


def _artifact_files(directory: Path) -> list[str]:
    """Every file of an artifact except its manifest and signature, as sorted POSIX paths relative to it."""
    found = []
    for root, dirs, names in os.walk(directory):
        dirs.sort()
        for fname in names:
            rel = (Path(root) / fname).relative_to(directory).as_posix()
            if rel not in (MANIFEST_FILE, SIGNATURE_FILE):
                found.append(rel)
    return sorted(found)


def hash_files(directory: Path, progress: Progress | None = None) -> dict[str, FileEntry]:
    entries = {}
    for rel in _artifact_files(directory):
        path = directory / rel
        if progress is not None and path.stat().st_size > 16 * _CHUNK:
            progress(f"hashing {rel} ({path.stat().st_size / 1e6:.0f} MB)")
        entries[rel] = FileEntry(sha256=sha256_file(path), size=path.stat().st_size)
    return entries


# --- manifest.toml ---------------------------------------------------------------------------

def _toml_str(value: str) -> str:
    out = ['"']
    for ch in value:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch < " " or ch == "\x7f":
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return "".join(out) + '"'


def _toml_key(key: str) -> str:
    bare = key and all(c.isascii() and (c.isalnum() or c in "_-") for c in key)
    return key if bare else _toml_str(key)


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value) if value == value and abs(value) != float("inf") else str(value)
    if isinstance(value, str):
        return _toml_str(value)
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def manifest_to_toml(manifest: Manifest) -> str:
    """Hand-written (tiny) TOML: scalars, one level of tables, inline tables for files. None (TOML has
    no null) is left out, so it reads back as the field's default."""
    data = {k: v for k, v in msgspec.to_builtins(manifest).items() if v is not None}
    lines = [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in data.items() if not isinstance(v, dict)]
    for key, table in data.items():
        if isinstance(table, dict):
            lines += ["", f"[{key}]"] + [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in table.items()
                                         if v is not None]
    return "\n".join(lines) + "\n"


def read_manifest(artifact_dir: Path) -> Manifest:
    """The manifest without checking files (see verify_artifact)."""
    path = Path(artifact_dir) / MANIFEST_FILE
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ArtifactError(f"{artifact_dir}: no {MANIFEST_FILE} (not an artifact directory)", MANIFEST_FILE) from None
    except OSError as exc:
        raise ArtifactError(f"{path}: unreadable: {exc}", MANIFEST_FILE) from exc
    return parse_manifest(data, path)


def parse_manifest(data: bytes, path: Path) -> Manifest:
    """A manifest from its bytes (a signature covers exactly these); `path` names it in errors."""
    try:
        raw = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ArtifactError(f"{path}: unreadable: {exc}", MANIFEST_FILE) from exc
    try:
        manifest = msgspec.convert(raw, Manifest)
    except msgspec.ValidationError as exc:
        raise ArtifactError(f"{path}: {exc}", MANIFEST_FILE) from exc
    if manifest.format != MANIFEST_FORMAT:
        raise ArtifactError(f"{path}: format {manifest.format} is not supported (expected {MANIFEST_FORMAT})",
                            MANIFEST_FILE)
    return manifest


# --- verification and resolution -------------------------------------------------------------

def verify_artifact(path: Path, manifest: Manifest | None = None) -> Manifest:
    """Check every file against the manifest (the one given: already read, e.g. with its signature
    checked; else the one on disk); raise ArtifactError naming the first culprit."""
    path = Path(path)
    manifest = read_manifest(path) if manifest is None else manifest
    present = set(_artifact_files(path))
    for rel in sorted(manifest.files):
        if rel not in present:
            raise ArtifactError(f"{path}: {rel} is missing", rel)
    for rel in sorted(present - manifest.files.keys()):
        raise ArtifactError(f"{path}: {rel} is not in the manifest (unexpected file)", rel)
    for rel, entry in sorted(manifest.files.items()):
        size = (path / rel).stat().st_size
        if size != entry.size:
            raise ArtifactError(f"{path}: {rel} has changed (size {size}, manifest says {entry.size})", rel)
    for rel, entry in sorted(manifest.files.items()):
        if sha256_file(path / rel) != entry.sha256:
            raise ArtifactError(f"{path}: {rel} has changed (sha256 differs from the manifest)", rel)
    if content_version(manifest.files) != manifest.version:
        raise ArtifactError(f"{path}: manifest version {manifest.version} does not match its file list",
                            MANIFEST_FILE)
    return manifest


def _check_component(kind: str, value: str) -> None:
    if not value or value.startswith(".") or "/" in value or "\\" in value or "\0" in value:
        raise ArtifactError(f"invalid artifact {kind} {value!r}: a plain directory name is required")


def _versions(name_dir: Path) -> list[str]:
    if not name_dir.is_dir():
        return []
    return sorted(p.name for p in name_dir.iterdir()
                  if p.is_dir() and not p.name.startswith(".") and (p / MANIFEST_FILE).is_file())


def resolve_artifact(engines_root: Path, name: str, version: str = "latest") -> Path:
    """`engines_root/name/version`; "latest" reads `name/LATEST` (or the only version there is)."""
    _check_component("name", name)
    name_dir = Path(engines_root) / name
    if version == "latest":
        latest = name_dir / LATEST_FILE
        if latest.is_file():
            version = latest.read_text(encoding="utf-8").strip()
        else:
            versions = _versions(name_dir)
            if len(versions) != 1:
                raise ArtifactError(f"artifact {name!r}: no {LATEST_FILE} in {name_dir} and "
                                    f"{len(versions)} versions to choose from; name a version")
            version = versions[0]
    _check_component("version", version)
    path = name_dir / version
    if not (path / MANIFEST_FILE).is_file():
        raise ArtifactError(f"artifact {name}@{version} not found under {engines_root}")
    return path


# --- publishing ------------------------------------------------------------------------------

@contextlib.contextmanager
def staging_dir(engines_root: Path, name: str) -> Iterator[Path]:
    """A scratch directory next to the final location (same filesystem, so rename is atomic)."""
    _check_component("name", name)
    name_dir = Path(engines_root) / name
    name_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=name_dir))
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _make_world_readable(directory: Path) -> None:
    # mkdtemp and some writers create 0700/0600; the daemon may run as another user.
    for root, dirs, names in os.walk(directory):
        os.chmod(root, 0o755)
        for fname in names:
            os.chmod(Path(root) / fname, 0o644)


def publish_artifact(staging: Path, engines_root: Path, *, name: str, target: str, source: str,
                     architecture: Architecture, sampling: DefaultSampling = DefaultSampling(),
                     build: dict[str, str | int | float | bool] | None = None,
                     embedding: EmbeddingSpec | None = None, progress: Progress | None = None,
                     tool_call_format: str | None = None, revision: str | None = None, latest: bool = True) -> Path:
    """Hash `staging`, write its manifest, move it to `engines_root/name/<version>`, point LATEST at it
    (unless `latest` is False: a version served only where a config pins it, such as a quantized one).

    Idempotent: if that version exists (same content), it is verified and reused, never rewritten; it
    must then have the same `embedding` settings (the version id does not cover them).
    """
    files = hash_files(staging, progress)
    version = content_version(files)
    manifest = Manifest(name=name, version=version, target=target, source=source, revision=revision,
                        architecture=architecture,
                        sampling=sampling, embedding=embedding, build=build or {}, files=files,
                        tool_call_format=tool_call_format or tool_call_format_of(staging))
    (staging / MANIFEST_FILE).write_text(manifest_to_toml(manifest), encoding="utf-8")
    _make_world_readable(staging)
    final = Path(engines_root) / name / version
    if not final.exists():
        try:
            os.rename(staging, final)
        except OSError:
            if not final.exists():  # anything but a concurrent build of the same version
                raise
    if staging.exists():
        if progress is not None:
            progress(f"{name}/{version} already exists; verifying it")
        existing = verify_artifact(final).embedding
        if existing != embedding:
            raise ArtifactError(f"{name}/{version} already exists with embedding settings {existing}; the same "
                                f"files cannot be published with {embedding} (remove that version first)",
                                MANIFEST_FILE)
    if latest or not (final.parent / LATEST_FILE).is_file():
        _write_atomically(final.parent / LATEST_FILE, version + "\n")
    return final


def tool_call_format_of(directory: Path) -> str | None:
    """The tool-call format of the chat template in `directory` (tokenizer_config.json's, or chat_template.jinja)."""
    config = Path(directory) / "tokenizer_config.json"
    try:
        raw = json.loads(config.read_text(encoding="utf-8")).get("chat_template") if config.is_file() else None
        jinja = Path(directory) / "chat_template.jinja"
        template = raw if isinstance(raw, str) else json.dumps(raw) if raw else (
            jinja.read_text(encoding="utf-8") if jinja.is_file() else "")
    except (OSError, ValueError, AttributeError):
        return None
    return template_tool_call_format(template)


def template_tool_call_format(template: str | None) -> str | None:
    """The tool-call format a chat template writes, judged from its own markers: `<tool_call>` is Hermes'
    (Qwen2.5, the synthetic ChatML models); Llama 3.x's headers (or its `<|python_tag|>`) with `tools` is
    its JSON format. None: no template, or one without tools."""
    template = template or ""
    if "<tool_call>" in template:
        return "hermes"
    if "tools" in template and ("<|python_tag|>" in template or "<|start_header_id|>" in template):
        return "llama3_json"
    return None
