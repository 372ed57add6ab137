"""`inferd monitoring rules|dashboard` on the shipped config: real output, and promtool accepts it."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def monitoring(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "inferd", "monitoring", *args], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (Debian: apt-get install "
                    "prometheus; .ci/run installs it)")
def test_rules_for_the_shipped_config_pass_promtool(tmp_path):
    out = monitoring("rules", "--config", "config.toml")
    assert out.returncode == 0, out.stderr
    assert "inferd-slo-small-availability" in out.stdout and "InferdSloBurnRatePage" in out.stdout
    (tmp_path / "rules.yml").write_text(out.stdout)
    check = subprocess.run(["promtool", "check", "rules", str(tmp_path / "rules.yml")], capture_output=True,
                           text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr


def test_dashboard_for_the_shipped_config_is_json_with_its_slos():
    out = monitoring("dashboard", "--config", "config.toml")
    assert out.returncode == 0, out.stderr
    titles = [p["title"] for p in json.loads(out.stdout)["panels"]]
    assert "SLO small-ttft: burn rate" in titles


def test_a_bad_config_is_reported_not_rendered(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[slos.x]\nmodel = "nope"\nsli = "ttft"\nobjective = 0.99\n')
    out = monitoring("rules", "--config", str(bad))
    assert out.returncode == 1 and out.stdout == ""
    assert "slos.x.model: no model or alias named 'nope'" in out.stderr
    assert "slos.x.threshold_ms: required" in out.stderr
