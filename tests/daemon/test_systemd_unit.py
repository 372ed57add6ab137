"""The shipped unit file must verify cleanly and stay hardened (exposure <= 2.5)."""
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

UNIT = Path(__file__).resolve().parents[2] / "systemd" / "inferd.service"

pytestmark = pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")


def installed_copy(tmp_path: Path) -> Path:
    """The unit as installed: ExecStart points at an inferd that exists on this machine."""
    text = UNIT.read_text().replace("/opt/inferd/.venv/bin/inferd", str(Path(sys.executable).parent / "inferd"))
    path = tmp_path / "inferd.service"
    path.write_text(text)
    return path


def test_unit_is_type_notify_with_watchdog_and_reload():
    text = UNIT.read_text()
    assert re.search(r"^Type=notify$", text, re.M)
    assert re.search(r"^WatchdogSec=\d+", text, re.M)
    assert re.search(r"^ExecReload=/bin/kill -HUP \$MAINPID$", text, re.M)


def test_systemd_analyze_verify_is_clean(tmp_path):
    result = subprocess.run(["systemd-analyze", "verify", str(installed_copy(tmp_path))],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == "", result.stderr


def test_security_exposure_is_at_most_2_5(tmp_path):
    result = subprocess.run(["systemd-analyze", "security", "--offline=yes", str(installed_copy(tmp_path))],
                            capture_output=True, text=True, timeout=60)
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", result.stdout)
    assert match, result.stdout + result.stderr
    assert float(match.group(1)) <= 2.5
