from test_runtime_shipper import FakeGateway, make_shipper

from air_sdk.runtime._sampler import DeviceSampler
from air_sdk.schema import DeviceSample, WorkerReport


def test_cpu_sample_without_gpus_is_a_valid_device_sample(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # a CPU job: no GPU for this node
    sampler = DeviceSampler("node-3", shipper=None)  # type: ignore[arg-type]
    sampler._open_gpus()
    (sample,) = sampler.sample()
    parsed = DeviceSample.model_validate(sample)
    assert (parsed.node, parsed.device) == ("node-3", "cpu")
    assert 0 <= parsed.util_pct <= 100
    assert 0 < parsed.mem_used_mib <= parsed.mem_total_mib


def test_samples_travel_in_the_next_report():
    gw = FakeGateway()
    try:
        shipper = make_shipper(gw.report_url)
        shipper.add_samples([{"node": "node-0", "device": "cpu", "ts": 1.0, "util_pct": 12.5}])
        assert shipper.close(timeout=10)
        reports = [WorkerReport.model_validate(r) for r in gw.reports]
        samples = [s for r in reports for s in r.samples]
        assert [(s.node, s.util_pct) for s in samples] == [("node-0", 12.5)]
    finally:
        gw.close()
