"""``exogym calibrate``: the fit against synthetic measurements with known parameters, network
files, the size plan, and the command on real local processes."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import pytest
from support.scripts import load_script

from exogym.cli import main
from exogym.run.dist.calibrate import FIRST_BYTES, CalibrateOptions, next_size
from exogym.sim.calibration import STREAM_EFFICIENCY, Sample, fit_line, fit_network
from exogym.sim.network import (
    Network,
    load_network_file,
    parse_network,
    write_network_file,
)

SIZES = (4, 65536, 262144, 1048576, 4194304)


def synthetic(up: list[float], down: list[float], efficiency: float, hop_s: float,
              message_s: float, noise: float = 0.0, seed: int = 0, ramp_s: float = 0.0,
              ramp_bytes: float = 0.0) -> list[Sample]:
    """Samples the model would measure: ping-pongs ``8S / (p min(up_i, down_j)) + 2 m`` and
    ring all-reduces of a per-node network with ``efficiency`` and per-hop ``hop_s``; each
    repeat times ``1 + noise * z``."""
    rng = random.Random(seed)
    n = len(up)

    def reps(t: float) -> tuple[float, ...]:
        return tuple(t * (1 + noise * rng.gauss(0, 1)) for _ in range(5))

    out = []
    for i in range(n):
        for j in range(n):
            if i != j:
                for s in SIZES:
                    t = 8 * s / (STREAM_EFFICIENCY * min(up[i], down[j])) + 2 * message_s
                    out.append(Sample("pingpong", n, s, reps(t), i, j))
    truth = Network(up_bps=1.0, node_up_bps=tuple(up), node_down_bps=tuple(down),
                    efficiency=efficiency, latency_s=hop_s, hop_latency_s=0.0, ramp_s=ramp_s,
                    ramp_bytes=ramp_bytes)
    for s in SIZES:
        out.append(Sample("all_reduce", n, s, reps(truth.collective_time("all_reduce", s, n))))
    return out


# -- the line --------------------------------------------------------------------------------------
def test_fit_line_recovers_an_exact_line():
    line = fit_line([4, 1000, 4000, 16000], [2e-4 + 8e-6 * x for x in (4, 1000, 4000, 16000)])
    assert line.slope == pytest.approx(8e-6, rel=1e-12)
    assert line.intercept == pytest.approx(2e-4, rel=1e-9)
    assert line.kept == (True, False, True, True)  # 1000: between the regimes, predicted


def test_fit_line_takes_the_rate_from_the_largest_sizes_and_the_latency_from_the_smallest():
    """A shaper's bucket lets the first bytes through at once: the middle sizes are faster
    than the line. The slope comes from the two largest sizes (4x apart), the intercept from
    the smallest; the middle is predicted, not fitted."""
    xs = [4, 65536, 262144, 1048576, 4194304]
    ts = [2e-4 + 8e-8 * x for x in xs]
    ts[1] *= 0.75
    ts[2] *= 0.9
    line = fit_line(xs, ts)
    assert line.slope == pytest.approx(8e-8, rel=1e-9)
    assert line.intercept == pytest.approx(2e-4, rel=1e-6)
    assert line.kept == (True, False, False, True, True)


def test_fit_line_median_intercept_and_robust_slope():
    # repeats of the smallest size: the median; three large sizes: Theil-Sen, one bad point
    # of three does not set the slope alone
    xs = [4, 4, 4, 1e6, 2e6, 4e6]
    ts = [1e-4, 5e-4, 1.2e-4, 1e-4 + 1.0, 1e-4 + 2.0 * 1.2, 1e-4 + 4.0]
    line = fit_line(xs, ts)
    assert line.slope == pytest.approx(1e-6, rel=1e-9)  # median of 1.4e-6, 1e-6, 0.8e-6
    assert line.intercept == pytest.approx(1.2e-4 - 4e-6, rel=1e-6)  # t - a x at 4 bytes


def test_fit_line_widens_when_the_two_largest_sizes_do_not_grow():
    # noise above the two largest sizes' difference (the same time): the slope is then every
    # size's but the smallest's, Theil-Sen: median(8e-6, 1.6e-6, 0) = 1.6e-6
    xs = [4, 1000, 4000, 16000]
    ts = [2e-4 + 8e-6 * x for x in (4, 1000, 4000)] + [2e-4 + 8e-6 * 4000]
    line = fit_line(xs, ts)
    assert line.slope == pytest.approx(1.6e-6, rel=1e-9)
    assert line.kept == (True, True, True, True)


def test_fit_line_needs_two_sizes():
    with pytest.raises(ValueError, match="2 or more different sizes"):
        fit_line([1000, 1000], [1.0, 1.1])


# -- the network fit -----------------------------------------------------------------------------
def test_fit_recovers_known_parameters_exactly():
    """Asymmetric links and a slow uplink in the ring (node 2, 10 Mbit/s): every parameter the
    measurements determine comes back (to the 6 significant digits the fit keeps)."""
    up, down = [20e6, 20e6, 10e6, 20e6], [20e6, 20e6, 25e6, 20e6]
    fit = fit_network(synthetic(up, down, efficiency=0.9, hop_s=120e-6, message_s=80e-6))
    net = fit.network
    assert net.node_up_bps == pytest.approx(up, rel=1e-6)
    # node 2's download (25) is above every peer's upload that reaches it (20): not observable,
    # the fit gives the fastest rate seen, the lower bound
    assert net.node_down_bps == pytest.approx([20e6, 20e6, 20e6, 20e6], rel=1e-6)
    assert net.efficiency == pytest.approx(0.9, rel=1e-6)
    assert net.latency_s == pytest.approx(80e-6, rel=1e-5)
    assert net.latency_s + net.hop_latency_s == pytest.approx(120e-6, rel=1e-6)
    assert fit.ring_rate_bps == pytest.approx(0.9 * 10e6, rel=1e-6)
    assert all(abs(r) < 1e-5 for _, _, r, _ in fit.residuals)


def test_fit_finds_a_ramp_that_large_transfers_pay():
    """BBR on low-delay links: every all-reduce of 1 MB or more pays a fixed 40 ms that small
    ones do not. The fit finds it, from the smaller of the two largest sizes, and the rate and
    latency stay the link's."""
    fit = fit_network(synthetic([20e6] * 2, [20e6] * 2, efficiency=0.936, hop_s=100e-6,
                                message_s=80e-6, ramp_s=0.04, ramp_bytes=1048576))
    net = fit.network
    assert net.ramp_s == pytest.approx(0.04, rel=1e-5)
    assert net.ramp_bytes == 1048576
    assert net.efficiency == pytest.approx(0.936, rel=1e-6)
    assert fit.hop_s == pytest.approx(100e-6, rel=1e-3)  # 4 bytes pay 4/1048576 of the ramp
    # 8 MB over 2 nodes: 8 MB / (0.936 x 20 Mbit/s) + 2 hops + the ramp, by hand
    assert net.collective_time("all_reduce", 8e6, 2) == pytest.approx(
        64e6 / (0.936 * 20e6) + 2e-4 + 0.04, rel=1e-5)
    assert "ramp 40 ms per collective from 1,048,576 B" in net.describe()
    # Reno/CUBIC-like measurements: no ramp
    plain = fit_network(synthetic([20e6] * 2, [20e6] * 2, efficiency=0.936, hop_s=100e-6,
                                  message_s=80e-6, noise=0.01))
    assert plain.network.ramp_s == 0.0 and plain.network.ramp_bytes == 0.0


