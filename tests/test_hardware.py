"""Hardware profiles: bundled files, sources on every number, validation, round trips."""

from __future__ import annotations

import dataclasses
import tomllib
from importlib import resources

import pytest

from kvsim.core.errors import KvsimInputError
from kvsim.spec.hardware import (
    TIER_NAMES,
    HardwareProfile,
    list_hardware,
    load_hardware,
    parse_hardware,
    save_hardware,
)

BUNDLED = ["a100-80g", "b200", "gh200", "h100-sxm", "h200", "l40s"]


def _bundled_text(name: str) -> str:
    return resources.files("kvsim.profiles").joinpath("hardware", f"{name}.toml").read_text()


def test_bundled_profiles_are_listed_and_load():
    assert list_hardware() == BUNDLED
    for name in BUNDLED:
        profile = load_hardware(name)
        assert profile.name == name
        assert list(profile.tiers) == list(TIER_NAMES)
        assert profile.tiers["hbm"].capacity_bytes == profile.gpu_memory_bytes
        assert profile.provenance["kind"] == "datasheet"


@pytest.mark.parametrize("name", BUNDLED)
def test_every_number_has_a_source_or_a_stated_assumption(name):
    data = tomllib.loads(_bundled_text(name))
    profile = load_hardware(name)
    keys = [f"compute.{k}" for k in data["compute"]]
    for tier, table in data["tiers"].items():
        keys += [f"tiers.{tier}.{k}" for k in table]
    assert keys, name
    for key in keys:
        comment = profile.sources.get(key, "")
        assert comment.startswith(("source:", "assumption:")), (name, key, comment)
        assert len(comment) > 20, (name, key, comment)  # says where, or why


def test_datasheet_values_of_the_issue():
    h100 = load_hardware("h100-sxm")
    assert h100.gpu_memory_bytes == 81_559 * 2**20
    assert h100.peak_dense_bf16_flops_per_s == 989.4e12
    assert h100.hbm_bandwidth_bytes_per_s == 3.35e12
    assert h100.tiers["dram"].link == "pcie5-x16"
    gh200 = load_hardware("gh200")
    dram = gh200.tiers["dram"]
    assert dram.link == "nvlink-c2c" and dram.capacity_bytes == 480 * 10**9
    assert dram.link_bandwidth_bytes_per_s <= 450e9  # per direction of 900 GB/s total
    assert not gh200.tiers["cxl"].enabled  # Grace has no CXL
    l40s = load_hardware("l40s")
    assert l40s.gpu_memory_bytes == 46_068 * 2**20
    assert l40s.hbm_bandwidth_bytes_per_s == 864e9
    assert l40s.tiers["dram"].link == "pcie4-x16"
    assert [t.name for t in load_hardware("a100-80g").enabled_tiers()] == ["hbm", "dram", "nvme"]


def test_transfer_time_is_latency_plus_bytes_over_the_slowest_hop():
    dram = load_hardware("h100-sxm").tiers["dram"]
    nbytes = 2 * 2**20
    assert dram.path_bandwidth_bytes_per_s() == 55e9  # link slower than DDR5
    assert dram.transfer_us(nbytes) == pytest.approx(0.1 + 5.0 + nbytes / 55e9 * 1e6)
    nvme = load_hardware("h100-sxm").tiers["nvme"]
    assert nvme.path_bandwidth_bytes_per_s(to_gpu=False) == 3.8e9  # drive writes are slowest
    assert load_hardware("a100-80g").tiers["cxl"].transfer_us(1) == float("inf")


