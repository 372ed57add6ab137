"""`inferd keys create|list|revoke`: manage the keys file a config's [auth] table names.

The config is read and checked as the daemon reads it (a missing or invalid file is an error, never
an empty key table), so paths in [auth] are relative to the config file's directory, as for the
daemon. The key itself is printed once, on create; only its hash is stored (inferd.tenancy.keys). Writes replace the file
atomically, and a running daemon polls it (inferd.tenancy.key_reload): no SIGHUP needed.
"""
from __future__ import annotations

import os
import secrets
import sys
import time
from pathlib import Path

from inferd.config import AuthConfig, ConfigError, load_config
from inferd.tenancy.keys import KeyFileError, create_key, hasher_for, load_records, revoke_key


def _auth_from_config(config_path: Path) -> AuthConfig:
    """The config's [auth] table with its paths resolved, or KeyFileError saying what is wrong."""
    if not config_path.is_file():
        raise KeyFileError(f"{config_path}: no such config file (pass --config)")
    try:
        config = load_config(config_path)
    except ConfigError as exc:
        raise KeyFileError(str(exc)) from None
    auth, state_dir = config.auth, Path(config.server.state_dir)
    if Path(auth.keys_file).parent == state_dir:
        state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)    # the default place: made on first use
    elif not Path(auth.keys_file).parent.is_dir():                  # a path someone wrote: a typo, not a mkdir
        raise KeyFileError(f"auth.keys_file: the directory of {auth.keys_file} does not exist")
    return auth


def _ensure_secret(path: Path) -> None:
    """`keys create` makes the server secret on first use, so the HMAC setup is one config line."""
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32) + "\n")


def keys_main(args) -> int:
    config_path = Path(args.config)
    base_dir = config_path.resolve().parent      # [auth] paths are already absolute; this is for hasher_for
    out = sys.stdout
    try:
        auth = _auth_from_config(config_path)
        keys_file = Path(auth.keys_file)
        if args.keys_command == "create":
            if auth.secret_file:
                _ensure_secret(Path(auth.secret_file))
            record, key = create_key(keys_file, hasher_for(auth, base_dir), args.tenant, args.scope or ("inference",))
            print(key, file=out)
            print(f"key id {record.key_id} for tenant {record.tenant!r} (scopes: {', '.join(record.scopes)}) "
                  f"stored in {keys_file}; the key is shown only now", file=sys.stderr)
            if auth.mode != "api_key":
                print('note: auth.mode is "none" in this config; keys are checked only with mode = "api_key"',
                      file=sys.stderr)
            return 0
        if args.keys_command == "list":
            print(f"{'KEY_ID':<14}{'TENANT':<20}{'SCOPES':<28}{'CREATED':<22}STATUS", file=out)
            for r in load_records(keys_file):
                created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(r.created_at))
                status = "active" if r.revoked_at is None else "revoked"
                print(f"{r.key_id:<14}{r.tenant:<20}{','.join(r.scopes):<28}{created:<22}{status}", file=out)
            return 0
        if args.keys_command == "revoke":
            try:
                revoke_key(keys_file, args.key_id)
            except KeyError:
                print(f"error: no key with id {args.key_id!r} in {keys_file}", file=sys.stderr)
                return 1
            print(f"revoked {args.key_id} (a running server refuses it within about a second)", file=out)
            return 0
    except (KeyFileError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 2