def test_a_ramp_under_5_percent_of_a_large_transfer_is_not_kept():
    # 10 ms against the 1 MiB all-reduce's 0.45 s (2%): noise-sized, no ramp term
    fit = fit_network(synthetic([20e6] * 2, [20e6] * 2, efficiency=0.936, hop_s=100e-6,
                                message_s=80e-6, ramp_s=0.01, ramp_bytes=1048576))
    assert fit.network.ramp_s == 0.0 and fit.network.ramp_bytes == 0.0


def test_ramp_of_a_network_by_hand():
    net = parse_network("bw=20Mbps,latency=0s,ramp=40ms,ramp_bytes=1e6")
    assert net.ramp_time(0) == 0.0
    assert net.ramp_time(250e3) == pytest.approx(0.01)  # a quarter of ramp_bytes: a quarter
    assert net.ramp_time(8e6) == pytest.approx(0.04)
    bare = parse_network("bw=20Mbps,latency=0s")
    assert net.collective_time("all_reduce", 8e6, 4) == pytest.approx(
        bare.collective_time("all_reduce", 8e6, 4) + 0.04, rel=1e-12)
    assert parse_network(net.spec()) == net
    assert parse_network("bw=20Mbps,ramp=40ms").ramp_time(4) == pytest.approx(0.04)
    with pytest.raises(ValueError, match="ramp_s must be a number >= 0"):
        Network(up_bps=1e6, ramp_s=-1.0)


