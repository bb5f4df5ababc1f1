"""The clock-fidelity harness (bench/clock_fidelity.py): its commands, parsers and arithmetic,
checked without root; no namespace, link or qdisc is created here."""

from __future__ import annotations

import math

import pytest
from support.scripts import load_script

from exogym.sim.network import parse_network

cf = load_script("bench/clock_fidelity.py")
TOPO = cf.Topology("1a2b", 2)


# -- names and commands ----------------------------------------------------------------------------
def test_names_carry_the_prefix_and_tag() -> None:
    assert TOPO.bridge == "exg-1a2b-br"
    assert [TOPO.namespace(i) for i in range(2)] == ["exg-1a2b-n0", "exg-1a2b-n1"]
    assert TOPO.host_veth(1) == "exg-1a2b-h1"
    assert [TOPO.address(i) for i in range(2)] == ["10.213.47.1", "10.213.47.2"]
    # interface names are limited to 15 characters (IFNAMSIZ - 1), even at 200 nodes
    assert len(cf.Topology("ffff", 200).host_veth(199)) == len("exg-ffff-h199") == 13


@pytest.mark.parametrize(("tag", "n", "message"), [
    ("1A2B", 2, "tag must be 4 lower-case hex digits, got '1A2B'"),
    ("12345", 2, "tag must be 4 lower-case hex digits"),
    ("1a2b", 0, "num_nodes must be an integer in [1, 200], got 0"),
    ("1a2b", True, "num_nodes must be an integer in [1, 200], got True"),
])
def test_bad_topology(tag: str, n: int, message: str) -> None:
    with pytest.raises(ValueError) as err:
        cf.Topology(tag, n)
    assert message in str(err.value)


def test_setup_commands() -> None:
    ns0, ns1 = "exg-1a2b-n0", "exg-1a2b-n1"
    assert cf.setup_commands(TOPO) == [
        ["ip", "link", "add", "exg-1a2b-br", "type", "bridge"],
        ["ip", "link", "set", "exg-1a2b-br", "up"],
        ["ip", "netns", "add", ns0],
        ["ip", "link", "add", "exg-1a2b-h0", "type", "veth", "peer", "name", "exg0", "netns", ns0],
        ["ip", "link", "set", "exg-1a2b-h0", "master", "exg-1a2b-br"],
        ["ip", "link", "set", "exg-1a2b-h0", "up"],
        ["ip", "-n", ns0, "addr", "add", "10.213.47.1/24", "dev", "exg0"],
        ["ip", "-n", ns0, "link", "set", "exg0", "up"],
        ["ip", "-n", ns0, "link", "set", "lo", "up"],
        ["ip", "netns", "add", ns1],
        ["ip", "link", "add", "exg-1a2b-h1", "type", "veth", "peer", "name", "exg0", "netns", ns1],
        ["ip", "link", "set", "exg-1a2b-h1", "master", "exg-1a2b-br"],
        ["ip", "link", "set", "exg-1a2b-h1", "up"],
        ["ip", "-n", ns1, "addr", "add", "10.213.47.2/24", "dev", "exg0"],
        ["ip", "-n", ns1, "link", "set", "exg0", "up"],
        ["ip", "-n", ns1, "link", "set", "lo", "up"],
    ]


def test_teardown_deletes_every_name_the_setup_creates() -> None:
    topo = cf.Topology("00ff", 4)
    created = set()
    for cmd in cf.setup_commands(topo):
        if cmd[:3] in (["ip", "link", "add"], ["ip", "netns", "add"]):
            created.add(cmd[3])
    assert created == {"exg-00ff-br", *(f"exg-00ff-n{i}" for i in range(4)),
                       *(f"exg-00ff-h{i}" for i in range(4))}
    deleted = [cmd[3] for cmd in cf.teardown_commands(topo)]
    assert set(deleted) == created
    assert deleted[-1] == "exg-00ff-br"  # the bridge after its ports
    # ("exg0" lives inside a namespace and goes with it; nothing outside the prefix is named)
    assert all(name.startswith("exg-") for name in created)


