"""Device profiles (exogym.sim.devices): the roofline by hand, which peak a kernel runs at, the
hardware specs and their errors, a mix's draws, FedScale-form files."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from exogym.sim.devices import (
    DEFAULT_HARDWARE,
    PROFILES,
    DeviceProfile,
    Pricing,
    describe_profile,
    device_profile,
    load_profiles,
    parse_flops,
    parse_hardware,
    parse_profile,
    uniform,
)
from exogym.sim.flops import Kernel, StepCount


def _count(*kernels: tuple[Kernel, int], samples: int = 8) -> StepCount:
    return StepCount(forward_flops=0, backward_flops=0, optimizer_flops=0, elementwise_flops=0,
                     bytes=0, kernels=sum(n for _, n in kernels), optimizer_bytes=0,
                     optimizer_kernels=0, parameters=1, samples=samples, profile=kernels)


# a device of round figures: 1 TFLOP/s fp32, 4 TFLOP/s bf16, 2 TFLOP/s tf32, 1 GB/s, 1 us
ROUND = DeviceProfile(name="round", title="round", kind="custom",
                      peak_flops={"fp32": 1e12, "tf32": 2e12, "bf16": 4e12}, mem_bw=1e9,
                      memory=None, overhead_s=1e-6, source="test", eta_c=0.5, eta_m=0.5)


def test_a_kernel_costs_its_roofline_by_hand() -> None:
    # compute-bound: 1e9 FLOPs at 1e12 * 0.5 = 2 ms (its 1 kB at 0.5 GB/s: 2 us)
    assert ROUND.kernel_time(Kernel("mm", "fp32", 10**9, 1000)) == pytest.approx(2e-3)
    # memory-bound: 1 MB at 1e9 * 0.5 = 2 ms (its 1e6 FLOPs: 2 us)
    assert ROUND.kernel_time(Kernel("ew", "fp32", 10**6, 10**6)) == pytest.approx(2e-3)
    # launch-bound: 1 kFLOP, 100 bytes: below 1 us of overhead
    assert ROUND.kernel_time(Kernel("ew", "fp32", 1000, 100)) == 1e-6
    count = _count((Kernel("mm", "fp32", 10**9, 1000), 3), (Kernel("ew", "fp32", 1000, 100), 5))
    assert ROUND.step_time(count) == pytest.approx(3 * 2e-3 + 5 * 1e-6)
    assert ROUND.bound(count) == pytest.approx({"compute": 6e-3, "memory": 0.0,
                                                "overhead": 5e-6})


def test_each_kind_and_dtype_runs_at_its_peak() -> None:
    # fp32 matrix products at the fp32 rate (PyTorch's default matmul precision), fp32
    # convolutions at TF32 (cuDNN's default), bf16 at the tensor rate; elementwise at fp32;
    # a dtype the device lacks at fp32
    assert ROUND.peak("mm", "fp32") == 1e12
    assert ROUND.peak("conv", "fp32") == 2e12
    assert ROUND.peak("mm", "bf16") == ROUND.peak("conv", "bf16") == 4e12
    assert ROUND.peak("ew", "bf16") == 1e12
    assert ROUND.peak("mm", "fp16") == 1e12
    m2 = PROFILES["m2"]  # no TF32: an fp32 convolution at the fp32 rate
    assert m2.peak("conv", "fp32") == m2.peak_flops["fp32"]


def test_the_named_profiles_are_the_datasheets() -> None:
    h100, rtx4090 = PROFILES["h100"], PROFILES["rtx4090"]
    assert h100.peak_flops["bf16"] == 989.4e12 and h100.mem_bw == 3.35e12
    # GeForce: bf16 with fp32 accumulate at half the fp16-accumulate rate (330.3)
    assert rtx4090.peak_flops["bf16"] == 165.2e12 and rtx4090.mem_bw == 1008e9
    assert PROFILES["a100"].peak_flops == {"fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12,
                                           "fp16": 312e12}
    assert DEFAULT_HARDWARE in PROFILES
    assert all(p.source for p in PROFILES.values())
    # the phone classes are ordered
    phones = [PROFILES[f"phone-{c}"] for c in ("low", "mid", "high")]
    assert [p.peak_flops["fp32"] for p in phones] == sorted(p.peak_flops["fp32"] for p in phones)


def test_names_ignore_case_and_separators_and_unknown_ones_suggest_the_nearest() -> None:
    assert device_profile("RTX-4090") is PROFILES["rtx4090"]
    assert device_profile("M2 Max") is PROFILES["m2-max"]
    with pytest.raises(ValueError, match=r"unknown device 'rtx4900'; did you mean 'rtx4090'"):
        device_profile("rtx4900")
    with pytest.raises(ValueError, match="did you mean 'h100'"):
        parse_hardware("h100:h10")


def test_hardware_specs() -> None:
    one = parse_hardware("a100")
    assert one.uniform and one.devices == (PROFILES["a100"],)
    assert parse_hardware(None).devices == (PROFILES[DEFAULT_HARDWARE],)
    listed = parse_hardware("h100:h100:rtx4090:m2")
    assert [d.name for d in listed.devices] == ["h100", "rtx4090", "m2"]
    assert listed.per_node == (0, 0, 1, 2)
    listed.check_nodes(4)
    with pytest.raises(ValueError, match="lists 4 devices but the run has 3 nodes"):
        listed.check_nodes(3)
    mix = parse_hardware("phone-low=0.5,phone-mid=0.3,phone-high=0.2")
    assert mix.shares == pytest.approx((0.5, 0.3, 0.2))
    for bad, message in (("phone-low=0.5,phone-mid=0.3", "add up to 0.8"),
                         ("phone-low=0.5,phone-low=0.5", "appears twice"),
                         ("phone-low=x,m2=0.5", "NAME=SHARE"),
                         ("", "hardware must be")):
        with pytest.raises(ValueError, match=message):
            parse_hardware(bad)


def test_a_custom_device() -> None:
    p = parse_profile("flops=80T,mem_bw=1TB/s,overhead=5us")
    assert p.peak_flops == {d: 80e12 for d in ("fp32", "tf32", "bf16", "fp16")}
    assert p.mem_bw == 1e12 and p.overhead_s == pytest.approx(5e-6)
    p = parse_hardware("fp32=10T,bf16=40T,mem_bw=800Gbps").devices[0]
    assert p.peak_flops == {"fp32": 10e12, "bf16": 40e12} and p.mem_bw == 100e9
    assert parse_flops("82.6TFLOPS") == parse_flops("82.6T") == parse_flops(82.6e12) == 82.6e12
    for bad, message in (("flops=80T", "needs flops"), ("flop=80T,mem_bw=1TB/s", "keys:"),
                         ("flops=fast,mem_bw=1TB/s", "FLOP/s figure"),
                         ("flops=80T,mem_bw=1TB/s,flops=90T", "gives flops twice"),
                         ("flops=80T,mem_bw=1TB/s,eta_c=2",
                          r"eta_c must be a fraction of peak in \[0.01, 1\]")):
        with pytest.raises(ValueError, match=message):
            parse_profile(bad)


def test_a_users_profiles_file(tmp_path: Path) -> None:
    path = tmp_path / "mine.json"
    path.write_text(json.dumps([{"name": "lab-gpu", "peak_flops": {"fp32": "20T", "bf16": "80T"},
                                 "mem_bw": "900GB/s", "overhead_s": "6us"}]))
    mine = load_profiles(path)
    assert mine["lab-gpu"].peak_flops == {"fp32": 20e12, "bf16": 80e12}
    assert parse_hardware("lab-gpu:a100", mine).devices[0] is mine["lab-gpu"]
    path.write_text(json.dumps([{"name": "x", "peak_flops": {"fp32": 1}, "mem_bw": 1,
                                 "speed": 3}]))
    with pytest.raises(ValueError, match=r"unknown device profile keys \['speed'\]"):
        load_profiles(path)


LAB = {"name": "lab-gpu", "peak_flops": {"fp32": "20T"}, "mem_bw": "900GB/s"}
FLOPS = r"a FLOP/s figure in \[1e\+06, 1e\+21\] \(1 MFLOP/s to 1 ZFLOP/s\)"


@pytest.mark.parametrize(("profiles", "message"), [
    (LAB, r"must be a JSON list of objects with name, peak_flops, mem_bw .*, got \{'name'"),
    ([], r"must be a JSON list of objects .*, got \[\]"),
    (["lab-gpu"], r"profile 1 of 1: a device profile must be an object with name, peak_flops, "
                  r"mem_bw .*, got 'lab-gpu'"),
    ([{**LAB, "name": 3}], r"profile 1 of 1: a device profile's name must be a non-empty "
                           r"string, got 3$"),
    ([LAB, {**LAB, "name": "b", "peak_flops": 5}],
     r"profile 2 of 2: device 'b': peak_flops must be an object of FLOP/s by dtype \(fp32, "
     r"tf32, bf16, fp16; 'fp32' needed\), .*, got 5$"),
    ([{**LAB, "peak_flops": ["20T"]}], r"device 'lab-gpu': peak_flops must be .*, got \['20T'\]"),
    ([{**LAB, "peak_flops": {"fp32": [1]}}],
     rf"device 'lab-gpu': peak_flops\['fp32'\] must be {FLOPS}, e.g. '82.6T' or 3.6e12, "
     r"got \[1\]$"),
    ([{**LAB, "mem_bw": [1]}], r"device 'lab-gpu': mem_bw must be a memory bandwidth in "
                               r"\[1e\+03, 1e\+18\] bytes/s .*, got \[1\]"),
    ([{**LAB, "title": 7}], r"device 'lab-gpu': title must be a string, got 7$"),
    ([{**LAB, "eta_c": "fast"}], r"device 'lab-gpu': eta_c must be a fraction of peak in "
                                 r"\[0.01, 1\], e.g. 0.7, got 'fast'$"),
    ([{**LAB, "memory": "lots"}], r"device 'lab-gpu': memory must be a size in bytes .*, "
                                  r"got 'lots'$"),
    ([{**LAB, "overhead_s": 1e308}], r"device 'lab-gpu': overhead_s must be a time per kernel "
                                     r"in \[0, 3600\] seconds \(at most an hour a kernel\), "
                                     r".*got 1e\+308$"),
    ([LAB, {**LAB, "name": "Lab_GPU"}], r"give the name 'Lab_GPU' to profiles 1 and 2: each "
                                        r"profile needs its own name"),
])
def test_a_profiles_file_of_wrong_types_names_the_file_the_profile_and_the_field(
        profiles: Any, message: str, tmp_path: Path) -> None:
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(profiles))
    with pytest.raises(ValueError, match=rf"^device profiles '{re.escape(str(path))}'.*{message}"):
        load_profiles(path)


@pytest.mark.parametrize(("spec", "message"), [
    ("flops=80T,mem_bw=1TB/s,overhead=1e308s", r"overhead must be a time per kernel in \[0, "
                                                r"3600\] seconds .*, got '1e308s'"),
    ("fp32=1e400,mem_bw=1TB/s", rf"fp32 must be {FLOPS}, .*got '1e400'"),
    ("flops=1e-300,mem_bw=1TB/s", rf"flops must be {FLOPS}, .*got '1e-300'"),
    ("flops=80T,mem_bw=1e300TB/s", r"mem_bw must be a memory bandwidth in \[1e\+03, "
                                   r"1e\+18\] bytes/s \(1 kB/s to 1 EB/s\), .*got '1e300TB/s'"),
    ("flops=80T,mem_bw=1TB/s,eta_c=abc", r"eta_c must be a fraction of peak in \[0.01, 1\], "
                                         r"e.g. 0.7, got 'abc'$"),
    ("flops=80T,mem_bw=1TB/s,eta_m=1e-300", r"eta_m must be a fraction of peak in \[0.01, 1\]"),
])
def test_figures_that_would_overflow_a_price_are_refused_with_their_range(
        spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=rf"^custom device '{re.escape(spec)}': {message}"):
        parse_profile(spec)


def test_no_device_prices_a_step_at_inf_or_nan() -> None:
    # the extremes the ranges allow, on a step of 1e20 FLOPs in a million kernels: finite
    slow = parse_profile("flops=1e6,mem_bw=1kB/s,overhead=3600s,eta_c=0.01,eta_m=0.01")
    fast = parse_profile("flops=1e21,mem_bw=1e15kB/s,overhead=0s,eta_c=1,eta_m=1")
    count = _count((Kernel("mm", "fp32", 10**14, 10**15), 10**6))
    for device in (slow, fast):
        assert math.isfinite(device.step_time(count)) and device.step_time(count) > 0
    # a finite overhead beyond an hour would make a step of many kernels inf
    with pytest.raises(ValueError, match=r"device 'x': overhead_s must be .*, got 1e\+308$"):
        DeviceProfile(name="x", title="x", kind="custom", peak_flops={"fp32": 1e12},
                      mem_bw=1e9, memory=None, overhead_s=1e308, source="test")


def test_a_mix_draws_each_client_from_its_seed_and_id() -> None:
    mix = parse_hardware("phone-low=0.5,phone-mid=0.3,phone-high=0.2")
    ids = np.arange(200_000)
    drawn = mix.device_of(ids, seed=3)
    # a client's device depends on (seed, client) only: drawn alone, or among others, the same
    assert np.array_equal(mix.device_of(ids[12345:12346], seed=3), drawn[12345:12346])
    assert np.array_equal(mix.device_of(ids[::7], seed=3), drawn[::7])
    assert not np.array_equal(mix.device_of(ids[:1000], seed=4), drawn[:1000])
    # the shares within 4.5 standard errors of a binomial share at n = 200,000
    for k, share in enumerate((0.5, 0.3, 0.2)):
        se = math.sqrt(share * (1 - share) / len(ids))
        assert abs(np.mean(drawn == k) - share) < 4.5 * se
    u = uniform(0, np.arange(100_000))
    assert u.min() >= 0 and u.max() < 1 and abs(u.mean() - 0.5) < 0.01


def test_pricing_gives_speeds_relative_to_the_first_device() -> None:
    fast = Kernel("mm", "fp32", 10**12, 10**6)
    count = _count((fast, 1))
    one = Pricing.of(parse_hardware("a100"), count, 4, seed=0)
    assert one.speeds is None and one.step_time_s == PROFILES["a100"].step_time(count)
    mixed = Pricing.of(parse_hardware("a100:h100:a100"), count, 3, seed=0)
    a100, h100 = (PROFILES[n].step_time(count) for n in ("a100", "h100"))
    assert mixed.step_time_s == a100
    assert mixed.speeds == pytest.approx([1.0, a100 / h100, 1.0])


def test_a_fedscale_form_file_prices_each_client_and_gives_its_link(tmp_path: Path) -> None:
    csv = tmp_path / "clients.csv"
    csv.write_text("client_id,computation,communication\n1,20,5000\n0,10,1000\n2,40,200\n")
    hw = parse_hardware(str(csv))
    count = _count((Kernel("mm", "fp32", 1, 1), 1), samples=8)
    # client c takes row c mod 3 (sorted by id); a step: ms per sample x samples
    times = hw.step_times(count, np.arange(5), seed=0)
    assert times == pytest.approx([0.08, 0.16, 0.32, 0.08, 0.16])
    assert hw.links(np.arange(4)) == pytest.approx([1e6, 5e6, 2e5, 1e6])
    priced = Pricing.of(hw, count, 3, seed=0)
    assert priced.step_time_s == pytest.approx(0.08)
    assert priced.speeds == pytest.approx([1.0, 0.5, 0.25])
    js = tmp_path / "clients.json"
    js.write_text(json.dumps({"0": {"computation": 10, "communication": 1000}}))
    assert parse_hardware(str(js)).step_times(count, np.arange(2), 0) == pytest.approx([0.08] * 2)
    bad = tmp_path / "bad.csv"
    bad.write_text("client,compute\n1,2\n")
    with pytest.raises(ValueError, match="must be FedScale's form"):
        parse_hardware(str(bad))
    with pytest.raises(ValueError, match="cannot read the device-profile file"):
        parse_hardware(str(tmp_path / "missing.csv"))


HEADER = "client_id,computation,communication\n"


@pytest.mark.parametrize(("name", "text", "message"), [
    ("twice.csv", HEADER + "0,10,1000\n3,20,1000\n3,30,1000\n",
     r", line 4: client 3 is listed twice \(at line 3 and line 4\); give each client one row"),
    ("twice.json", '{"0": {"computation": 1, "communication": 2}, '
                   '"0": {"computation": 3, "communication": 4}}',
     r": client 0 is listed twice \(at key '0' and key '0'\)"),
    ("columns.csv", "client_id,computation\n0,10\n",
     r" must be FedScale's form: .*; its header \['client_id', 'computation'\] lacks "
     r"communication$"),
    ("word.csv", HEADER + "0,fast,1000\n", r", line 2: client 0's computation must be "
                                           r"milliseconds per sample in \[1e-06, 3.6e\+06\] "
                                           r".*, got 'fast'$"),
    ("zero.csv", HEADER + "0,10,0\n", r", line 2: client 0's communication must be kbit/s in "
                                      r"\[0.001, 1e\+10\] .*, got '0'$"),
    ("huge.csv", HEADER + "0,1e308,10\n", r", line 2: client 0's computation must be .*, "
                                          r"got '1e308'$"),
    ("short.csv", HEADER + "0,10\n", r", line 2: client 0 has no communication"),
    ("id.csv", HEADER + "a,10,10\n", r", line 2: client_id must be an integer >= 0, got 'a'$"),
    ("list.json", "[1, 2]", r" must be FedScale's form: .*, got \[1, 2\]$"),
    ("string.json", '{"0": "fast"}', r": client 0 must be an object with computation \(ms "
                                     r"per sample\) and communication \(kbit/s\), got 'fast'$"),
    ("types.json", '{"0": {"computation": [40], "communication": 10}}',
     r": client 0's computation must be .*, got \[40\]$"),
    ("flag.json", '{"0": {"computation": true, "communication": 10}}',
     r": client 0's computation must be .*, got True$"),
])
def test_a_fedscale_file_with_bad_rows_names_the_client_and_the_field(
        name: str, text: str, message: str, tmp_path: Path) -> None:
    path = tmp_path / name
    path.write_text(text)
    where = re.escape(str(path))
    with pytest.raises(ValueError, match=rf"^the device-profile file '{where}'{message}"):
        parse_hardware(str(path))


def test_a_fedscale_tables_digest_is_of_its_figures(tmp_path: Path) -> None:
    one, other = tmp_path / "one.csv", tmp_path / "other.json"
    one.write_text(HEADER + "1,20,5000\n0,10,1000\n")
    other.write_text(json.dumps({"0": {"computation": 10.0, "communication": "1000"},
                                 "1": {"computation": 20, "communication": 5e3}}))
    table = parse_hardware(str(one)).figures()["table"]
    # the same rows in another form and order: the same figures, the same digest
    assert parse_hardware(str(other)).figures()["table"] == table
    assert table["rows"] == 2 and len(table["sha256"]) == 64
    one.write_text(HEADER + "1,21,5000\n0,10,1000\n")
    assert parse_hardware(str(one)).figures()["table"]["sha256"] != table["sha256"]


def test_the_docs_table_shows_every_profile_as_it_is() -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "devices.md").read_text()
    rows = {}
    for line in page.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("| `") and len(cells) == 7:
            rows[cells[0].split("`")[1]] = cells
    assert set(rows) == set(PROFILES)
    for name, p in PROFILES.items():
        _, _, fp32, bf16, bw, overhead = describe_profile(p)
        assert rows[name][2:6] == [fp32, bf16, bw, overhead], name