def test_fit_with_noise_and_an_outlier_stays_close():
    samples = synthetic([20e6] * 4, [20e6] * 4, efficiency=0.93, hop_s=150e-6,
                        message_s=100e-6, noise=0.01, seed=3)
    ring = [s for s in samples if s.op == "all_reduce"]
    bad = replace(ring[2], seconds=tuple(1.4 * t for t in ring[2].seconds))
    samples[samples.index(ring[2])] = bad  # a middle size 40% slow (cross traffic)
    fit = fit_network(samples)
    assert fit.network.node_up_bps is None  # uniform within 10%: one rate for all
    assert fit.network.up_bps == pytest.approx(20e6, rel=0.02)
    assert fit.network.efficiency == pytest.approx(0.93, rel=0.02)
    assert fit.hop_s == pytest.approx(150e-6, rel=0.03)
    unused = [s for s, _, _, used in fit.residuals if not used and s.op == "all_reduce"]
    assert unused == [ring[1], bad]  # the middle sizes: predicted, not fitted
    assert [r for s, _, r, _ in fit.residuals if s is bad] == [pytest.approx(-1 / 3.5, abs=0.02)]


def test_one_rate_for_all_keeps_the_ring_rate_at_any_n():
    """Uniform links (one rate in the file): the ring's measured payload rate R and hop h
    price an all-reduce of any N, ``2(N-1)/N 8S/R + 2(N-1) h``."""
    fit = fit_network(synthetic([100e6] * 2, [100e6] * 2, efficiency=0.936, hop_s=90e-6,
                                message_s=60e-6))
    assert fit.network.node_up_bps is None
    s, n = 32e6, 64
    expected = 2 * (n - 1) / n * 8 * s / (0.936 * 100e6) + 2 * (n - 1) * 90e-6
    assert fit.network.collective_time("all_reduce", s, n) == pytest.approx(expected, rel=1e-5)


def test_per_node_can_be_forced_either_way():
    samples = synthetic([20e6, 10e6], [20e6, 20e6], efficiency=0.9, hop_s=1e-4, message_s=1e-4)
    assert fit_network(samples).network.node_up_bps is not None  # 2x apart: per node
    one = fit_network(samples, per_node=False).network
    assert one.node_up_bps is None
    assert one.up_bps == pytest.approx(15e6, rel=1e-6)  # the median of 20 and 10
    # the ring's time is the measured one either way
    assert one.collective_time("all_reduce", 1e6, 2) == pytest.approx(
        fit_network(samples, per_node=True).network.collective_time("all_reduce", 1e6, 2),
        rel=1e-5)
    uniform = synthetic([20e6] * 2, [20e6] * 2, efficiency=0.9, hop_s=1e-4, message_s=1e-4)
    assert fit_network(uniform, per_node=True).network.node_up_bps == pytest.approx(
        [20e6, 20e6], rel=1e-6)


