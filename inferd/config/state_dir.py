"""Where inferd keeps runtime state when no config file names a place: one rule for every caller.

$INFERD_STATE_DIR, else $XDG_STATE_HOME/inferd, else ~/.local/state/inferd (the XDG base-directory
spec's default for state). `inferd serve --model` and `inferd pull` keep their engines there, so a model
pulled once is found again by the next `serve --model`; keys and signing keys default there too.
"""
from __future__ import annotations

import os
from pathlib import Path


def default_state_dir() -> Path:
    """The state directory by the rule above (not created here)."""
    explicit = os.environ.get("INFERD_STATE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_STATE_HOME")
    # The spec: a relative XDG_STATE_HOME is invalid and must be ignored
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".local" / "state"
    return base / "inferd"