def test_with_capacities_replaces_and_disables():
    h100 = load_hardware("h100-sxm")
    small = h100.with_capacities(hbm_bytes=10 * 2**30, cxl_bytes=0)
    assert small.tiers["hbm"].capacity_bytes == 10 * 2**30
    assert not small.tiers["cxl"].enabled
    assert small.tiers["dram"] == h100.tiers["dram"]
    assert h100.tiers["cxl"].enabled  # the original is untouched
    with pytest.raises(KvsimInputError, match="cxl"):
        load_hardware("a100-80g").with_capacities(cxl_bytes=10**9)
    with pytest.raises(KvsimInputError, match="dram_bytes"):
        h100.with_capacities(dram_bytes=-1)


@pytest.mark.parametrize("name", BUNDLED)
def test_save_load_round_trip(tmp_path, name):
    profile = load_hardware(name)
    path = tmp_path / f"{name}.toml"
    save_hardware(profile, path)
    again = load_hardware(str(path))
    assert again == profile
    assert again.sources == profile.sources  # source comments survive
    changed = profile.with_capacities(dram_bytes=0, nvme_bytes=123)
    save_hardware(changed, path)
    assert load_hardware(str(path)) == changed
    assert [p.name for p in tmp_path.iterdir()] == [f"{name}.toml"]  # no temp file left


def test_calibrated_profile_round_trip(tmp_path):
    profile = dataclasses.replace(
        load_hardware("h100-sxm"), name="h100-lab",
        description='lab "rack #3" \\ GPU 0; no # comment here',
        provenance={"kind": "calibrated", "backend": "cuda", "device": "H100 \"SXM\"",
                    "driver": "550.54", "date": "2026-11-01", "timer": "cuda-events"})
    path = tmp_path / "lab.toml"
    save_hardware(profile, path)
    again = load_hardware(str(path))
    assert again == profile and again.description == profile.description
    assert "description" not in again.sources  # the '#' inside the string is not a comment


def test_failed_save_leaves_no_file(tmp_path):
    bad = dataclasses.replace(load_hardware("l40s"), provenance={"kind": ["not", "scalar"]})
    path = tmp_path / "bad.toml"
    with pytest.raises(TypeError):
        save_hardware(bad, path)
    assert list(tmp_path.iterdir()) == []


def _base_text() -> str:
    return _bundled_text("h100-sxm")


@pytest.mark.parametrize("edit, field_name", [
    (lambda t: t.replace("gpu_memory_bytes = 85_520_809_984", ""), "compute.gpu_memory_bytes"),
    (lambda t: t.replace("latency_us = 0.1", "latncy_us = 0.1"), "tiers.dram.latncy_us"),
    (lambda t: t.replace("read_bandwidth_bytes_per_s = 36e9", "read_bandwidth_bytes_per_s = -1"),
     "tiers.cxl.read_bandwidth_bytes_per_s"),
    (lambda t: t.replace("achievable_flops_fraction = 0.5", "achievable_flops_fraction = 1.5"),
     "compute.achievable_flops_fraction"),
    (lambda t: t.replace('link = "pcie5-x16"', "link = 16"), "tiers.dram.link"),
    (lambda t: t.replace("[tiers.nvme]", "[tiers.ssd]"), "tiers.ssd"),
    (lambda t: t.replace("capacity_bytes = 256_000_000_000", "capacity_bytes = 2.5"),
     "tiers.cxl.capacity_bytes"),
])
def test_bad_profile_names_file_and_key(tmp_path, edit, field_name):
    path = tmp_path / "bad.toml"
    path.write_text(edit(_base_text()))
    with pytest.raises(KvsimInputError) as err:
        load_hardware(str(path))
    assert err.value.field == field_name
    assert str(err.value).startswith(str(path))


def test_not_toml_and_unknown_name():
    with pytest.raises(KvsimInputError, match="not valid TOML"):
        parse_hardware("name = ", "x.toml")
    with pytest.raises(KvsimInputError) as err:
        load_hardware("h100")
    assert "did you mean h100-sxm" in str(err.value)


def test_profile_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        load_hardware("h200").gpu_memory_bytes = 1  # type: ignore[misc]
    assert isinstance(load_hardware("h200"), HardwareProfile)
