"""``exogym estimate``: the seed's arithmetic (shared/seeds/002) reproduced exactly, and more."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from exogym.cli import main
from exogym.lab.estimate import estimate, parse_count, sweep

SEED = {"params": 7e9, "dtype": "fp16", "num_nodes": 2, "batches": 1000, "compute_s": 60.0}
MIN = 60.0
# The all-reduce mode is the network's calibrated clock (exogym.sim.network): links carry payload
# at 1448 / 1547 = 0.936005 of their rate, and every latency term gains 150 us per hop. The send-
# once mode is the post's bare arithmetic, 8S/B, and keeps its numbers exactly.
EFF = 1448 / 1547
HOP = 150e-6


def rows(text: str) -> dict[str, str]:
    """Scenario rows of the table, keyed by 'scenario network'."""
    out = {}
    for line in text.splitlines():
        parts = line.split("  ")
        parts = [p.strip() for p in parts if p.strip()]
        if parts and (parts[0] in ("single node", "ddp") or parts[0].startswith("diloco")):
            out[f"{parts[0]} {parts[1]}"] = line
    return out


def test_seed_arithmetic_exactly() -> None:
    # 7e9 params x 2 bytes = 14e9 B = 112e9 bit: 112e9 / 200e9 = 0.56 s, / 100e6 = 1,120 s
    dc = estimate(**SEED, network="datacenter", strategy="ddp")
    home = estimate(**SEED, network="home-100mbps", strategy="ddp")
    assert dc.payload_bytes == 14e9
    assert dc.once_sync_s == pytest.approx(0.56, rel=1e-12)
    assert home.once_sync_s == pytest.approx(1120.0, rel=1e-12)  # 18.67 min ("~20 minutes")
    assert dc.single_node_s == 1000 * MIN  # 1,000 minutes on one GPU
    assert (dc.steps, dc.syncs) == (500, 500)  # 1,000 batches split over 2 GPUs
    # total = steps x (compute + sync): 500 x (60 + 0.56) s = 504.67 min (the seed's "505")
    assert dc.once_total_s / MIN == pytest.approx(500 * (1 + 0.56 / 60), rel=1e-12)
    assert round(dc.once_total_s / MIN) == 505
    # home internet, exact sync: 500 x (1 + 18.667) min = 9,833.3 min
    assert home.once_total_s / MIN == pytest.approx(500 * (1 + 1120 / 60), rel=1e-12)
    assert round(home.once_total_s / MIN) == 9833
    # the seed's rounded 20-minute sync: 500 x 21 = 10,500 minutes exactly
    seed_home = estimate(**SEED, network="home-100mbps", strategy="ddp", sync_time_s=20 * MIN)
    assert seed_home.once_total_s == 10_500 * MIN
    # DiLoCo H = 500 syncs once: 500 + 20 = 520 minutes exactly; 500 + 18.67 = 518.7 (~519)
    diloco = estimate(**SEED, network="home-100mbps", strategy="diloco", H=500,
                      sync_time_s=20 * MIN)
    assert diloco.syncs == 1 and diloco.once_total_s == 520 * MIN
    exact = estimate(**SEED, network="home-100mbps", strategy="diloco", H=500)
    assert exact.once_total_s / MIN == pytest.approx(500 + 1120 / 60, rel=1e-12)
    assert round(exact.once_total_s / MIN) == 519
    # ring all-reduce with N = 2 sends S once (2(N-1)/N = 1) at the payload rate and adds 2(N-1)
    # latencies: 1120 / 0.936005 + 2 * (0.02 + 150e-6) = 1196.574586 + 0.0403 = 1196.614886 s
    assert home.all_reduce_sync_s == pytest.approx(1120 / EFF + 2 * (0.02 + HOP), rel=1e-12)
    assert home.all_reduce_sync_s == pytest.approx(1196.614886, abs=1e-6)
    assert home.all_reduce_bytes == 500 * 14e9
    assert home.once_speedup == pytest.approx(1000 / (500 * (1 + 1120 / 60)))


def test_estimate_prints_the_seed_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate"]) == 0  # the defaults are the seed's example
    text = capsys.readouterr().out
    assert "14.00 GB = 112 Gbit per copy" in text
    assert "1,000 batches x 1 min on 2 nodes = 500 steps per node" in text
    table = rows(text)
    assert "1,000 min (16.7 h)" in table["single node -"]
    assert "505 min (8.4 h)" in table["ddp datacenter"]
    assert "9,833 min (6.8 days)" in table["ddp home-100mbps"]
    assert "0.10x no" in table["ddp home-100mbps"]
    assert "519 min (8.6 h)" in table["diloco H=500 home-100mbps"]
    assert "1.93x yes" in table["diloco H=500 home-100mbps"]
    sync = {line.split()[0]: line for line in text.splitlines() if "(ring)" in line}
    assert "0.56 s" in sync["datacenter"] and "18.7 min" in sync["home-100mbps"]

    assert main(["estimate", "--sync-time", "home-100mbps=20min"]) == 0
    text = capsys.readouterr().out
    table = rows(text)
    assert "10,500 min (7.3 days)" in table["ddp home-100mbps"]  # the seed's table, exactly
    assert "520 min (8.7 h)" in table["diloco H=500 home-100mbps"]
    assert "505 min (8.4 h)" in table["ddp datacenter"]  # the data centre keeps its 0.56 s
    assert "20 min (given)" in text
    # beside it, the ring all-reduce mode is still the network's: 500 x (60 + 1196.6149) s =
    # 10,471.8 min
    assert "10,472 min (7.3 days)" in table["ddp home-100mbps"]


def test_sweep_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", "--sweep", "H=1,10,100,500"]) == 0
    lines = capsys.readouterr().out.splitlines()
    body = {line.split()[0]: line for line in lines[2:]}
    assert set(body) == {"1", "10", "100", "500"}
    # H = 10, home: 500 min + 50 syncs x 18.67 min = 1,433.3 min
    assert "1,433 min (23.9 h)" in body["10"]
    # H = 100: 500 + 5 x 18.67 = 593.3 min
    assert "593 min (9.9 h)" in body["100"]
    assert "519 min (8.6 h)" in body["500"] and "9,833 min" in body["1"]
    got = sweep("H", [1, 10], **SEED, network="home-100mbps", strategy="diloco")
    assert [e.syncs for e in got] == [500, 50]


def test_nodes_sweep_and_the_ring_mode() -> None:
    # N = 4, 1,000 batches: 250 steps; H = 50: 5 syncs. Ring all-reduce on home-100mbps:
    # 2 * 3/4 * 112e9 / (1e8 EFF) + 6 * (0.02 + HOP) = 1,794.861878 + 0.1209 = 1,794.982778 s;
    # send once: 1,120 s.
    e4, e2 = sweep("num_nodes", [4, 2], **{**SEED, "num_nodes": 1}, network="home-100mbps",
                   strategy="diloco", H=50)
    assert (e4.steps, e4.syncs) == (250, 5)
    ring = 1680 / EFF + 6 * (0.02 + HOP)
    assert ring == pytest.approx(1794.982778, abs=1e-6)
    assert e4.all_reduce_sync_s == pytest.approx(ring, rel=1e-12)
    assert e4.all_reduce_total_s == pytest.approx(250 * 60 + 5 * ring, rel=1e-12)
    assert e4.once_total_s == pytest.approx(250 * 60 + 5 * 1120, rel=1e-12)
    assert e4.all_reduce_bytes == pytest.approx(5 * 1.5 * 14e9)
    assert e4.utilization == pytest.approx(250 * 60 / (250 * 60 + 5 * ring))
    assert (e2.steps, e2.syncs) == (500, 10)


def test_codec_and_dtype_change_the_payload() -> None:
    # int8 on 7e9 parameters: one byte each plus one fp32 scale = 7e9 + 4 bytes
    e = estimate(**{**SEED, "dtype": "fp32"}, codec="int8", network="datacenter", strategy="ddp")
    assert e.payload_bytes == 7e9 + 4
    assert estimate(**{**SEED, "dtype": "fp32"}, network="datacenter").payload_bytes == 28e9
    # top-k 1%: 7e7 values of 2 bytes + 7e7 int32 indices = 4.2e8 bytes, sent as an all-gather:
    # (N-1) S per node per sync; with N = 4, 3 x 4.2e8
    k = estimate(**{**SEED, "num_nodes": 4}, codec="topk:0.01", network="home-100mbps",
                 strategy="ddp")
    assert k.payload_bytes == pytest.approx(4.2e8)
    assert k.all_reduce_bytes == pytest.approx(k.syncs * 3 * 4.2e8)
    # ring all-gather: (N-1)(8S/(EFF B) + L + HOP) = 3 * (35.897238 + 0.02015) = 107.752163 s
    assert k.all_reduce_sync_s == pytest.approx(3 * (8 * 4.2e8 / (1e8 * EFF) + 0.02 + HOP),
                                                rel=1e-12)
    assert k.all_reduce_sync_s == pytest.approx(107.752163, abs=1e-6)


def test_parse_count() -> None:
    assert parse_count("7e9") == 7e9 and parse_count("7B") == 7e9
    assert parse_count("124M") == 124e6 and parse_count("1.5T") == 1.5e12
    with pytest.raises(ValueError, match="expected a count such as 7e9"):
        parse_count("seven")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--strategy", "sparta"], "invalid choice: 'sparta'"),
        (["--dtype", "fp12"], "invalid choice: 'fp12'"),
        (["--compute-time", "1"], "a duration needs a unit: '1'"),
        (["--network", "dialup"], "unknown network profile 'dialup'"),
        (["--sync-time", "dialup=20min"], "--sync-time names network 'dialup'"),
        (["--sweep", "K=1,2"], "expected H=1,10,100 or nodes=2,4,8"),
        (["--sweep", "H=1,10", "--strategy", "ddp"], "sweep H with diloco or fedavg"),
        (["--codec", "int3"], "unknown codec 'int3'"),
        (["--params", "0"], "expected a count > 0"),
    ],
)
def test_bad_estimate_input(args: list[str], message: str,
                            capsys: pytest.CaptureFixture[str]) -> None:
    try:
        rc = main(["estimate", *args])
    except SystemExit as exit_:  # argparse errors
        rc = exit_.code
    assert rc == 2
    assert message in capsys.readouterr().err


def test_estimate_api_errors() -> None:
    with pytest.raises(ValueError, match="ddp synchronises every step"):
        estimate(**SEED, strategy="ddp", H=10)
    with pytest.raises(ValueError, match="diloco needs H"):
        estimate(**SEED, strategy="diloco")
    with pytest.raises(ValueError, match="strategy must be one of ddp, diloco, fedavg"):
        estimate(**SEED, strategy="demo")
    with pytest.raises(ValueError, match="dtype must be one of"):
        estimate(**{**SEED, "dtype": "fp12"})


def test_plot_needs_matplotlib(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    assert main(["estimate", "--plot", str(tmp_path / "x.png")]) == 2
    captured = capsys.readouterr()
    assert 'pip install "matplotlib>=3.7"' in captured.err and captured.out == ""
    assert not (tmp_path / "x.png").exists()


def test_plot_writes_a_png_titled_with_what_it_estimates(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    import exogym.lab.estimate as est

    titles: list[str] = []
    plot = est.plot_estimates
    monkeypatch.setattr(est, "plot_estimates",
                        lambda *a, **kw: (titles.append(a[4]), plot(*a, **kw))[1])
    for args, name in ((["--sweep", "H=1,10,100,500", "--network", "home-100mbps"],
                        "sweep.png"), ([], "bars.png")):
        path = tmp_path / name
        assert main(["estimate", *args, "--plot", str(path)]) == 0
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "plot" in capsys.readouterr().out
    assert titles[0] == ("7,000,000,000 parameters (fp16 on the wire), 1,000 batches, 2 nodes, "
                         "diloco, on home-100mbps")
    assert titles[1].startswith("7,000,000,000 parameters (fp16 on the wire), 1,000 batches, ")