def test_tbf_args() -> None:
    # 20 Mbit/s: bucket 2 ms = 20e6 * 0.002 / 8 = 5,000 bytes; queue 50 ms = 125,000 bytes
    assert cf.tbf_args(20e6) == ["rate", "20000000bit", "burst", "5000", "limit", "125000"]
    # 100 Mbit/s: 25,000 and 625,000 bytes
    assert cf.tbf_args(100e6) == ["rate", "100000000bit", "burst", "25000", "limit", "625000"]
    # 1 Mbit/s: 2 ms is 250 bytes, less than two 1514-byte frames (3,028); the queue (6,250)
    # is raised to 4 buckets, 12,112 bytes
    assert cf.tbf_args(1e6) == ["rate", "1000000bit", "burst", "3028", "limit", "12112"]
    assert cf.tbf_args(20e6, burst_s=0.01, queue_s=0.2)[3::2] == ["25000", "500000"]
    with pytest.raises(ValueError, match="rate_bps must be a number > 0, got 0"):
        cf.tbf_args(0)
    with pytest.raises(ValueError, match="rate_bps must be a number > 0, got nan"):
        cf.tbf_args(math.nan)
    with pytest.raises(ValueError, match="queue_s must be a number of seconds >= 0, got -1"):
        cf.tbf_args(1e6, queue_s=-1)


def test_shaping_both_directions_of_every_link() -> None:
    tbf = ["tbf", "rate", "20000000bit", "burst", "5000", "limit", "125000"]
    assert cf.shaping_commands(TOPO, 20e6) == [
        ["ip", "netns", "exec", "exg-1a2b-n0", "tc", "qdisc", "replace", "dev", "exg0", "root",
         *tbf],  # node 0's upload
        ["tc", "qdisc", "replace", "dev", "exg-1a2b-h0", "root", *tbf],  # node 0's download
        ["ip", "netns", "exec", "exg-1a2b-n1", "tc", "qdisc", "replace", "dev", "exg0", "root",
         *tbf],
        ["tc", "qdisc", "replace", "dev", "exg-1a2b-h1", "root", *tbf],
    ]
    assert cf.shaping_commands(TOPO, None)[:2] == [
        ["ip", "netns", "exec", "exg-1a2b-n0", "tc", "qdisc", "del", "dev", "exg0", "root"],
        ["tc", "qdisc", "del", "dev", "exg-1a2b-h0", "root"]]
    up, down = cf.stats_commands(TOPO, 1)
    assert up == ["ip", "netns", "exec", "exg-1a2b-n1", "tc", "-s", "qdisc", "show", "dev", "exg0"]
    assert down == ["tc", "-s", "qdisc", "show", "dev", "exg-1a2b-h1"]


def test_congestion_control_is_set_per_namespace() -> None:
    assert cf.cc_commands(TOPO, None) == []
    assert cf.cc_commands(TOPO, "reno") == [
        ["ip", "netns", "exec", f"exg-1a2b-n{i}", "sysctl", "-q", "-w",
         "net.ipv4.tcp_congestion_control=reno"] for i in range(2)]
    with pytest.raises(ValueError, match="lower-case name such as reno, cubic or bbr"):
        cf.cc_commands(TOPO, "reno; reboot")


def test_worker_environment() -> None:
    env = cf.worker_env(TOPO, 1, 2, base={"PATH": "/bin", "LOCAL_WORLD_SIZE": "2"}, cores=2)
    assert env == {"PATH": "/bin", "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0",
                   "LOCAL_WORLD_SIZE": "1",  # one machine per namespace: no shared-memory path
                   "MASTER_ADDR": "10.213.47.1", "MASTER_PORT": "29517",
                   "GLOO_SOCKET_IFNAME": "exg0", "OMP_NUM_THREADS": "1",
                   "PYTHONUNBUFFERED": "1", "EXOGYM_CORES": "1"}
    # the ranks' machines share the host's cores: half a core each for four ranks on two,
    # never more than the one thread a rank computes with
    assert [cf.worker_env(TOPO, 0, n, base={}, cores=2)["EXOGYM_CORES"]
            for n in (1, 2, 3, 4, 8)] == ["1", "1", "0.666667", "0.5", "0.25"]


