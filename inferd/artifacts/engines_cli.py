"""`inferd engines verify | keygen | sign`: check artifacts and name their signers, make a signing key
pair, sign existing artifacts. Every problem is one line naming it, never a traceback."""
from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from inferd.artifacts.manifest import LATEST_FILE, MANIFEST_FILE, ArtifactError
from inferd.artifacts.signing import (
    SigningKeyError,
    generate_key_pair,
    load_private_key,
    load_trusted_keys,
    sign_artifact,
    verify_signed_artifact,
)


def _find_artifacts(root: Path) -> Iterator[Path]:
    for dirpath, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        if MANIFEST_FILE in names:
            dirs.clear()  # an artifact's subdirectories are its files, not more artifacts
            yield Path(dirpath)


def _artifacts(root: Path) -> list[Path]:
    return [root] if (root / MANIFEST_FILE).is_file() else list(_find_artifacts(root))


def _dangling_latest(root: Path) -> Iterator[str]:
    for latest in sorted(root.rglob(LATEST_FILE)):
        try:
            version = latest.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            yield f"{latest}: unreadable: {exc}"
            continue
        if not version or "/" in version or not (latest.parent / version / MANIFEST_FILE).is_file():
            yield f"{latest} points at {version!r}, which does not exist"


# --- inferd engines verify [PATH] [--trusted-key PUB ...] ---------------------------------------

def verify_main(path: str | Path, trusted_keys: Sequence[str] = ()) -> int:
    """Verify one artifact or every artifact under a tree, naming each one's signer. With
    `trusted_keys` (.pub files) an unsigned artifact or an unknown signer fails too.
    0 = all good, 1 = failures, 2 = no such path or a trusted key that does not load."""
    root = Path(path)
    if not root.exists():
        print(f"inferd engines verify: {root}: no such file or directory", file=sys.stderr)
        return 2
    try:
        trusted = load_trusted_keys(trusted_keys)
    except SigningKeyError as exc:
        print(f"inferd engines verify: --trusted-key {exc}", file=sys.stderr)
        return 2
    try:
        return _verify_tree(root, trusted)
    except OSError as exc:              # e.g. a directory we may not read
        print(f"FAIL  {exc}")
        return 1


def _verify_tree(root: Path, trusted: dict[str, str]) -> int:
    artifacts = _artifacts(root)
    if not artifacts:
        print(f"FAIL  {root}: no artifacts found (no {MANIFEST_FILE} anywhere below it)")
        return 1
    failures = 0
    for artifact in artifacts:
        try:
            manifest, signer = verify_signed_artifact(artifact, trusted)
        except (ArtifactError, OSError) as exc:
            failures += 1
            print(f"FAIL  {exc}")
            continue
        size = sum(entry.size for entry in manifest.files.values())
        signed = f"signed by {signer}" if signer is not None else "unsigned"
        print(f"ok    {manifest.name}/{manifest.version}  {manifest.target}  {len(manifest.files)} files  "
              f"{size / 1e6:.1f} MB  {signed}  {artifact}")
    if root not in artifacts:
        for problem in _dangling_latest(root):
            failures += 1
            print(f"FAIL  {problem}")
    return 1 if failures else 0


# --- inferd engines keygen [--out-dir DIR] [--name NAME] ----------------------------------------

def keygen_main(out_dir: str | Path = ".", name: str = "inferd-signing") -> int:
    """Write `<name>.key` and `<name>.pub` into `out_dir` and print their paths, private first, one a line.
    1 when either exists already (never overwritten) or cannot be written."""
    if not name or "/" in name or name.startswith("."):
        print(f"inferd engines keygen: --name {name!r}: a plain file name is required", file=sys.stderr)
        return 2
    try:
        private_path, public_path = generate_key_pair(out_dir, name)
    except SigningKeyError as exc:
        print(f"inferd engines keygen: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"inferd engines keygen: {exc}", file=sys.stderr)
        return 1
    print(private_path)
    print(public_path)
    print(f"the private key signs (build_engines.py --sign {private_path}); keep it secret. List the public key "
          f"in trusted_keys.", file=sys.stderr)
    return 0


# --- inferd engines sign PATH --key FILE ---------------------------------------------------------

def sign_main(path: str | Path, key_path: str | Path) -> int:
    """Sign one artifact, or every artifact under a tree, after checking its files against its
    manifest (a tampered artifact is refused, not signed). 0 = all signed, 1 = failures, 2 = bad key/path."""
    root = Path(path)
    if not root.exists():
        print(f"inferd engines sign: {root}: no such file or directory", file=sys.stderr)
        return 2
    try:
        key = load_private_key(key_path)
    except SigningKeyError as exc:
        print(f"inferd engines sign: {exc}", file=sys.stderr)
        return 2
    artifacts = _artifacts(root)
    if not artifacts:
        print(f"FAIL  {root}: no artifacts found (no {MANIFEST_FILE} anywhere below it)")
        return 1
    failures = 0
    for artifact in artifacts:
        try:
            signer = sign_artifact(artifact, key)
        except (ArtifactError, OSError) as exc:
            failures += 1
            print(f"FAIL  {exc}")
            continue
        print(f"signed  {artifact}  by {signer}")
    return 1 if failures else 0
