#!/usr/bin/env python
"""Apple's pfl (PyTorch backend) on the workload of ``bench/fl_peers.py``.

pfl's ``FederatedAveraging`` run by its ``SimulatedBackend``: in each process one model, the
users of the round trained one after another (``do_multiple_epochs_of``, a fresh local optimizer
per user), their model differences summed, summed across processes (``torch.distributed``,
gloo), averaged with equal weights (``WeightByUser``) and applied by a central SGD of learning
rate 1, so the new model is the plain mean of the users' models. One process, or several
launched by ``torchrun`` (pfl's guide to distributed simulation), which split each cohort
between them; each process trains on ``--threads`` torch threads (default 1). What is set to
train the workload's exact samples:

- who trains: the ``FederatedDataset``'s user sampler returns the workload's participations in
  order (round 0's clients, then round 1's, ...), the same sequence in every process (pfl's
  distributed sampler then hands the cohort's users out round-robin); so the processes must
  divide the cohort;
- what a user trains on: ``make_dataset_fn`` gives the participation's samples in training
  order, trained for one local epoch of batch ``B`` (= ``H`` steps), the local optimizer AdamW
  with exogym's settings;
- no evaluation during training (pfl evaluates each user of the first round before and after
  training, as it always does at iteration 0, on its 80 samples); the final model is evaluated
  once, after the rounds, by the first process.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from peer_common import (
    RoundClock,
    Workload,
    build_model,
    finish,
    load_workload,
    model_classes,
    peer_parser,
)
from pfl.aggregate.simulate import SimulatedBackend
from pfl.aggregate.weighting import WeightByUser
from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
from pfl.callback.base import TrainingProcessCallback
from pfl.data.dataset import Dataset
from pfl.data.federated_dataset import FederatedDataset
from pfl.hyperparam import NNTrainHyperParams
from pfl.internal.ops import pytorch_ops
from pfl.metrics import Metrics, Weighted
from pfl.model.pytorch import PyTorchModel


class Clock(TrainingProcessCallback):
    """Notes when the rounds start and end (pfl's hooks around its central iterations)."""

    def __init__(self, clock: RoundClock) -> None:
        self.clock = clock

    def on_train_begin(self, *, model: Any) -> Metrics:
        self.clock.round_started()
        return Metrics()

    def after_central_iteration(self, aggregate_metrics: Metrics, model: Any, *,
                                central_iteration: int) -> tuple[bool, Metrics]:
        self.clock.round_ended()
        return False, Metrics()


def pfl_model(wl: Workload) -> torch.nn.Module:
    """exogym's classifier with the two methods pfl's PyTorch models must have."""
    classifier, _ = model_classes(wl)

    class PflClassifier(classifier):  # type: ignore[misc, valid-type]
        def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return self((x, y))["loss"]

        @torch.no_grad()
        def metrics(self, x: torch.Tensor, y: torch.Tensor, eval: bool = False
                    ) -> dict[str, Any]:
            was = self.training
            self.eval()
            loss = float(self((x, y))["loss"]) * len(y)
            self.train(was)
            return {"loss": Weighted(loss, len(y))}

    return build_model(wl, PflClassifier)


def federated_data(wl: Workload) -> FederatedDataset:
    """The workload's participations as pfl users: the sampler yields participation
    ``p = round * K + slot`` in order, and user ``p``'s data is its samples in training order."""
    order = iter(range(wl.rounds * wl.per_round))

    def sample() -> int:
        return next(order)

    def make_dataset(p: int) -> Dataset:
        r, slot = divmod(p, wl.per_round)
        x, y = wl.client_data(r, slot)
        return Dataset((x, y), user_id=int(wl.clients[r, slot]))

    return FederatedDataset(make_dataset, sample)


def main() -> None:
    args = peer_parser(__doc__.splitlines()[1]).parse_args()
    torch.set_num_threads(args.threads)
    distributed = pytorch_ops.distributed
    workers = distributed.world_size if distributed is not None else 1
    wl = load_workload(args.workload, args.rounds)
    if wl.per_round % workers:
        raise SystemExit(f"{workers} processes do not divide the cohort of {wl.per_round}: "
                         "pfl's round-robin split would drift from the workload's users")
    net = pfl_model(wl)
    o = wl.meta["optim"]
    model = PyTorchModel(
        model=net,
        local_optimizer_create=partial(torch.optim.AdamW, betas=tuple(o["betas"]), eps=o["eps"],
                                       weight_decay=o["weight_decay"]),
        central_optimizer=torch.optim.SGD(net.parameters(), lr=1.0))
    backend = SimulatedBackend(training_data=federated_data(wl), val_data=None,
                               postprocessors=[WeightByUser()])
    clock = RoundClock()
    FederatedAveraging().run(
        algorithm_params=NNAlgorithmParams(central_num_iterations=wl.rounds,
                                           evaluation_frequency=wl.rounds + 1,
                                           train_cohort_size=wl.per_round, val_cohort_size=0),
        backend=backend, model=model,
        model_train_params=NNTrainHyperParams(local_learning_rate=o["lr"], local_num_epochs=1,
                                              local_batch_size=wl.meta["batch_size"]),
        model_eval_params=None, callbacks=[Clock(clock)])
    if distributed is None or distributed.global_rank == 0:
        finish(args, wl, net, clock, "pfl", packages=("pfl",), processes=workers,
               threads=args.threads)
    if workers > 1:  # leave together: a worker exiting while another evaluates may abort gloo
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