def test_leftovers_and_their_cleanup() -> None:
    netns = "exg-1a2b-n1 (id: 1)\nexg-1a2b-n0 (id: 0)\nsomeone-else (id: 2)\n"
    links = (
        "1: lo: <LOOPBACK,UP,LOWER_UP> mtu 65536 qdisc noqueue state UNKNOWN\\    link/loopback\n"
        "2: eth0: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 qdisc pfifo_fast state UP\n"
        "7: exg-1a2b-br: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 qdisc noqueue state UP\n"
        "8: exg-1a2b-h0@if2: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 qdisc tbf master "
        "exg-1a2b-br\n"
        "9: exgx-keep: <BROADCAST> mtu 1500\n")
    spaces, names = cf.leftovers(netns, links)
    assert spaces == ["exg-1a2b-n1", "exg-1a2b-n0"]
    assert names == ["exg-1a2b-br", "exg-1a2b-h0"]
    assert cf.cleanup_commands(spaces, names) == [
        ["ip", "netns", "del", "exg-1a2b-n1"], ["ip", "netns", "del", "exg-1a2b-n0"],
        ["ip", "link", "del", "exg-1a2b-h0"], ["ip", "link", "del", "exg-1a2b-br"]]
    assert cf.leftovers("", "") == ([], [])


def test_network_is_removed_when_the_setup_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """A failure half-way through the set-up (or in the body) still runs every delete, by
    name; no real command runs here (``sh`` and the listing are replaced)."""
    ran: list[list[str]] = []

    def fake_sh(cmd: list[str], *, check: bool = True) -> str:
        ran.append(list(cmd))
        if cmd[:3] == ["ip", "netns", "add"] and cmd[3].endswith("n1"):
            raise RuntimeError("ip netns add exg-1a2b-n1 failed (1): File exists")
        return ""

    monkeypatch.setattr(cf, "sh", fake_sh)
    monkeypatch.setattr(cf, "present", lambda: ([], []))
    with pytest.raises(RuntimeError, match="File exists"), cf.network(TOPO):
        pass
    deletes = [c for c in ran if "del" in c]
    assert deletes == cf.teardown_commands(TOPO)
    ran.clear()
    with pytest.raises(cf.Interrupted), cf.network(cf.Topology("1a2c", 1)):
        raise cf.Interrupted("signal SIGINT")  # as the signal handler does
    assert [c for c in ran if "del" in c] == cf.teardown_commands(cf.Topology("1a2c", 1))


def test_check_environment_names_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cf.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(cf.shutil, "which", lambda tool: None if tool == "tc" else "/sbin/ip")
    with pytest.raises(SystemExit) as err:
        cf.check_environment()
    text = str(err.value)
    assert "it must run as root" in text and "sudo -E" in text
    assert "'tc' is not on PATH: install iproute2" in text and "'ip'" not in text


# -- parsing ---------------------------------------------------------------------------------------
TC_OUTPUT = """qdisc tbf 8001: root refcnt 2 rate 20Mbit burst 5000b lat 47.5ms
 Sent 35312784 bytes 24571 pkt (dropped 137, overlimits 48121 requeues 0)
 backlog 0b 0p requeues 0
"""


def test_parse_qdisc_stats() -> None:
    stats = cf.parse_qdisc_stats(TC_OUTPUT)
    assert stats == cf.QdiscStats(sent_bytes=35_312_784, sent_packets=24_571, dropped=137,
                                  overlimits=48_121)
    assert stats - cf.QdiscStats(312_784, 571, 37, 121) == cf.QdiscStats(35_000_000, 24_000,
                                                                           100, 48_000)
    with pytest.raises(ValueError, match=r"no 'Sent \.\.\. bytes"):
        cf.parse_qdisc_stats("qdisc noqueue 0: root refcnt 2")


@pytest.mark.parametrize(("text", "integer", "values"), [
    ("20,100", False, [20.0, 100.0]), ("0.5", False, [0.5]), ("2,4", True, [2, 4])])
def test_parse_numbers(text: str, integer: bool, values: list[float]) -> None:
    assert cf.parse_numbers(text, "--rates", integer=integer) == values


@pytest.mark.parametrize(("text", "integer", "message"), [
    ("20,fast", False, "--x: 'fast' in '20,fast' is not a number"),
    ("2.5", True, "--x: '2.5' in '2.5' is not an integer"),
    ("1,2", True, "--x: 1 in '1,2' must be >= 2 (one node sends nothing)"),
    ("0", False, "--x: '0' in '0' must be > 0"),
    ("inf", False, "--x: 'inf' in 'inf' must be > 0"),
])
def test_bad_numbers(text: str, integer: bool, message: str) -> None:
    with pytest.raises(ValueError) as err:
        cf.parse_numbers(text, "--x", integer=integer)
    assert message in str(err.value)


