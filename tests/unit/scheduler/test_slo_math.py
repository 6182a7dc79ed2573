"""SLO arithmetic on synthetic histories: the rolling window, the percentile, the error
budget left, the burn rate, who burned it, and the cluster file's SLO syntax."""

from __future__ import annotations

import pytest

from air_sdk.scheduler import parse_cluster_config
from air_sdk.scheduler.slo import (
    SloSpec,
    evaluate,
    goodput_sample,
    latency_sample,
    percentile,
    queue_risk_text,
)

HOUR = 3600.0
WAIT = SloSpec(name="wait", kind="queue_wait", target=600, objective=0.95, window_s=24 * HOUR)


def waits(seconds: list[float], *, start: float = 0.0, every: float = 60.0) -> list:
    return [
        latency_sample(f"job-{i}", ts=start + i * every, seconds=s, target=600)
        for i, s in enumerate(seconds)
    ]


def test_nearest_rank_percentile():
    values = list(range(1, 101))  # 1..100
    assert percentile(values, 0.95) == 95
    assert percentile(values, 0.99) == 99
    assert percentile(values, 1.0) == 100
    assert percentile([7.0], 0.5) == 7.0
    assert percentile([], 0.95) is None


def test_a_window_within_the_objective_keeps_budget_and_reports_the_percentile():
    history = waits([30.0] * 97 + [900.0] * 3)  # 3% over the target; 5% allowed
    budget = evaluate(WAIT, history, now=100 * 60)
    assert budget.num_samples == 100
    assert budget.value == 30.0  # the 95th of 100 sorted is a fast one: p95 meets the target
    assert budget.bad_fraction == pytest.approx(0.03)
    assert budget.burn_rate == pytest.approx(0.6)
    assert budget.budget_left == pytest.approx(0.4)
    assert budget.burning  # 60% spent is past the default alert at 50%
    assert [j for j, _ in budget.burners] == ["job-97", "job-98", "job-99"]


def test_overspent_budget_is_negative_and_burn_rate_above_one():
    history = waits([30.0] * 80 + [900.0] * 20)  # 20% bad, 5% allowed
    budget = evaluate(WAIT, history, now=100 * 60)
    assert budget.burn_rate == pytest.approx(4.0)
    assert budget.budget_left == pytest.approx(-3.0)
    assert len(budget.burners) == 10  # the list is capped


def test_the_rolling_window_forgets_old_burns():
    old_bad = waits([900.0] * 10, start=0.0)
    new_good = waits([30.0] * 10, start=30 * HOUR)
    at_day_one = evaluate(WAIT, old_bad, now=HOUR)
    assert at_day_one.budget_left < 0
    later = evaluate(WAIT, old_bad + new_good, now=31 * HOUR)  # the bad ones left the window
    assert later.num_samples == 10
    assert later.budget_left == 1.0 and later.burn_rate == 0.0 and not later.burning
    assert later.value == 30.0


def test_samples_from_after_now_are_not_counted():
    assert evaluate(WAIT, waits([900.0], start=100.0), now=50.0).num_samples == 0


def test_an_empty_window_has_its_whole_budget():
    budget = evaluate(WAIT, [], now=0.0)
    assert budget.value is None and budget.budget_left == 1.0 and not budget.burning


def test_goodput_is_weighted_by_wall_time():
    spec = SloSpec(name="goodput", kind="goodput", target=0.9, objective=0.9)
    history = [
        goodput_sample("long-good", ts=10, wall_s=9000, productive_s=8900),  # lost 100
        goodput_sample("short-bad", ts=20, wall_s=1000, productive_s=100),  # lost 900
    ]
    budget = evaluate(spec, history, now=30)
    assert budget.value == pytest.approx(0.9)  # 9000 of 10000 s productive
    assert budget.burn_rate == pytest.approx(1.0)
    assert budget.budget_left == pytest.approx(0.0)
    assert budget.burners == [("short-bad", 900.0), ("long-good", 100.0)]


