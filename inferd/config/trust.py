"""`trusted_keys` (`[server]` and `[models.<name>]`): the public keys whose signatures an engine artifact
must carry before it loads (docs/artifacts.md). Entries are paths to OpenSSH `.pub` files, resolved
against the config file's directory; whether each file holds an ed25519 key is checked by
`inferd check-config` (inferd.daemon.preflight) and again when a version loads."""
from __future__ import annotations


def trust_list_errors(path: str, keys: tuple[str, ...]) -> list[str]:
    errors = []
    for i, key in enumerate(keys):
        if not key.strip():
            errors.append(f"{path}[{i}]: must be the path of a .pub file, got {key!r}")
        elif key in keys[:i]:
            errors.append(f"{path}[{i}]: {key!r} is listed twice")
    return errors
