"""inferd.config.default_state_dir: where `serve --model`, `pull` (and keys) keep state with no config file."""
from __future__ import annotations

from pathlib import Path

from inferd.config import default_state_dir


def test_inferd_state_dir_wins(monkeypatch, tmp_path):
    monkeypatch.setenv("INFERD_STATE_DIR", str(tmp_path / "mine"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert default_state_dir() == tmp_path / "mine"


def test_then_xdg_state_home(monkeypatch, tmp_path):
    monkeypatch.delenv("INFERD_STATE_DIR", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert default_state_dir() == tmp_path / "xdg" / "inferd"


def test_else_the_xdg_default_under_home_and_a_relative_xdg_state_home_is_ignored(monkeypatch, tmp_path):
    monkeypatch.delenv("INFERD_STATE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_STATE_HOME", "relative/state")       # the spec: invalid, ignored
    assert default_state_dir() == Path(tmp_path) / ".local" / "state" / "inferd"
    monkeypatch.delenv("XDG_STATE_HOME")
    assert default_state_dir() == Path(tmp_path) / ".local" / "state" / "inferd"
