"""The network model: unit parsing, profiles, the closed-form time of every collective."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from exogym.sim.network import (
    HOP_LATENCY_S,
    LINK_EFFICIENCY,
    PROFILES,
    Network,
    collective_time,
    format_duration,
    parse_duration,
    parse_network,
    parse_rate,
)

# -- units -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "bps"),
    [
        ("100Mbps", 100e6),
        ("100mbps", 100e6),  # a lower-case prefix is still mega: milli-bits/s means nothing
        ("1Gbps", 1e9),
        ("200 Gbit/s", 200e9),
        ("10Mb/s", 10e6),
        ("56kbps", 56e3),
        ("1.5GB/s", 1.5e9 * 8),  # upper-case B: bytes -> 12 Gbit/s
        ("2.5kB/s", 2.5e3 * 8),
        ("125MBps", 1e9),
        ("3e2Mbps", 300e6),
        ("800bps", 800.0),
    ],
)
def test_parse_rate(text: str, bps: float) -> None:
    assert parse_rate(text) == pytest.approx(bps, rel=1e-15)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("100", "unknown bandwidth unit '' in '100'"),  # bits or bytes? a unit is required
        ("100Mbs", "unknown bandwidth unit 'Mbs'"),
        ("100MiB/s", "unknown bandwidth unit 'MiB/s'"),
        ("fast", "must be a number with a unit"),
        ("0Mbps", "must be > 0"),
        ("1e300TB/s", "must be a finite number of bits or bytes per second"),  # overflows
    ],
)
def test_parse_rate_errors(text: str, message: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_rate(text)
    assert message in str(err.value)
    if "unit" in message:
        assert "Gbps" in str(err.value) and "GB/s" in str(err.value)  # lists the allowed units


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("20ms", 0.02), ("10us", 1e-5), ("10µs", 1e-5), ("1.5s", 1.5), ("1min", 60.0),
     ("2h", 7200.0), ("500ns", 5e-7), ("1 d", 86400.0)],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds, rel=1e-15)


@pytest.mark.parametrize(
    ("text", "message"),
    [("20", "a duration needs a unit: '20' could be seconds or milliseconds; write e.g. "
             "'20ms'"),
     ("20 parsecs", "unknown duration unit 'parsecs'"),
     ("3m", "unknown duration unit 'm'"), ("soon", "a number with a unit")],
)
def test_parse_duration_errors(text: str, message: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_duration(text)
    assert message in str(err.value)
    if "unit" in message:
        assert "ms" in str(err.value) and "min" in str(err.value)


def test_format_duration() -> None:
    assert format_duration(0.0) == "0 s"
    assert format_duration(1e-5) == "10 us"
    assert format_duration(0.02) == "20 ms"
    assert format_duration(0.56) == "0.56 s"
    assert format_duration(1120) == "18.7 min"
    assert format_duration(30_280) == "505 min (8.4 h)"
    assert format_duration(630_000) == "10,500 min (7.3 days)"


# -- closed forms ----------------------------------------------------------------------------------
# A network of 8 Mbit/s = 1 MB/s and 1 ms latency, S = 1 MB per node: moving S takes 1 s.
S = 1e6
# The calibration (every profile's default): payload share of a link 1448 / (1514 + 66 / 2)
# = 1448 / 1547 = 0.936005 (1 / EFF = 1.068370), and 150 us of software latency per hop.
EFF = 1448 / 1547
HOP = 150e-6


def test_calibration_constants() -> None:
    assert LINK_EFFICIENCY == EFF and HOP_LATENCY_S == HOP
    assert round(LINK_EFFICIENCY, 6) == 0.936005
    assert all(p.efficiency == EFF and p.hop_latency_s == HOP for p in PROFILES.values())
    default = Network(up_bps=8e6)
    assert (default.efficiency, default.hop_latency_s) == (EFF, HOP)


@pytest.mark.parametrize(
    ("algos", "op", "n", "seconds", "latency_only"),
    [
        # ring all-reduce 2(N-1) * (S/(N B) + L): N=4: 6 * (0.25 + 0.001) = 1.506
        ({"all_reduce": "ring"}, "all_reduce", 4, 1.506, 6e-3),
        # N=2: 2 * (0.5 + 0.001) = 1.002
        ({"all_reduce": "ring"}, "all_reduce", 2, 1.002, 2e-3),
        # tree 2 ceil(log2 N) (S/B + L): N=4: 2 * 2 * 1.001 = 4.004; N=5: 2 * 3 * 1.001 = 6.006
        ({"all_reduce": "tree"}, "all_reduce", 4, 4.004, 4e-3),
        ({"all_reduce": "tree"}, "all_reduce", 5, 6.006, 6e-3),
        # star (parameter server) 2 ((N-1) S/B + L): N=4: 2 * (3 + 0.001) = 6.002
        ({"all_reduce": "star"}, "all_reduce", 4, 6.002, 2e-3),
        # ring all-gather (N-1)(S/B + L): 3 * 1.001 = 3.003
        ({}, "all_gather", 4, 3.003, 3e-3),
        # star broadcast (N-1) S/B + L: 3 + 0.001 = 3.001
        ({"broadcast": "star"}, "broadcast", 4, 3.001, 1e-3),
        # tree broadcast ceil(log2 N)(S/B + L): 2 * 1.001 = 2.002
        ({"broadcast": "tree"}, "broadcast", 4, 2.002, 2e-3),
    ],
)
def test_collective_closed_forms(algos: dict, op: str, n: int, seconds: float,
                                 latency_only: float) -> None:
    # the bare formulas: every bit is payload, no software latency
    net = Network(up_bps=8e6, latency_s=1e-3, efficiency=1.0, hop_latency_s=0.0, **algos)
    assert net.collective_time(op, S, n) == pytest.approx(seconds, rel=1e-12)
    assert net.collective_time(op, S, 1) == 0.0  # one node sends nothing
    assert net.collective_time(op, 0, n) == pytest.approx(latency_only, rel=1e-12)
    # calibrated: every transfer at EFF of the link, every latency term + 150 us. The bandwidth
    # part scales by 1 / EFF and each of the k = latency_only / 1 ms latency terms gains HOP.
    cal = Network(up_bps=8e6, latency_s=1e-3, **algos)
    k = round(latency_only / 1e-3)
    assert cal.collective_time(op, S, n) == pytest.approx(
        (seconds - latency_only) / EFF + k * (1e-3 + HOP), rel=1e-12)
    assert cal.collective_time(op, 0, n) == pytest.approx(k * (1e-3 + HOP), rel=1e-12)


def test_calibrated_ring_all_reduce_by_hand() -> None:
    # 32 MB over N = 2 at 20 Mbit/s, no link latency: 8 * 32e6 / 20e6 = 12.8 s of payload at
    # the line rate; / 0.936005 = 13.675138 s; + 2 hops of 150 us = 13.675438 s
    net = parse_network("bw=20Mbps,latency=0s")
    assert net.collective_time("all_reduce", 32e6, 2) == pytest.approx(13.675438, abs=1e-6)
    # N = 4: 2 * 3/4 * 12.8 = 19.2 s; / 0.936005 = 20.512707; + 6 x 150 us = 20.513607 s
    assert net.collective_time("all_reduce", 32e6, 4) == pytest.approx(20.513607, abs=1e-6)
    # overriding both gives the bare formula: 12.8 s exactly
    bare = parse_network("bw=20Mbps,latency=0s,efficiency=1,hop_latency=0s")
    assert bare.collective_time("all_reduce", 32e6, 2) == pytest.approx(12.8, rel=1e-12)


MNIST_P = 861_480  # the MNIST CNN's fp32 parameter bytes


@pytest.mark.parametrize(
    ("name", "seconds"),
    [
        # ring, N = 4: 6 * (8 P / 4 / (EFF B) + L + HOP); 8 P / 4 = 1,722,960 bits
        ("datacenter", 1.0152228e-3),  # 6 * (9.20380e-6 + 10e-6 + 150e-6)
        ("cloud-10g", 2.6044554e-3),  # 6 * (1.840760e-4 + 100e-6 + 150e-6)
        ("home-1gbps", 0.07194455),  # 6 * (1.840760e-3 + 10e-3 + 150e-6)
        ("home-100mbps", 0.23134554),  # 6 * (0.01840760 + 20e-3 + 150e-6)
        ("mobile", 1.4053554),  # the 10 Mbit/s uplink: 6 * (0.1840760 + 50e-3 + 150e-6)
    ],
)
def test_profiles_ring_all_reduce_of_the_mnist_cnn(name: str, seconds: float) -> None:
    assert collective_time("all_reduce", MNIST_P, 4, name) == pytest.approx(seconds, rel=1e-7)
    assert parse_network(name) is PROFILES[name]


def test_profile_numbers() -> None:
    assert PROFILES["datacenter"].up_bps == 200e9 and PROFILES["datacenter"].latency_s == 1e-5
    assert PROFILES["home-100mbps"].up_bps == 100e6
    assert PROFILES["home-100mbps"].latency_s == 0.02
    assert PROFILES["cloud-10g"].up_bps == 10e9
    mobile = PROFILES["mobile"]
    assert (mobile.up_bps, mobile.down_bps) == (10e6, 50e6)
    assert all(p.description for p in PROFILES.values())
    # the seed's sync of a 7B fp16 model (14 GB = 112 Gbit): 0.56 s and 1,120 s = 18.7 min
    assert 8 * 14e9 / PROFILES["datacenter"].up_bps == pytest.approx(0.56, rel=1e-12)
    assert 8 * 14e9 / PROFILES["home-100mbps"].up_bps == pytest.approx(1120.0, rel=1e-12)


def test_mobile_star_broadcast_is_bound_by_the_uplink() -> None:
    # source uplink 10 Mbit/s carries 3 copies of 1 MB: 3 * 8e6 / (1e7 EFF) = 2.564088 s (each
    # receiver's downlink needs only 8e6 / (5e7 EFF) = 0.17 s), + 50 ms + 150 us = 2.614238 s
    assert collective_time("broadcast", S, 4, "mobile") == pytest.approx(2.614238, abs=1e-6)


# -- heterogeneity ---------------------------------------------------------------------------------
def test_slowest_link_bounds_the_ring() -> None:
    # node 2 at 4 Mbit/s = 0.5 MB/s: ring 6 * (0.25 / 0.5 / EFF + 0.001 + HOP) = 6 * (0.534185
    # + 0.00115) = 3.212010
    net = parse_network("bw=8Mbps,latency=1ms,node_bw=8Mbps:8Mbps:4Mbps:8Mbps")
    assert net.node_bandwidths(4) == ((8e6, 8e6, 4e6, 8e6), (8e6, 8e6, 4e6, 8e6))
    assert net.collective_time("all_reduce", S, 4) == pytest.approx(3.212010, abs=1e-6)


def test_star_all_reduce_depends_on_the_server() -> None:
    # Server (node 0) fast, node 2 slow: push max(3 * 1 s, 1 MB at 0.5 MB/s = 2 s) / EFF + 1 ms
    # + HOP, pull the same: 2 * (3.205110 + 0.00115) = 6.412521. Slow server: push max(3 * 2 s,
    # 1 s) / EFF + 1.15 ms = 6.411371, x 2 = 12.822742.
    fast = parse_network("bw=8Mbps,latency=1ms,all_reduce=star,node_bw=8Mbps:8Mbps:4Mbps:8Mbps")
    slow = parse_network("bw=8Mbps,latency=1ms,all_reduce=star,node_bw=4Mbps:8Mbps:8Mbps:8Mbps")
    assert fast.collective_time("all_reduce", S, 4) == pytest.approx(6.412521, abs=1e-6)
    assert slow.collective_time("all_reduce", S, 4) == pytest.approx(12.822742, abs=1e-6)


def test_random_heterogeneity_is_seeded_log_normal() -> None:
    net = parse_network("home-100mbps,bw_sigma=0.5,speed_sigma=0.2,seed=3")
    up, down = net.node_bandwidths(5)
    z_bw = torch.randn(5, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    z_speed = torch.randn(5, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    assert up == down == pytest.approx([100e6 * math.exp(0.5 * z) for z in z_bw.tolist()])
    assert net.node_speeds(5) == pytest.approx([math.exp(0.2 * z) for z in z_speed.tolist()])
    assert net.node_speeds(5) == parse_network(net.spec()).node_speeds(5)  # reproducible
    other = parse_network("home-100mbps,bw_sigma=0.5,speed_sigma=0.2,seed=4")
    assert other.node_bandwidths(5) != (up, down)
    state = torch.get_rng_state()
    net.node_speeds(5)
    assert torch.equal(state, torch.get_rng_state())  # never the global RNG


# -- specs -----------------------------------------------------------------------------------------
def test_calibration_keys_in_specs_and_descriptions() -> None:
    net = parse_network("home-100mbps,efficiency=0.9,hop_latency=50us")
    assert (net.efficiency, net.name) == (0.9, "home-100mbps+")
    assert net.hop_latency_s == pytest.approx(50e-6, rel=1e-15)
    assert net.describe() == ("100 Mbit/s, 20 ms, ring all-reduce, efficiency 90%, "
                              "hop latency 50 us")
    assert "efficiency=0.9," in net.spec() and "hop_latency=" in net.spec()
    assert net.to_dict()["efficiency"] == 0.9
    assert net.to_dict()["hop_latency_s"] == net.hop_latency_s
    # the defaults are not spelled out: a profile stays its name, its description unchanged
    home = PROFILES["home-100mbps"]
    assert home.spec() == "home-100mbps"
    assert home.describe() == "100 Mbit/s, 20 ms, ring all-reduce"
    assert "efficiency" not in parse_network("bw=1Gbps,latency=5ms").spec()


def test_parse_custom_network() -> None:
    net = parse_network("bw=1Gbps,latency=5ms")
    assert (net.name, net.up_bps, net.down_bps, net.latency_s) == ("custom", 1e9, 1e9, 0.005)
    asym = parse_network("up=10Mbps,down=1.5GB/s,latency=20ms,all_reduce=tree,broadcast=tree")
    assert (asym.up_bps, asym.down_bps, asym.all_reduce, asym.broadcast) == (
        10e6, 12e9, "tree", "tree")
    changed = parse_network("home-100mbps,latency=50ms")
    assert (changed.up_bps, changed.latency_s, changed.name) == (100e6, 0.05, "home-100mbps+")
    assert parse_network(None) is PROFILES["datacenter"]
    assert parse_network(net) is net


@pytest.mark.parametrize(
    "spec",
    ["home-100mbps", "bw=1Gbps,latency=5ms", "mobile,latency=80ms",
     "up=10Mbps,down=20Mbps,latency=1ms,all_reduce=star,node_speed=1:0.5",
     "cloud-10g,node_bw=1Gbps:2Gbps,seed=4", "datacenter,speed_sigma=0.3,seed=9",
     "home-100mbps,efficiency=0.9,hop_latency=50us", "bw=1Gbps,efficiency=1,hop_latency=0s",
     "home-100mbps,server=1Gbps", "bw=1Gbps,topology=server,server=1.23456789Gbps"],
)
def test_spec_round_trips(spec: str) -> None:
    net = parse_network(spec)
    again = parse_network(net.spec())
    assert again.to_dict() | {"description": ""} == net.to_dict() | {"description": ""}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("home-10mbps", "unknown network profile 'home-10mbps'; profiles: datacenter"),
        ("bw=1Gbps,lat=5ms", "unknown network key 'lat'"),
        ("latency=5ms", "needs a bandwidth"),
        ("bw=1Gbps,latency=5", "network latency=5: a duration needs a unit"),
        ("bw=1Gbit,latency=5ms", "unknown bandwidth unit 'Gbit'"),
        ("bw=1Gbps,all_reduce=butterfly", "all_reduce algorithm must be one of ('ring', 'tree'"),
        ("bw=1Gbps,all_gather=tree", "all_gather algorithm must be one of ('ring',)"),
        ("home-100mbps,node_bw=1Gbps:1Gbps,bw_sigma=0.5", "not both"),
        ("home-100mbps,node_speed=1:0:1", "node_speed must be a non-empty list of numbers > 0"),
        ("home-100mbps,node_speed=fast", "node_speed takes a plain number"),
        ("home-100mbps,bw_sigma=-1", "bw_sigma must be a number >= 0"),
        ("home-100mbps,seed=x", "seed takes an integer"),
        ("home-100mbps,latency", "expected key=value"),
        ("home-100mbps,efficiency=1.2", "efficiency must be a number in (0, 1]"),
        ("home-100mbps,efficiency=0", "efficiency must be a number in (0, 1]"),
        ("home-100mbps,efficiency=high", "efficiency takes a plain number, got 'high'"),
        ("home-100mbps,hop_latency=50", "network hop_latency=50: a duration needs a unit"),
        ("home-100mbps,hop_latency=-1us", "a duration must be >= 0"),
        ("", "a network is a profile name"),
    ],
)
def test_bad_network_specs(spec: str, message: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_network(spec)
    assert message in str(err.value)


def test_bad_network_fields_and_calls() -> None:
    with pytest.raises(ValueError, match="up_bps must be a number > 0"):
        Network(up_bps=0)
    with pytest.raises(ValueError, match="latency_s must be a number >= 0"):
        Network(up_bps=1e9, latency_s=-1)
    with pytest.raises(ValueError, match=r"efficiency must be a number in \(0, 1\].*got True"):
        Network(up_bps=1e9, efficiency=True)
    with pytest.raises(ValueError, match=r"hop_latency_s must be a number >= 0 \(seconds\), got "):
        Network(up_bps=1e9, hop_latency_s=math.inf)
    net = parse_network("home-100mbps,node_speed=1:1:0.5")
    with pytest.raises(ValueError, match="node_speed lists 3 nodes but the run has 4"):
        net.node_speeds(4)
    with pytest.raises(ValueError, match="unknown collective 'reduce_scatter'"):
        net.collective_time("reduce_scatter", 10, 3)
    with pytest.raises(ValueError, match="num_nodes must be an integer >= 1"):
        net.collective_time("all_reduce", 10, 0)
    with pytest.raises(ValueError, match="payload_bytes must be >= 0"):
        net.collective_time("all_reduce", -1, 2)


# -- a misspelled profile or key: parse_network names the closest (the CLI, sweeps, the API) ------
@pytest.mark.parametrize(
    ("spec", "hint"),
    [
        ("home-100mb", " (did you mean 'home-100mbps'?)"),
        ("Datacenter", " (did you mean 'datacenter'?)"),
        ("cloud-10gb,latency=5ms", " (did you mean 'cloud-10g'?)"),
        ("home-100mbps,latncy=50ms", " (did you mean 'latency'?)"),
        ("bw=1Gbps,node_sped=1:2", " (did you mean 'node_speed'?)"),
        ("dialup", ""),  # nothing close: no guess, the list of profiles only
        ("bw=1Gbps,colour=red", ""),
    ],
)
def test_a_misspelled_profile_or_key_names_the_closest(spec: str, hint: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_network(spec)
    message = str(err.value)
    assert message.startswith("unknown network ")
    if hint:
        assert message.endswith(hint)
    else:
        assert "did you mean" not in message


def test_a_sweeps_misspelled_network_names_the_closest(tmp_path: Path) -> None:
    """A grid's ``network=`` values are parsed by parse_network before anything trains."""
    from exogym.lab.sweep import parse_grid, sweep
    from exogym.utils.config import ConfigError

    with pytest.raises(ConfigError) as err:
        sweep("mnist", "diloco", parse_grid(["network=datacenter,home-100mb"]),
              out_dir=tmp_path / "sweep", max_steps=2)
    assert str(err.value).startswith("grid point p001 (network=home-100mb): unknown network "
                                     "profile 'home-100mb'")
    assert str(err.value).endswith(" (did you mean 'home-100mbps'?)")
    assert not (tmp_path / "sweep").exists()
