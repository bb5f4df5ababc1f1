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
