"""Tokens/s and MFU from `air.log(..., tokens=N)`: the meter's arithmetic, FLOPs counted
by torch's FlopCounterMode over the first logged interval, and the shipper's wiring."""

import pytest
import torch

from air_sdk.runtime._shipper import MetricsShipper
from air_sdk.runtime._throughput import ThroughputMeter, meter_from_env


def test_tokens_per_s_counts_every_data_parallel_rank_once():
    # 8 ranks as tp=2: 4 data-parallel groups, each with its own batch
    meter = ThroughputMeter(world_size=8, non_data_parallel=2)
    assert meter.observe(0, 10.0, tokens=1000) is None
    out = meter.observe(5, 12.0, tokens=1000)  # 5 steps in 2 s
    assert out == {"tokens_per_s": 1000 * 2.5 * 4}  # no peak: no MFU


def test_mfu_from_the_models_flops_per_token():
    meter = ThroughputMeter(world_size=8, non_data_parallel=2, peak_flops=1e14, flops_per_token=6e8)
    meter.observe(0, 0.0, tokens=2048)
    out = meter.observe(10, 2.0, tokens=2048)  # 5 steps/s
    # each rank does its group's 6e8 x 2048 FLOPs per step split over the tp ranks
    assert out["mfu"] == pytest.approx(6e8 * 2048 / 2 * 5 / 1e14)


def test_a_repeated_or_rewound_step_starts_a_new_interval():
    meter = ThroughputMeter(peak_flops=1e12, flops_per_token=1.0)
    meter.observe(10, 1.0, tokens=1)
    assert meter.observe(10, 2.0, tokens=1) is None
    assert meter.observe(3, 3.0, tokens=1) is None  # a restart from a checkpoint
    assert meter.observe(4, 4.0, tokens=1)["tokens_per_s"] == 1.0


def _train_step(model, optimizer, x):
    model(x).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad()


def test_flops_are_counted_once_over_the_first_interval():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(16, 32)
    meter = ThroughputMeter(peak_flops=1e9, count_flops=True)
    assert meter.observe(1, 1.0, tokens=16) is None  # the counter starts here
    _train_step(model, optimizer, x)
    _train_step(model, optimizer, x)
    counted = meter.observe(3, 2.0, tokens=16)  # two steps counted: per step is half
    # model FLOPs: the forward 2*16*(32*64 + 64*8), three times (forward and backward);
    # the hardware's: forward, and a backward without an input grad for layer 1
    forward = 2 * 16 * (32 * 64 + 64 * 8)
    expected = 3 * forward
    hardware = forward + forward + (forward - 2 * 16 * 32 * 64)
    assert counted == {"flops_per_step": expected, "hardware_flops_per_step": hardware}
    assert meter.flops_per_step == expected
    _train_step(model, optimizer, x)
    out = meter.observe(4, 2.5, tokens=16)
    assert out["mfu"] == pytest.approx(expected * 2 / 1e9)
    assert out["hfu"] == pytest.approx(hardware * 2 / 1e9)
    assert out["tokens_per_s"] == 32.0


def test_no_counting_without_a_peak_or_when_turned_off():
    meter = ThroughputMeter(peak_flops=None, count_flops=True)
    meter.observe(1, 1.0, tokens=8)
    assert meter._counter is None
    off = meter_from_env({"AIR_PEAK_FLOPS": "1e12", "AIR_COUNT_FLOPS": "0"})
    off.observe(1, 1.0, tokens=8)
    assert off._counter is None


def test_meter_from_env(capsys):
    env = {
        "WORLD_SIZE": "16",
        "AIR_PARALLELISM": '{"pp": 2, "dp_replicate": 1, "dp_shard": 2, "cp": 1, "tp": 4}',
        "AIR_PEAK_FLOPS": "9.894e14",
        "AIR_FLOPS_PER_TOKEN": "5.79e10",
    }
    meter = meter_from_env(env)
    assert (meter.data_parallel, meter.non_data_parallel) == (2, 8)
    assert meter.peak_flops == 9.894e14 and meter.flops_per_token == 5.79e10
    bad = meter_from_env({"AIR_PEAK_FLOPS": "fast"})
    assert bad.peak_flops is None  # a CPU here, and the override was not a number
    assert "ignoring AIR_PEAK_FLOPS='fast': not a number" in capsys.readouterr().err


def test_log_with_tokens_adds_the_derived_values_and_keeps_the_users():
    shipper = MetricsShipper(rank=0, poster=None)
    shipper._meter = ThroughputMeter(peak_flops=1e12, flops_per_token=1e6)
    shipper.log(1, loss=1.0, tokens=100)
    assert "tokens_per_s" not in shipper.latest  # one point is no rate yet
    shipper.log(2, loss=0.9, tokens=100, mfu=0.5)
    assert shipper.latest["tokens_per_s"] > 0
    assert shipper.latest["mfu"] == 0.5  # the script's own value wins
    shipper.log(3, loss=0.8)  # without tokens: nothing derived, nothing lost
    assert shipper.latest["loss"] == 0.8
