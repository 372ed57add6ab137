"""The shipped rules, checked by Prometheus's own promtool: syntax, and alerts on synthetic series."""
import shutil
import subprocess

import pytest

from inferd.config import SloConfig
from inferd.slo.rules import ALERT_NAMES, budget_share, render_rules, rules_document

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (Debian: apt-get install "
                                    "prometheus; .ci/run installs it)")
FAST = SloConfig(model="small", sli="availability", objective=0.999)
SLOW = SloConfig(model="small", sli="ttft", objective=0.999, threshold_ms=500)


def test_the_factors_are_the_workbooks_whatever_the_window():
    week = SloConfig(model="m", sli="availability", objective=0.99, window_days=7)
    doc = rules_document({"week": week})
    assert [(r["labels"]["long_window"], r["expr"].split("> (")[1].split(")")[0]) for r in doc["groups"][0]["rules"]
            if "alert" in r] == [("1h", "14.4 * 0.01"), ("6h", "6 * 0.01"), ("1d", "3 * 0.01"), ("3d", "1 * 0.01")]
    assert budget_share(FAST, "1h", 14.4) == pytest.approx(0.02)      # 2% of a 30-day budget
    assert budget_share(week, "1h", 14.4) == pytest.approx(14.4 / 168)


def test_an_alert_that_could_never_fire_is_left_out_and_said_so():
    loose = SloConfig(model="m", sli="availability", objective=0.9)       # 14.4 x 10% is more than all requests
    text = render_rules({"loose": loose})
    severities = [r["labels"]["long_window"] for r in rules_document({"loose": loose})["groups"][0]["rules"]
                  if "alert" in r]
    assert severities == ["6h", "1d", "3d"]
    assert "# loose: no page over 1h/5m" in text


def test_every_slo_gets_its_ratios_and_both_severities():
    groups = rules_document({"fast": FAST, "slow": SLOW})["groups"]
    assert [g["name"] for g in groups] == ["inferd-slo-fast", "inferd-slo-slow"]
    rules = groups[0]["rules"]
    assert [r["record"] for r in rules if "record" in r] == [
        f"inferd:slo_error_ratio:rate{w}" for w in ("5m", "30m", "1h", "2h", "6h", "1d", "3d")]
    assert sorted({r["labels"]["severity"] for r in rules if "alert" in r}) == ["page", "ticket"]


@needs_promtool
def test_promtool_accepts_the_rules(tmp_path):
    path = tmp_path / "rules.yml"
    path.write_text(render_rules({"fast": FAST, "slow": SLOW}))
    result = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 22 rules found" in result.stdout


def _alert(doc, slo, severity, long_window):
    for group in doc["groups"]:
        for rule in group["rules"]:
            labels = rule.get("labels", {})
            if "alert" in rule and labels["slo"] == slo and labels["long_window"] == long_window:
                assert labels["severity"] == severity
                return {"exp_labels": labels, "exp_annotations": rule["annotations"]}
    raise AssertionError(f"no {severity} alert of {slo} over {long_window}")


def _series(slo, sli, result, values):
    return {"series": f'inferd_slo_events_total{{slo="{slo}",model="small",sli="{sli}",result="{result}"}}',
            "values": values}


@needs_promtool
def test_promtool_pages_on_a_fast_burn_tickets_a_slow_one_and_stops_when_it_ends(tmp_path):
    slos = {"fast": FAST, "slow": SLOW}
    doc = rules_document(slos)
    (tmp_path / "rules.yml").write_text(render_rules(slos))
    page = _alert(doc, "fast", "page", "1h")
    slow_ticket = _alert(doc, "slow", "ticket", "3d")
    tests = {
        "rule_files": ["rules.yml"], "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": [
                # fast: 7 clean hours, then an hour of ~9% errors (a 91x burn), then clean again
                _series("fast", "availability", "good", "0+100x600"),
                _series("fast", "availability", "bad", "0+0x420 10+10x59 600+0x100"),
                # slow: 0.2% slow first tokens all along (a 2x burn): a ticket, never a page
                _series("slow", "ttft", "good", "0+998x600"),
                _series("slow", "ttft", "bad", "0+2x600"),
            ],
            "alert_rule_test": [
                # 5 minutes in: the 1h window is not there yet
                {"eval_time": "426m", "alertname": ALERT_NAMES["page"], "exp_alerts": []},
                {"eval_time": "436m", "alertname": ALERT_NAMES["page"], "exp_alerts": [page]},
                {"eval_time": "491m", "alertname": ALERT_NAMES["page"], "exp_alerts": []},   # 5m window clean again
                {"eval_time": "300m", "alertname": ALERT_NAMES["ticket"], "exp_alerts": [slow_ticket]},
            ],
        }],
    }
    import json
    (tmp_path / "tests.yml").write_text(json.dumps(tests))    # JSON is YAML
    result = subprocess.run([PROMTOOL, "test", "rules", "tests.yml"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
