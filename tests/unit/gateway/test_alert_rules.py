"""The shipped Prometheus rules (deploy/prometheus/air-rules.yml) are well formed and
every metric their expressions name is one the gateway's /metrics exposes.

promtool is not installed here (nor on CI): the YAML is checked by shape and by the
metric names; `test_promtool_accepts_the_rules` runs `promtool check rules` where it is.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from air_sdk.scheduler import SchedulerPolicy
from air_sdk.scheduler.slo import SloSpec

RULES = Path(__file__).resolve().parents[3] / "deploy" / "prometheus" / "air-rules.yml"
#: a metric name in PromQL: our prefix, outside label matchers and strings
METRIC = re.compile(r"\bair_[a-z_]+\b")
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
}


def exposed_names(tenancy) -> set[str]:
    """Every series name /metrics can show, from the families it declares (a labelled
    family with no observation yet still declares its HELP and TYPE)."""
    ctx = tenancy.app.state.air
    spec = SloSpec(name="wait", kind="queue_wait", target=60, objective=0.9)
    ctx.runner.slo_watch.policy = SchedulerPolicy(slos={"acme": (spec,)})
    text = tenancy.client("metrics").get("/metrics").text
    names = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        names.update(family.name + s for s in SUFFIXES.get(family.type, ()))
        names.update(s.name for s in family.samples)
    return names


def rules() -> list[dict]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def test_every_rule_is_well_formed():
    doc = yaml.safe_load(RULES.read_text())
    assert {g["name"] for g in doc["groups"]} == {"air-slo", "air-platform"}
    for rule in rules():
        assert ("alert" in rule) != ("record" in rule), rule
        assert isinstance(rule["expr"], str) and rule["expr"].strip(), rule
        if "alert" in rule:
            assert rule["labels"]["severity"] in {"info", "warning", "critical"}, rule
            assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule
            assert re.fullmatch(r"\d+[smh]", rule.get("for", "0s")), rule
        else:
            assert re.fullmatch(r"[a-z_]+(:[a-z0-9_]+)+", rule["record"]), rule


def test_every_metric_a_rule_names_is_exposed(tenancy):
    exposed = exposed_names(tenancy)
    named = {m for rule in rules() for m in METRIC.findall(rule["expr"])}
    assert named, "the rules name no metric"
    assert not named - exposed, f"rules name metrics /metrics lacks: {sorted(named - exposed)}"
    assert {"air_slo_burning", "air_slo_budget_left_ratio"} <= named  # the SLO alerts


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed here")
def test_promtool_accepts_the_rules():
    subprocess.run(["promtool", "check", "rules", str(RULES)], check=True)
