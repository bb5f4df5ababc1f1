#!/usr/bin/env python
"""The plain PyTorch reference of ``bench/fl_peers.py``: FedAvg written as one loop.

One process, ``--threads`` intra-op threads (default 1), one model: each round, every client of
the round starts from the global weights, trains its ``H`` steps with a fresh AdamW
(:func:`peer_common.train_client`), and the new global model is the plain mean of the clients'
models. No framework, no copies beyond one state per client: what the hardware gives for this
workload, against which the simulators' overheads show. Run by the driver; by hand::

    python bench/fl_peers/torch_loop.py --workload W.npz --rounds 2 --out r.json
"""

from __future__ import annotations

import torch
from peer_common import (
    RoundClock,
    build_model,
    finish,
    load_workload,
    mean_state,
    peer_parser,
    train_client,
)


def main() -> None:
    args = peer_parser(__doc__.splitlines()[1]).parse_args()
    torch.set_num_threads(args.threads)
    wl = load_workload(args.workload, args.rounds)
    model = build_model(wl)
    global_state = {k: v.clone() for k, v in model.state_dict().items()}
    clock = RoundClock()
    for r in range(wl.rounds):
        clock.round_started()
        states = []
        for slot in range(wl.per_round):
            model.load_state_dict(global_state)
            train_client(model, wl, r, slot)
            states.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        global_state = mean_state(states)
        clock.round_ended()
    model.load_state_dict(global_state)
    finish(args, wl, model, clock, "torch_loop", threads=args.threads, processes=1)


if __name__ == "__main__":
    main()