def test_fit_refuses_incomplete_measurements():
    samples = synthetic([20e6] * 3, [20e6] * 3, efficiency=0.9, hop_s=1e-4, message_s=1e-4)
    with pytest.raises(ValueError, match=r"pairs \[\(2, 1\)\]"):
        fit_network([s for s in samples if (s.src, s.dst) != (2, 1)])
    with pytest.raises(ValueError, match="all-reduce must be measured at 2 or more sizes"):
        fit_network([s for s in samples if s.op == "pingpong" or s.payload_bytes == 4])
    other = Sample("all_reduce", 4, 100, (1.0,))
    with pytest.raises(ValueError, match=r"one run of N ranks, got N = \[3, 4\]"):
        fit_network([*samples, other])


@pytest.mark.parametrize("kwargs, match", [
    ({"op": "send"}, "op must be"),
    ({"nodes": 1}, "nodes must be an integer >= 2"),
    ({"seconds": (0.0,)}, "times > 0"),
    ({"src": 1, "dst": 1}, "two different ranks"),
    ({"src": 0, "dst": 5}, "two different ranks"),
])
def test_sample_validates(kwargs, match):
    base = {"op": "pingpong", "nodes": 2, "payload_bytes": 4, "seconds": (1e-4,), "src": 0,
            "dst": 1}
    with pytest.raises(ValueError, match=match):
        Sample(**{**base, **kwargs})


def test_sample_round_trips_through_a_dict():
    s = Sample("pingpong", 3, 65536, (0.1, 0.2), 2, 0)
    assert Sample.from_dict(json.loads(json.dumps(s.to_dict()))) == s


# -- network files ---------------------------------------------------------------------------------
def test_network_file_round_trips_and_is_a_network_spec(tmp_path: Path):
    fit = fit_network(synthetic([20e6, 10e6], [30e6, 20e6], efficiency=0.9, hop_s=1.2e-4,
                                message_s=8e-5, ramp_s=0.08, ramp_bytes=1048576), name="mine",
                      description="test")
    assert fit.network.ramp_s > 0
    path = write_network_file(tmp_path / "mine.json", fit.network,
                              {"calibration": fit.to_dict()})
    assert load_network_file(path) == fit.network
    assert parse_network(str(path)) == fit.network
    # a file plus changes, as a profile; its spec re-parses to the same network
    changed = parse_network(f"{path},latency=20ms")
    assert changed.latency_s == 0.02 and changed.node_up_bps == fit.network.node_up_bps
    assert parse_network(fit.network.spec()) == replace(fit.network, description="")
    data = json.loads(path.read_text())
    assert len(data["calibration"]["samples"]) == len(fit.residuals)


@pytest.mark.parametrize("content, match", [
    (None, "does not exist"),
    ("{not json", "could not be read as JSON"),
    ('{"format": "other"}', "is not a network file"),
    ('{"format": "exogym-network", "version": 9, "network": {}}', "has version 9"),
    ('{"format": "exogym-network", "version": 1, "network": {"up_bps": 1e6, "bw": 2}}',
     r"unknown fields \['bw'\]"),
    ('{"format": "exogym-network", "version": 1, "network": {"up_bps": -1}}',
     "up_bps must be a number > 0"),
])
def test_bad_network_files_are_named(tmp_path: Path, content, match):
    path = tmp_path / "net.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ValueError, match=match):
        parse_network(str(path))


def test_write_network_file_refuses_clashing_extra_keys(tmp_path: Path):
    with pytest.raises(ValueError, match="overwrite"):
        write_network_file(tmp_path / "n.json", Network(up_bps=1e6), {"network": 1})


