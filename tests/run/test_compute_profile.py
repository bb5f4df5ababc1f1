"""A run's compute priced on named hardware (compute="profile", the default): the step counted
on the model and priced on the device, the same under load, per-node and per-client devices,
FedScale-form files, the errors, and ``exogym estimate`` agreeing with a run."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path
from typing import Any

import pytest
import torch
from support.runs import check_run, client_run

from exogym.cli import main
from exogym.lab.check import TinyNet, tiny_data
from exogym.lab.devices import task_step
from exogym.lab.estimate import estimate
from exogym.run.resolve import check_same_run
from exogym.sim.devices import PROFILES, parse_hardware
from exogym.sim.flops import count_step
from exogym.strategy import make


def _spin(stop: Any) -> None:
    while not stop.is_set():
        sum(i * i for i in range(10_000))


def _sim(r: Any) -> tuple[float, ...]:
    c = r.clock
    return (c.total_s, c.compute_s, c.comm_s, c.idle_s, c.utilization, c.step_time_s)


def test_the_default_prices_the_counted_step_on_the_rtx4090() -> None:
    r = check_run("ddp", network="home-100mbps")
    assert r.clock.compute_source == "profile"
    torch.manual_seed(1)
    count = count_step(TinyNet(), tiny_data(torch.float32)[:8], make("ddp").optim)
    assert r.clock.step_time_s == PROFILES["rtx4090"].step_time(count)
    assert r.compute is not None
    assert r.compute["step"] == count.to_dict()
    assert r.compute["hardware"]["spec"] == "rtx4090"
    assert r.trace is not None and "priced on NVIDIA GeForce RTX 4090" in r.trace.compute_method
    # six identical steps, each the step's price plus the all-reduce of the gradients
    assert r.clock.compute_s == pytest.approx(6 * r.clock.step_time_s)


def test_simulated_time_is_the_same_under_load() -> None:
    # the clock depends on the count, the profile and the network, never on the host's load:
    # every simulated figure equal, bit for bit, with two busy processes beside the run
    quiet = check_run("diloco", network="home-100mbps", hardware="m2")
    stop = multiprocessing.Event()
    busy = [multiprocessing.Process(target=_spin, args=(stop,)) for _ in range(2)]
    for p in busy:
        p.start()
    try:
        loaded = check_run("diloco", network="home-100mbps", hardware="m2")
    finally:
        stop.set()
        for p in busy:
            p.join()
    assert _sim(loaded) == _sim(quiet)
    assert loaded.clock.node_compute_s == quiet.clock.node_compute_s


def test_one_device_per_node_makes_the_slow_one_a_straggler() -> None:
    r = check_run("ddp", network="home-100mbps", hardware="rtx4090:rtx4090:phone-low")
    fast, slow = (PROFILES[n].step_time(count_step(TinyNet(), tiny_data(torch.float32)[:8],
                                                   make("ddp").optim))
                  for n in ("rtx4090", "phone-low"))
    assert r.clock.step_time_s == fast
    assert r.clock.node_compute_s == pytest.approx((6 * fast, 6 * fast, 6 * slow))
    # the fast nodes wait for the phone at every all-reduce
    assert r.clock.node_idle_s[0] == pytest.approx(6 * (slow - fast))
    assert r.clock.node_idle_s[2] == 0.0
    assert r.trace is not None and r.trace.speeds == pytest.approx((1, 1, fast / slow))


def test_a_population_draws_each_clients_device() -> None:
    # this tiny model's step is bound by kernel launches: a GPU's (8 us) beside a phone's (20 us)
    mix = "phone-low=0.5,rtx4090=0.5"
    runs = [client_run(make("fedavg", H=3), nodes=40, participation=4,
                       clients_in_memory="round", hardware=mix) for _ in range(2)]
    assert _sim(runs[0]) == _sim(runs[1])
    hardware = parse_hardware(mix)
    clients = sorted({c for rnd in runs[0].rounds or [] for c in rnd})
    drawn = hardware.device_of(clients, seed=0)
    assert set(drawn.tolist()) == {0, 1}  # both classes among the clients that trained
    uniform = client_run(make("fedavg", H=3), nodes=40, participation=4,
                         clients_in_memory="round", hardware="phone-low")
    # the mix's GPUs are faster than an all-phone population
    assert runs[0].clock.compute_s < uniform.clock.compute_s


def test_a_fedscale_file_gives_each_node_its_compute_and_link(tmp_path: Path) -> None:
    path = tmp_path / "clients.csv"
    path.write_text("client_id,computation,communication\n0,1,100000\n1,2,100000\n2,1,1000\n")
    r = check_run("ddp", network="home-100mbps", hardware=str(path))
    # a step: ms per sample x batch 8; node 1 twice as slow; node 2's link 1 Mbit/s
    assert r.clock.step_time_s == pytest.approx(0.008)
    assert r.clock.node_compute_s == pytest.approx((0.048, 0.096, 0.048))
    assert r.network is not None and r.network.node_up_bps == (1e8, 1e8, 1e6)


def test_a_resumed_profile_run_continues_the_same_clock(tmp_path: Path) -> None:
    whole = check_run("diloco", network="home-100mbps", hardware="a100", max_steps=6)
    check_run("diloco", network="home-100mbps", hardware="a100", max_steps=3,
              out_dir=tmp_path / "run", checkpoint_every=3)
    resumed = check_run("diloco", max_steps=6, resume=tmp_path / "run")
    assert _sim(resumed) == pytest.approx(_sim(whole), rel=1e-12)
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["hardware"] == "a100" and config["compute_source"] == "profile"
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["compute"]["step"]["matmul_flops"] > 0


@pytest.mark.parametrize(("settings", "message"), [
    ({"hardware": "rtx4900"}, "did you mean 'rtx4090'"),
    ({"hardware": "a100", "step_time": 0.1}, "give one of them"),
    ({"compute": "measured", "hardware": "a100"}, "compute='measured' times the step"),
    ({"compute": "host"}, "compute must be 'profile'"),
    ({"hardware": "a100:h100"}, "lists 2 devices but the run has 3 nodes"),
])
def test_bad_compute_settings_say_what_is_allowed(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_run("ddp", network="home-100mbps", **settings)


def test_measured_compute_is_asked_for_by_name() -> None:
    r = check_run("ddp", network="home-100mbps", compute="measured")
    assert r.clock.compute_source == "measured" and r.compute is None


def test_an_estimate_and_a_run_of_the_same_configuration_agree(
        mnist_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--task", "mnist", "--nodes", "2", "--steps", "3", "--network", "home-100mbps",
            "--data-dir", str(mnist_data), "--hardware", "l4", "--batch-size", "16"]
    assert main(["estimate", *args, "--strategy", "ddp"]) == 0
    assert "priced on NVIDIA L4" in capsys.readouterr().out
    assert main(["run", *args, "--strategy", "ddp", "--out", str(tmp_path / "run"),
                 "--no-progress", "--eval-interval", "3"]) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    # the estimate's arithmetic on the same count: 3 steps of compute and all-reduces
    count, params = task_step("mnist", batch_size=16, data_dir=mnist_data, download=False)
    assert summary["compute"]["step"] == count.to_dict()
    e = estimate(params=params, dtype="fp32", codec=None, batches=6,
                 compute_s=PROFILES["l4"].step_time(count), num_nodes=2,
                 network="home-100mbps", strategy="ddp")
    assert summary["sim_time_s"] == pytest.approx(e.all_reduce_total_s, rel=1e-9)


def _profiles(path: Path, b_mem_bw: str = "100GB/s") -> Path:
    path.write_text(json.dumps([
        {"name": "lab-a", "peak_flops": {"fp32": "20T"}, "mem_bw": "900GB/s"},
        {"name": "lab-b", "peak_flops": {"fp32": "2T"}, "mem_bw": b_mem_bw}]))
    return path


@pytest.mark.parametrize(("settings", "message"), [
    ({"step_time": 0.1}, r"device_profiles='.*mine.json' \(--device-profiles\) names devices "
     r"for hardware= \(--hardware\) to price the step on; step_time \(--step-time\) prices the "
     r"step as given, so the file would never be read: give one of them"),
    ({"compute": "measured"}, r"compute='measured' \(--compute measured\) times it on this "
     r"host, so the file would never be read"),
    ({"network": None}, r"device_profiles='.*mine.json' prices a step for the simulated clock; "
     r"network=None gives the run no clock"),
    ({"network": None, "device_profiles": None, "hardware": "m2"},
     r"hardware='m2' prices a step .* give the run a network or leave hardware out"),
])
def test_a_device_file_or_hardware_never_read_is_refused_before_any_work(
        settings: dict[str, Any], message: str, tmp_path: Path) -> None:
    # the hardware is not priced with a step time given, a measured step or no clock: a device
    # file (or hardware) given then would silently change nothing
    args = {"network": "home-100mbps", "device_profiles": str(_profiles(tmp_path / "mine.json")),
            **settings}
    with pytest.raises(ValueError, match=message):
        check_run("ddp", out_dir=tmp_path / "run", **args)
    assert not (tmp_path / "run").exists()


def _checkpointed(tmp_path: Path, hardware: str, **settings: Any) -> Path:
    check_run("ddp", network="home-100mbps", hardware=hardware, max_steps=3,
              out_dir=tmp_path / "run", checkpoint_every=3, **settings)
    return tmp_path / "run"


def test_a_resume_after_a_later_devices_profile_changed_is_refused(tmp_path: Path) -> None:
    mine = _profiles(tmp_path / "mine.json")
    run = _checkpointed(tmp_path, "lab-a:lab-b:lab-b", device_profiles=str(mine))
    config = json.loads((run / "config.json").read_text())
    # every device's figures as priced, not only the first's step time
    assert config["priced"]["devices"]["lab-b"] == {
        "peak_flops": {"fp32": 2e12}, "mem_bw": 100e9, "overhead_s": 8e-6,
        "eta_c": 0.7, "eta_m": 0.8}
    _profiles(mine, b_mem_bw="200GB/s")
    with pytest.raises(ValueError, match=r"this is not the run of .*: priced\.devices\.lab-b\."
                                         r"mem_bw: checkpoint 100000000000\.0, now "
                                         r"200000000000\.0$"):
        check_run("ddp", max_steps=6, resume=run)
    assert json.loads((run / "config.json").read_text()) == config
    _profiles(mine)  # as it was: the run goes on
    check_run("ddp", max_steps=6, resume=run)


def test_a_resume_after_the_fedscale_file_changed_is_refused(tmp_path: Path) -> None:
    table = tmp_path / "clients.csv"
    table.write_text("client_id,computation,communication\n0,1,100000\n1,2,100000\n"
                     "2,1,1000\n")
    run = _checkpointed(tmp_path, str(table))
    recorded = json.loads((run / "config.json").read_text())["priced"]["table"]
    assert recorded["rows"] == 3 and len(recorded["sha256"]) == 64
    # a later client's figure: the reference's step time (row 0) is the same
    table.write_text("client_id,computation,communication\n0,1,100000\n1,3,100000\n"
                     "2,1,1000\n")
    with pytest.raises(ValueError, match=r"priced\.table\.sha256: checkpoint '[0-9a-f]{64}', "
                                         r"now '[0-9a-f]{64}'$"):
        check_run("ddp", max_steps=6, resume=run)
    # as it was: the run goes on, its clock that of a run that never stopped (the nodes' links,
    # which the file gives, recorded in the network, are the file's again)
    table.write_text("client_id,computation,communication\n0,1,100000\n1,2,100000\n"
                     "2,1,1000\n")
    resumed = check_run("ddp", max_steps=6, resume=run)
    whole = check_run("ddp", network="home-100mbps", hardware=str(table), max_steps=6)
    assert _sim(resumed) == pytest.approx(_sim(whole), rel=1e-12)


def test_a_run_folder_without_the_priced_record_resumes_as_before() -> None:
    # config.json of an earlier version records no "priced": nothing to compare it with
    now = {"steps": 6, "hardware": "a100", "priced": {"devices": {"a100": {"mem_bw": 2e12}}}}
    check_same_run({"steps": 6, "hardware": "a100"}, now, Path("old"))
    changed = {"devices": {"a100": {"mem_bw": 1e12}}, "table": None}
    with pytest.raises(ValueError, match=r"^this is not the run of old: priced\.devices\.a100\."
                                         r"mem_bw: checkpoint 1000000000000\.0, now "
                                         r"2000000000000\.0$"):
        check_same_run({"steps": 6, "hardware": "a100", "priced": changed}, now, Path("old"))
