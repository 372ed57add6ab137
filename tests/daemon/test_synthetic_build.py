from __future__ import annotations

import logging

import pytest

from inferd.daemon.sdnotify import Notifier
from inferd.daemon.synthetic_build import build_synthetic_artifact


def logged(caplog, event: str) -> list[dict]:
    return [getattr(r, "fields", {}) for r in caplog.records if r.getMessage() == event]


async def test_builds_the_artifact_off_the_loop_and_logs_start_and_end(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="inferd.daemon")
    path = await build_synthetic_artifact(tmp_path / "engines", "tiny", "tiny", Notifier({}))
    assert path.parent == tmp_path / "engines" / "tiny" and (path / "manifest.toml").is_file()
    assert logged(caplog, "building_engine")[0]["model"] == "tiny"
    assert logged(caplog, "engine_built")[0]["path"] == str(path)


async def test_a_failing_build_raises_its_error_on_the_loop(tmp_path):
    with pytest.raises(ValueError, match="no-such-kind"):
        await build_synthetic_artifact(tmp_path / "engines", "m", "no-such-kind", Notifier({}))