# -- measuring ---------------------------------------------------------------------------------
def test_sizes_grow_to_the_target_time():
    opts = CalibrateOptions(target_s=0.5)
    assert next_size([], 0.0, opts) == 4
    assert next_size([4], 1e-4, opts) == FIRST_BYTES
    # always two sizes above 4 bytes, however slow
    assert next_size([4, FIRST_BYTES], 9.0, opts) == 4 * FIRST_BYTES
    # then x4 while the next is predicted within the target: 0.1 s -> 0.4 s <= 0.5
    assert next_size([4, FIRST_BYTES, 4 * FIRST_BYTES], 0.1, opts) == 16 * FIRST_BYTES
    assert next_size([4, FIRST_BYTES, 4 * FIRST_BYTES], 0.13, opts) is None  # 0.52 s
    # and within max_bytes
    small = CalibrateOptions(max_bytes=1_000_000)
    assert next_size([4, FIRST_BYTES, 4 * FIRST_BYTES], 1e-6, small) is None


@pytest.mark.parametrize("kwargs, match", [
    ({"reps": 0}, "reps"), ({"target_s": 0}, "target_s"), ({"max_bytes": 10}, "max_bytes")])
def test_calibrate_options_validate(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CalibrateOptions(**kwargs)


def test_calibrate_needs_torchrun_or_the_process_engine(tmp_path: Path, capsys):
    assert main(["calibrate", "--out", str(tmp_path / "n.json")]) == 2
    assert "--engine process" in capsys.readouterr().err


def test_calibrate_command_on_local_processes(tmp_path: Path, capsys):
    """The real command, 2 processes over loopback (unshaped: the numbers are this machine's,
    only their shape is checked): it prints the fit and writes a file --network accepts."""
    out = tmp_path / "loop.json"
    assert main(["calibrate", "--engine", "process", "--nodes", "2", "--reps", "3",
                 "--target-time", "0.3s", "--max-size", "20000000", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "fitted network:" in text and "0 -> 1" in text and "1 -> 0" in text
    assert "worst residual" in text and f"wrote {out}" in text
    net = parse_network(str(out))
    assert net.name == "calibrated" and 0 < net.efficiency <= 1
    data = json.loads(out.read_text())["calibration"]
    assert [r["rank"] for r in data["ranks"]] == [0, 1]
    assert data["sizes"][:3] == [4, FIRST_BYTES, 4 * FIRST_BYTES]
    assert data["sizes"][-1] <= 20_000_000
    kinds = {(s["op"], s["src"], s["dst"]) for s in data["samples"]}
    assert kinds == {("all_reduce", None, None), ("pingpong", 0, 1), ("pingpong", 1, 0)}
    assert all(len(s["seconds"]) == (30 if s["payload_bytes"] == 4 else 3)
               for s in data["samples"])


# -- the harness's calibrated predictions (bench/clock_fidelity.py, pure parts) ----------------
def _harness() -> ModuleType:
    """bench/clock_fidelity.py, as test_clock_fidelity.py loads it."""
    return load_script("bench/clock_fidelity.py")


def test_harness_table_gains_the_calibrated_columns():
    cf = _harness()
    row = cf.Row("all_reduce", "8 MB", 2, 20e6, real_s=4.0, before_s=3.2, after_s=3.9,
                 calibrated_s=4.3)
    assert row.error_calibrated == pytest.approx(0.075)
    lines = cf.format_table([row], 0.05).splitlines()
    assert lines[0].endswith("| after | err | calibrated | err | notes |")
    assert lines[2] == ("| all_reduce 8 MB | 2 | 20 Mbit/s | 4.000 s | 3.200 s | -20.0% "
                        "| 3.900 s | -2.5% | 4.300 s | +7.5% ! |  |")
    plain = cf.Row("ddp", "x", 2, 20e6, real_s=1.0, before_s=1.0, after_s=1.0)
    assert plain.error_calibrated is None and "calibrated" not in cf.format_table([plain])


def test_harness_names_how_to_allow_a_congestion_control():
    cf = _harness()
    assert cf.cc_problem("bbr", "reno bbr\n", "reno bbr cubic\n") is None
    assert cf.cc_problem(None, "reno", "reno") is None
    assert 'tcp_allowed_congestion_control="reno bbr cubic"' in cf.cc_problem(
        "cubic", "reno bbr\n", "reno bbr cubic\n")
    assert "modprobe tcp_vegas" in cf.cc_problem("vegas", "reno bbr", "reno bbr cubic")