def test_a_job_with_more_productive_than_wall_time_is_not_a_negative_burn():
    sample = goodput_sample("j", ts=0, wall_s=10, productive_s=12)
    assert sample.bad == 0.0 and sample.value == 1.0


def test_the_alert_threshold_is_the_burned_fraction():
    spec = SloSpec(name="w", kind="queue_wait", target=600, objective=0.9, alert_burned=0.8)
    history = waits([30.0] * 93 + [900.0] * 7)  # 70% of the budget spent
    assert not evaluate(spec, history, now=100 * 60).burning
    history = waits([30.0] * 92 + [900.0] * 8)  # 80%
    assert evaluate(spec, history, now=100 * 60).burning


def test_queue_risk_words_name_the_slo_and_the_budget_left():
    healthy = evaluate(WAIT, waits([30.0] * 10), now=600)
    assert queue_risk_text(WAIT, healthy, tenant="acme", waited_s=100) is None
    text = queue_risk_text(WAIT, healthy, tenant="acme", waited_s=420)
    assert text is not None
    assert "tenant acme's SLO 'wait' (p95 queue wait under 10 min) is at risk" in text
    assert "this job has waited 7.0 min; 100% of its error budget left" in text
    burning = evaluate(WAIT, waits([900.0] * 10), now=600)
    assert "0% of its error budget left" in (
        queue_risk_text(WAIT, burning, tenant="acme", waited_s=1) or ""
    )


def test_cluster_file_slos_per_tenant_and_default():
    cfg = parse_cluster_config(
        """
        [tenants.acme]
        gpus = 8
          [[tenants.acme.slos]]
          kind = "queue_wait"
          percentile = 99
          under_s = 300
          priority = "high"
          window_h = 6
          [[tenants.acme.slos]]
          kind = "goodput"
          at_least = 0.85
          alert_burned = 0.75
        [tenants."*"]
          [[tenants."*".slos]]
          name = "detect"
          kind = "time_to_detect"
          under_s = 60
        """
    )
    wait, goodput = cfg.policy.slos_of("acme")
    assert (wait.kind, wait.target, wait.objective, wait.priority) == (
        "queue_wait",
        300,
        0.99,
        "high",
    )
    assert (
        wait.window_s == 6 * HOUR
        and wait.describe() == "p99 queue wait under 5 min (priority high)"
    )
    assert (goodput.target, goodput.objective, goodput.alert_burned) == (0.85, 0.85, 0.75)
    (detect,) = cfg.policy.slos_of("globex")
    assert detect.name == "detect" and detect.objective == 0.95
    assert detect.describe() == "p95 time to detect a failure under 60 s"


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ('kind = "goodput"', "a goodput SLO needs at_least"),
        ('kind = "queue_wait"', "a queue_wait SLO needs under_s"),
        ('kind = "goodput"\nat_least = 0.9\nunder_s = 5', "takes at_least only"),
        (
            'kind = "time_to_detect"\nunder_s = 5\npriority = "high"',
            "priority applies to queue_wait",
        ),
        ('kind = "queue_wait"\nunder_s = 5\npercentile = 100', "percentile"),
        ('kind = "latency"\nunder_s = 5', "kind"),
    ],
)
def test_bad_slo_entries_say_what_to_change(body, says):
    with pytest.raises(ValueError, match=says) as info:
        parse_cluster_config(f"[[tenants.acme.slos]]\n{body}\n", source="cluster.toml")
    assert str(info.value).startswith("cluster.toml: tenants.acme.slos.0")


def test_two_slos_of_one_name_are_refused():
    text = '[[tenants.a.slos]]\nkind = "goodput"\nat_least = 0.9\n' * 2
    with pytest.raises(ValueError, match="SLO name 'goodput' is used twice"):
        parse_cluster_config(text)


def test_slo_spec_refuses_nonsense():
    with pytest.raises(ValueError, match="objective"):
        SloSpec(name="x", kind="queue_wait", target=1, objective=1.0)
    with pytest.raises(ValueError, match="alert_burned"):
        SloSpec(name="x", kind="queue_wait", target=1, objective=0.9, alert_burned=0)