# -- arithmetic ------------------------------------------------------------------------------------
def test_collective_seconds_start_when_the_last_rank_arrives() -> None:
    # two ranks, two collectives. First: rank 1 arrives last (t = 1), the ranks leave at 5 and
    # 5.5: 5.25 - 1 = 4.25 s. Second: rank 1 arrives at 12, they leave at 15 and 15.5: 3.25 s.
    enters = [[0.0, 10.0], [1.0, 12.0]]
    leaves = [[5.0, 15.0], [5.5, 15.5]]
    assert cf.collective_seconds(enters, leaves) == pytest.approx([4.25, 3.25], rel=1e-15)
    assert cf.arrival_skew(enters) == pytest.approx([1.0, 2.0])
    with pytest.raises(ValueError, match=r"enter counts \[2, 1\], leave counts \[2, 2\]"):
        cf.collective_seconds([[0.0, 1.0], [0.0]], leaves)


def test_errors_and_table() -> None:
    assert cf.relative_error(0.9, 1.0) == pytest.approx(-0.1)
    assert cf.relative_error(1.2, 1.0) == pytest.approx(0.2)
    with pytest.raises(ValueError, match=r"the real time must be > 0, got 0\.0"):
        cf.relative_error(1.0, 0.0)
    rows = [cf.Row("all_reduce", "8 MB", 2, 20e6, real_s=4.0, before_s=3.2, after_s=3.9,
                   notes={"drops": 12}),
            cf.Row("ddp", "60 steps, 60 coll.", 4, 100e6, real_s=2.0, before_s=1.5, after_s=1.7)]
    # errors: (3.2 - 4) / 4 = -20%, (3.9 - 4) / 4 = -2.5%; (1.5 - 2) / 2 = -25%, -15%
    assert [r.error_before for r in rows] == pytest.approx([-0.2, -0.25])
    assert [r.error_after for r in rows] == pytest.approx([-0.025, -0.15])
    lines = cf.format_table(rows).splitlines()
    assert lines[2] == ("| all_reduce 8 MB | 2 | 20 Mbit/s | 4.000 s | 3.200 s | -20.0% "
                        "| 3.900 s | -2.5% | drops 12 |")
    assert lines[3] == ("| ddp 60 steps, 60 coll. | 4 | 100 Mbit/s | 2.000 s | 1.500 s | -25.0% "
                        "| 1.700 s | -15.0% ! |  |")  # beyond 10%: marked
    summary = cf.error_summary([-0.2, 0.05, -0.1])
    assert summary == pytest.approx({"median": -0.1, "worst": -0.2, "mean_abs": 0.35 / 3})
    with pytest.raises(ValueError, match="no errors"):
        cf.error_summary([])


def test_predictions_before_and_after_calibration() -> None:
    # before (the runs): 32 MB over N = 2 at 20 Mbit/s, 0.1 ms: 2 * (1/2) * 8 * 32e6 /
    # 20e6 + 2 * 1e-4 = 12.8 + 0.0002 s
    before = cf.before_network(20e6)
    assert before.collective_time("all_reduce", 32e6, 2) == pytest.approx(12.8002, rel=1e-12)
    # after: payload rate 20e6 * 1448 / 1547 bit/s and 2 hops of 150 us, no link latency:
    # 12.8 * 1547 / 1448 + 0.0003 = 13.675138 + 0.0003 = 13.675438 s
    assert cf.after_spec(20e6) == "bw=2e+07bps,latency=0s"
    after = parse_network(cf.after_spec(20e6))
    assert after.collective_time("all_reduce", 32e6, 2) == pytest.approx(
        12.8 * 1547 / 1448 + 0.0003, rel=1e-12)


def test_command_line_errors(monkeypatch: pytest.MonkeyPatch,
                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(cf, "check_environment", lambda: None)  # no root needed to get here
    with pytest.raises(SystemExit) as exit_:
        cf.main(["--nodes", "1,2"])
    assert exit_.value.code == 2
    assert "--nodes: 1 in '1,2' must be >= 2" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cf.main(["--burst", "2"])
    assert "a duration needs a unit" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cf.main(["--steps", "5", "--H", "10"])
    assert "--steps 5 is shorter than --H 10" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cf.main(["--reps", "0"])
    assert "reps must be an integer >= 1, got 0" in capsys.readouterr().err
