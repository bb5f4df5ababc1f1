#!/usr/bin/env python
"""Flower's simulation engine on the workload of ``bench/fl_peers.py``.

Flower 1.x's Message API run by ``flwr.simulation.run_simulation``: a ``ServerApp`` whose
strategy is Flower's ``FedAvg``, a ``ClientApp``, one SuperNode per client (``partition-id`` =
the client's id), the Ray backend with 2 CPUs and 1 CPU per ClientApp (2 actors, each on one torch
thread), so both cores train. Differences from Flower's defaults, each to train the workload's
exact samples:

- who trains: ``FedAvg.configure_train`` is overridden to send the round's messages to the
  SuperNodes of the workload's clients (exogym's draws) instead of ``random.sample``; the
  SuperNodes' ids are random, so the ServerApp first asks every SuperNode its ``partition-id``
  once (a ``query`` message each), before the rounds (part of start-up, not of the rounds);
- what a client trains on: its samples of the round, in order (``peer_common.train_client``, a
  fresh AdamW each round as Flower's clients build theirs);
- the weights: each client reports ``num-examples`` = its samples of the round (the same for
  all), so Flower's weighted mean is the plain mean;
- no federated evaluation (``fraction_evaluate=0``); the final model is evaluated once, on the
  server, after the rounds.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import torch
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg
from flwr.simulation import run_simulation
from peer_common import (
    RoundClock,
    Workload,
    build_model,
    cached_workload,
    finish,
    peer_parser,
    train_client,
)

ARGS = peer_parser(__doc__.splitlines()[1]).parse_args()


def workload() -> Workload:
    """The workload, read once per process (the driver's and each Ray actor's: Ray sends this
    script's functions by value, so the cache lives in ``peer_common``)."""
    torch.set_num_threads(ARGS.threads)
    return cached_workload(ARGS.workload, ARGS.rounds)


# -- the clients ---------------------------------------------------------------------------------
client_app = ClientApp()


@client_app.query()
def who_am_i(msg: Message, context: Context) -> Message:
    """The client's id (and the workload loaded in this actor, before the rounds)."""
    workload()
    partition = int(context.node_config["partition-id"])
    return Message(RecordDict({"config": ConfigRecord({"partition-id": partition})}),
                   reply_to=msg)


@client_app.train()
def train(msg: Message, context: Context) -> Message:
    wl = workload()
    client = int(context.node_config["partition-id"])
    round_index = int(msg.content["config"]["server-round"]) - 1
    model = build_model(wl)
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    train_client(model, wl, round_index, wl.slot(round_index, client))
    examples = len(wl.batches[round_index, 0].reshape(-1))
    return Message(RecordDict({"arrays": ArrayRecord(model.state_dict()),
                               "metrics": MetricRecord({"num-examples": examples})}),
                   reply_to=msg)


# -- the server ----------------------------------------------------------------------------------
class DrawnFedAvg(FedAvg):
    """Flower's FedAvg, training the workload's clients of each round; it notes when the rounds
    start and end."""

    def __init__(self, wl: Workload, node_of: dict[int, int], clock: RoundClock) -> None:
        super().__init__(fraction_evaluate=0.0)
        self.wl, self.node_of, self.clock = wl, node_of, clock

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        self.clock.round_started()
        config["server-round"] = server_round
        record = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: config})
        nodes = [self.node_of[int(c)] for c in self.wl.clients[server_round - 1]]
        return [Message(content=record, message_type=MessageType.TRAIN, dst_node_id=n)
                for n in nodes]

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> Any:
        out = super().aggregate_train(server_round, replies)
        self.clock.round_ended()
        return out


server_app = ServerApp()


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    started = time.time()
    wl = workload()
    n_clients = wl.meta["workload"]["clients"]
    while len(nodes := list(grid.get_node_ids())) < n_clients:
        time.sleep(0.1)
    replies = grid.send_and_receive(
        [Message(RecordDict(), message_type=MessageType.QUERY, dst_node_id=n) for n in nodes])
    node_of = {int(r.content["config"]["partition-id"]): r.metadata.src_node_id
               for r in replies}
    if len(node_of) != n_clients:
        raise RuntimeError(f"{len(node_of)} of {n_clients} SuperNodes answered")
    discovery_s = time.time() - started
    clock = RoundClock()
    model = build_model(wl)
    result = DrawnFedAvg(wl, node_of, clock).start(
        grid=grid, initial_arrays=ArrayRecord(model.state_dict()), num_rounds=wl.rounds)
    model.load_state_dict(result.arrays.to_torch_state_dict())
    finish(ARGS, wl, model, clock, "flower", packages=("flwr", "ray"), actors=2,
           discovery_s=discovery_s)


if __name__ == "__main__":
    n_clients = workload().meta["workload"]["clients"]
    run_simulation(server_app=server_app, client_app=client_app, num_supernodes=n_clients,
                   backend_config={"init_args": {"num_cpus": 2},
                                   "client_resources": {"num_cpus": 1, "num_gpus": 0.0}})
