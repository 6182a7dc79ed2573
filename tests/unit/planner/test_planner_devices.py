"""The device table: lookups by key and NVML name, peaks per dtype."""

import pytest

from air_sdk.planner import DEVICES, device_spec, peak_flops


@pytest.mark.parametrize(
    ("nvml_name", "key"),
    [
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA H100 PCIe", "h100-pcie"),
        ("NVIDIA H100 NVL", "h100-nvl"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA A100-SXM4-80GB", "a100-80gb"),
        ("NVIDIA A100-SXM4-40GB", "a100-40gb"),
        ("NVIDIA L4", "l4"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA L40", "l40"),
        ("NVIDIA B200", "b200"),
    ],
)
def test_nvml_names_find_their_device(nvml_name, key):
    assert device_spec(nvml_name).key == key


def test_keys_and_aliases():
    assert device_spec("H100").key == "h100"
    assert device_spec("a100").key == "a100-80gb"  # the scheduler's plain label: the larger one
    assert set(DEVICES) >= {"h100", "h200", "a100-80gb", "l4"}


def test_memory_and_peaks_are_the_datasheet_figures():
    h100 = device_spec("h100")
    assert 79 < h100.memory_bytes / 2**30 < 80
    assert h100.peak("bf16") == pytest.approx(989.4e12)
    assert h100.peak("torch.bfloat16") == h100.peak("bf16")
    assert device_spec("h200").memory_bytes > 140 * 2**30
    assert device_spec("l4").peak("bf16") == pytest.approx(121e12)
    assert device_spec("a100-80gb").peak("fp32") == pytest.approx(19.5e12)
    for spec in DEVICES.values():
        assert spec.intra_node_bw >= spec.inter_node_bw > 0


def test_unknown_device_or_dtype_says_what_is_known():
    with pytest.raises(KeyError, match="known: .*h100"):
        device_spec("tpu-v5")
    with pytest.raises(ValueError, match="no fp8 peak .* known: "):
        device_spec("a100-80gb").peak("fp8")
    assert peak_flops("Intel(R) Xeon(R) CPU") is None
    assert peak_flops("NVIDIA A100-SXM4-80GB", "fp8") is None
    assert peak_flops("NVIDIA L4") == pytest.approx(121e12)
