"""The training loop: N simulated nodes, one strategy, periodic evaluation of the global model.

>>> trainer = Trainer(model, train_dataset, val_dataset)    # model(batch) -> scalar loss
>>> result = trainer.fit(strategy=DiLoCo(H=100), num_nodes=4, max_steps=500, batch_size=64)
>>> print(result.summary())
"""

from __future__ import annotations

import copy
import math
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.func import functional_call
from torch.utils._pytree import tree_map
from torch.utils.data import Dataset
from tqdm.auto import tqdm

from exogym.run.dist import (
    DistributedCommunicator,
    RankContext,
    gather_global_state,
    join_torchrun,
    local_batches,
    torchrun_env,
)
from exogym.run.result import FitResult, MetricsWriter, NonFiniteLossError, check_out_dir
from exogym.run.sinks import MultiSink, Sink
from exogym.sim.clock import ClockTrace, SimClock, measure_step_time, resolve_step_time
from exogym.sim.comm import CommRecord, Communicator, InProcessCommunicator
from exogym.sim.engine import (
    ENGINES,
    PRECISIONS,
    EngineName,
    NodeStack,
    Precision,
    check_memory,
    metrics_of,
    resolve_device,
)
from exogym.sim.network import Network, parse_network
from exogym.sim.partition import Partition, parse_partition
from exogym.sim.sharding import DatasetFactory, FixedSubset, NodeBatches, iterate_batches
from exogym.strategy import Strategy, make

__all__ = ["Trainer"]


class Trainer:
    """Holds a model and its data; :meth:`fit` trains it with a strategy on N simulated nodes.

    Args:
        model: an ``nn.Module`` with ``model(batch) -> loss`` (a scalar tensor, or a mapping with
            ``"loss"`` and other scalar metrics such as ``"accuracy"``). It is never modified:
            every node starts from a copy of its parameters.
        train_dataset: a ``Dataset`` shared by all nodes (each gets a disjoint shard), or a
            ``dataset_factory(rank, num_nodes, train) -> Dataset`` building each node's own part.
        val_dataset: the evaluation set, or a factory (called as ``factory(0, 1, False)``);
            None disables evaluation.
    """

    def __init__(
        self,
        model: nn.Module,
        train_dataset: Dataset | DatasetFactory,
        val_dataset: Dataset | DatasetFactory | None = None,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        self.model = model
        self.train_dataset = train_dataset
        if val_dataset is not None and not isinstance(val_dataset, Dataset):
            if not callable(val_dataset):
                raise TypeError(
                    "val_dataset must be a Dataset, a dataset_factory or None, "
                    f"got {type(val_dataset).__name__}"
                )
            val_dataset = val_dataset(0, 1, False)
        self.val_dataset: Dataset | None = val_dataset

    def fit(
        self,
        *,
        strategy: Strategy | str = "ddp",
        num_nodes: int = 1,
        max_steps: int | None = None,
        num_epochs: float | None = None,
        batch_size: int = 64,
        partition: Partition | str = "iid",
        eval_interval: int | None = None,
        eval_batch_size: int = 1000,
        eval_samples: int | None = 2000,
        eval_at_start: bool = False,
        log_interval: int = 10,
        engine: EngineName = "auto",
        micro_batch_size: int | None = None,
        precision: Precision = "fp32",
        device: str | torch.device = "auto",
        seed: int = 0,
        out_dir: str | Path | None = None,
        progress: bool = True,
        network: Network | str | None = "datacenter",
        step_time: float | str | None = None,
        flops_per_sample: float | None = None,
        device_flops: float | None = None,
        distributed: bool | None = None,
        sinks: Sequence[Sink] = (),
        run_info: Mapping[str, Any] | None = None,
        allow_nonfinite: bool = False,
        allow_unsynced: bool = False,
    ) -> FitResult:
        """Train on ``num_nodes`` simulated nodes and return the global model and its metrics.

        Args:
            strategy: a :class:`Strategy` instance, or a registry id (``"diloco"``).
            num_nodes: N, the simulated nodes.
            max_steps: training steps (each node takes one batch per step); or give
            num_epochs: passes over each node's shard (may be fractional).
            batch_size: per node.
            partition: how a shared training set is split among the nodes
                (:mod:`exogym.sim.partition`): ``"iid"`` (a random 1/N, new each epoch),
                ``"dirichlet:ALPHA"`` (label skew) or ``"contiguous"`` (the i-th block of
                samples; for text, node i's own span). Sizes and label histograms go to
                ``config.json`` (``partition_stats``).
            eval_interval: evaluate the global model every this many steps (and always at the
                end); default: about ten evaluations per run.
            eval_batch_size: batch size of evaluation.
            eval_samples: evaluations during training use a fixed random subset of this many
                samples of the evaluation set (drawn once with seed 0: the same for every run),
                the final one the whole set (``result.final``); None: the whole set every time.
                The rows' ``eval_*`` metrics are on the subset (``result.eval_during_training``
                says which), ``final`` on the whole set (``result.eval_set``).
            eval_at_start: also evaluate the initial model, as a first row at ``step`` 0 (no
                ``train_loss``), where every curve of :mod:`exogym.lab.compare` starts.
            log_interval: write a metrics row every this many steps (and on evaluation steps).
            engine: ``"loop"``, ``"vmap"`` or ``"auto"`` (vmap on CUDA, loop elsewhere).
            micro_batch_size: split each node's batch into micro-batches of this many rows and
                accumulate their gradients (the whole-batch gradient for a per-sample mean loss,
                less activation memory); None: the whole batch at once.
            precision: ``"fp32"``, or ``"bf16"``: forward passes under bfloat16 autocast
                (parameters, gradients, optimizer state and evaluation stay fp32).
            device: ``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"mps"``.
            seed: seeds data order and randomness in the model (dropout); same seed, same numbers.
            out_dir: if given, ``metrics.jsonl``, ``config.json``, ``summary.json`` and
                ``model.pt`` (the global model's ``state_dict`` at each evaluation and at the end)
                go there. It must not exist or be an empty folder (checked before any work).
            sinks: more places for the same rows (:mod:`exogym.run.sinks`: ``CSVSink()``,
                ``TensorBoardSink()``, ``WandbSink(project)``); each is started with the config
                and ``out_dir``, gets every row, and is finished with the summary (None if the
                run fails).
            run_info: more entries for ``config.json`` (the CLI records ``{"task": id}``, which
                ``exogym sample`` reads); they may not replace the run's own keys.
            progress: show a progress bar.
            network: the simulated network under the run's clock (:mod:`exogym.sim.network`): a
                profile name (``"datacenter"``, ``"home-100mbps"``, ...), a spec string
                (``"bw=1Gbps,latency=5ms"``) or a :class:`Network`; None: no simulated clock.
            step_time: one node's compute per step, seconds (or ``"1.5s"``); default: measured
                once on this machine at the start (:func:`exogym.sim.clock.measure_step_time`); or
            flops_per_sample, device_flops: training FLOPs per sample and the device's FLOP/s,
                ``step time = flops_per_sample * batch_size / device_flops``.
            distributed: run as one rank of a multi-process job over ``torch.distributed``:
                the ``N`` nodes are split evenly over the processes (``N / world_size`` stacked
                in each) and collectives cross processes. None (default): yes when
                ``torch.distributed`` is initialised or the process was launched by
                ``torchrun`` (it then joins torchrun's group, and leaves it at the end); False:
                simulate all ``N`` nodes in this process regardless.

            allow_nonfinite: a NaN or infinite training loss (any node) or eval loss stops the run
                with :class:`exogym.run.result.NonFiniteLossError` naming the step, the nodes and
                the strategy, after the metrics so far are written; True trains on regardless (the
                summary records where it first happened).
            allow_unsynced: a run shorter than the strategy's period ``H`` never (fully) updates
                the global model and is an error; True runs it anyway.

        The simulated clock (:mod:`exogym.sim.clock`) never changes a training number: every row
        gains ``sim_time_s``, the result its :class:`exogym.sim.clock.ClockReport`.

        In a multi-process run every rank returns the same :class:`FitResult`; rank 0 alone
        shows progress, evaluates the global model (once per evaluation step, the metrics sent
        to the other ranks) and writes ``out_dir``.
        """
        if isinstance(strategy, str):
            strategy = make(strategy)
        if not isinstance(strategy, Strategy):
            raise TypeError(f"strategy must be a Strategy or an id, got {type(strategy).__name__}")
        _check_int("num_nodes", num_nodes, 1)
        _check_int("batch_size", batch_size, 1)
        _check_int("seed", seed, 0)
        partition = parse_partition(partition)
        _check_int("eval_batch_size", eval_batch_size, 1)
        if eval_samples is not None:
            _check_int("eval_samples (or None)", eval_samples, 1)
        _check_int("log_interval", log_interval, 1)
        for name, flag in (("allow_nonfinite", allow_nonfinite),
                           ("allow_unsynced", allow_unsynced), ("eval_at_start", eval_at_start)):
            if not isinstance(flag, bool):
                raise ValueError(f"{name} must be True or False, got {flag!r}")
        if engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
        if micro_batch_size is not None:
            _check_int("micro_batch_size", micro_batch_size, 1)
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
        if distributed not in (None, True, False):
            raise ValueError(f"distributed must be None, True or False, got {distributed!r}")
        dev = resolve_device(device)
        net = parse_network(network) if network is not None else None
        if net is not None:
            net.check_nodes(num_nodes)
        step_time_s, compute_source = resolve_step_time(step_time, flops_per_sample,
                                                        device_flops, batch_size)
        sink = MultiSink(sinks)  # a non-sink is an error before anything runs
        ranks, owns_group, dev = _join(distributed, num_nodes, dev)
        try:
            return self._fit(
                strategy=strategy, num_nodes=num_nodes, max_steps=max_steps,
                num_epochs=num_epochs, batch_size=batch_size, partition=partition,
                eval_interval=eval_interval, eval_samples=eval_samples,
                eval_at_start=eval_at_start, eval_batch_size=eval_batch_size,
                log_interval=log_interval, engine=engine,
                micro_batch_size=micro_batch_size, precision=precision, dev=dev, seed=seed,
                out_dir=out_dir, progress=progress, net=net, step_time_s=step_time_s,
                compute_source=compute_source, ranks=ranks, sink=sink,
                run_info=dict(run_info or {}), allow_nonfinite=allow_nonfinite,
                allow_unsynced=allow_unsynced)
        finally:
            if owns_group:
                dist.destroy_process_group()

    def _fit(
        self, *, strategy: Strategy, num_nodes: int, max_steps: int | None,
        num_epochs: float | None, batch_size: int, partition: Partition,
        eval_interval: int | None, eval_samples: int | None, eval_at_start: bool,
        eval_batch_size: int, log_interval: int, engine: EngineName,
        micro_batch_size: int | None, precision: Precision, dev: torch.device,
        seed: int, out_dir: str | Path | None, progress: bool, net: Network | None,
        step_time_s: float | None, compute_source: str, ranks: RankContext | None,
        sink: MultiSink, run_info: dict[str, Any], allow_nonfinite: bool,
        allow_unsynced: bool,
    ) -> FitResult:
        """:meth:`fit` after validation; ``ranks`` None simulates every node in this process."""
        overlap_steps = strategy.overlap_steps  # overlapped results are due this many steps later
        wall_start = time.perf_counter()
        lead = ranks is None or ranks.rank == 0
        if lead and out_dir is not None:
            check_out_dir(out_dir)
        n_here = num_nodes if ranks is None else ranks.nodes_per_process
        check_memory(self.model, n_here, dev, strategy.optim.states_per_parameter)

        torch.manual_seed(seed)
        batches = NodeBatches(self.train_dataset, num_nodes, batch_size, seed=seed,
                              partition=partition)
        total_steps = _total_steps(max_steps, num_epochs, batches.steps_per_epoch)
        if eval_interval is None:
            eval_interval = max(total_steps // 10, 1)
        _check_int("eval_interval", eval_interval, 1)
        _check_sync(strategy, total_steps, allow_unsynced, warn=lead)
        eval_full = self.val_dataset
        eval_set = eval_full
        if eval_full is not None and eval_samples is not None and eval_samples < len(eval_full):
            eval_set = FixedSubset(eval_full, eval_samples)

        comm: Communicator
        if ranks is None:
            nodes = NodeStack(self.model, num_nodes, device=dev, engine=engine,
                              micro_batch_size=micro_batch_size, precision=precision)
            comm = InProcessCommunicator(num_nodes)
            stream: Iterator[Any] = batches
        else:
            nodes = NodeStack(self.model, ranks.nodes_per_process, device=dev, engine=engine,
                              micro_batch_size=micro_batch_size, precision=precision)
            comm = DistributedCommunicator(num_nodes, ranks.node_ids)
            stream = local_batches(batches, ranks.node_ids)
        strategy.setup(nodes, comm, total_steps)
        eval_module = copy.deepcopy(self.model).to(dev).eval()

        config = {
            "strategy": strategy.id, "hyperparameters": strategy.hyperparameters(),
            "num_nodes": num_nodes, "steps": total_steps, "batch_size_per_node": batch_size,
            "steps_per_epoch": batches.steps_per_epoch, "eval_interval": eval_interval,
            "partition": partition.spec, "partition_stats": batches.partition_stats(),
            "engine": nodes.engine, "device": str(dev), "seed": seed,
            "micro_batch_size": micro_batch_size, "precision": precision,
            "processes": 1 if ranks is None else ranks.world_size,
            "parameters": nodes.num_parameters(),
            "eval_set": getattr(self.val_dataset, "test_set", None),
            "network": net.spec() if net is not None else None,
            "step_time_s": step_time_s, "compute_source": compute_source,
        }
        clash = sorted(set(run_info) & set(config))
        if clash:
            raise ValueError(f"run_info may not replace the run's own config keys {clash}")
        config.update(run_info)
        writer = MetricsWriter(out_dir, config) if lead and out_dir is not None else None
        if not lead:
            sink = MultiSink(())  # rank 0 alone writes, as for out_dir
        try:
            sink.start(config, writer.dir if writer is not None else None)
        except BaseException:
            if writer is not None:
                writer.close()
            raise
        history: list[dict[str, Any]] = []
        final: dict[str, float] = {}
        loss_sum = torch.zeros((), device=dev)
        loss_count = 0
        # First step (as 0-based step index) at which each local node's loss was not finite, -1
        # while it is; tracked on the device (no host sync per step) and read at log steps.
        first_bad = torch.full((nodes.num_nodes,), -1, dtype=torch.long, device=dev)
        nonfinite: dict[str, Any] | None = None
        train_time = 0.0
        clock: SimClock | None = None
        fed = 0  # records of comm.log already given to the clock
        bar = tqdm(total=total_steps, disable=not (progress and lead), dynamic_ncols=True,
                   unit="step")

        def evaluate(dataset: Dataset) -> dict[str, float]:
            """The global model on ``dataset`` (rank 0 computes, every rank gets it); the
            checkpoint ``model.pt`` is written."""
            state = self._global_state(strategy, comm, ranks)
            metrics: dict[str, float] = {}
            if lead:
                metrics = self._evaluate(eval_module, state, dataset, eval_batch_size, dev)
            metrics = _from_lead(metrics, ranks)
            if writer is not None:
                _load_state(eval_module, state)  # a state_dict with tied names too
                writer.save_model(eval_module.state_dict())
            return metrics

        def emit(row: dict[str, Any]) -> None:
            """Record a metrics row; a non-finite eval loss then stops the run (unless
            allowed), the row written."""
            history.append(row)
            if writer is not None:
                writer.write(row)
            sink.log(row)
            loss = row.get("eval_loss", 0.0)
            if not allow_nonfinite and not math.isfinite(loss):
                raise NonFiniteLossError(
                    f"the global model's eval loss is {loss} after step {row['step']} "
                    f"(strategy {strategy.id}, {num_nodes} nodes): the run diverged; metrics "
                    "so far are written. Lower the learning rate(s), clip gradients "
                    "(--set max_grad_norm=1), or pass allow_nonfinite=True (--allow-nonfinite) "
                    "to train on regardless")

        try:
            if eval_set is not None and eval_at_start:  # the initial model: where curves start
                row0: dict[str, Any] = {"step": 0, "epoch": 0, "samples": 0,
                                        "bytes_sent": max(comm.bytes_sent),
                                        "bytes_received": max(comm.bytes_received),
                                        "wall_s": time.perf_counter() - wall_start}
                if net is not None:
                    row0["sim_time_s"] = 0.0
                row0.update(evaluate(eval_set))
                emit(row0)
            for step in range(total_steps):
                t0 = time.perf_counter()
                comm.step = step
                batch = nodes.to_batch_device(next(stream))
                if net is not None and clock is None:
                    m0 = time.perf_counter()
                    if step_time_s is None:  # one node's step alone, on a copy; RNG restored
                        if lead:
                            step_time_s = measure_step_time(
                                self.model, tree_map(_row0, batch), strategy.optim, dev,
                                micro_batch_size=micro_batch_size, precision=precision)
                        step_time_s = _from_lead(step_time_s, ranks)
                    clock = SimClock(net, num_nodes, step_time_s, overlap_steps=overlap_steps,
                                     compute_source=compute_source)
                    fed = _feed(clock, comm.log, fed)  # set-up collectives (step -1)
                    t0 += time.perf_counter() - m0  # not training time
                losses = nodes.forward_backward(batch)
                strategy.step(step)
                nodes.zero_grad()
                loss_sum += losses.sum()
                loss_count += 1
                if not allow_nonfinite or nonfinite is None:
                    first_bad.masked_fill_((first_bad < 0) & ~torch.isfinite(losses), step)
                done = step + 1
                is_eval = eval_set is not None and (
                    done % eval_interval == 0 or done == total_steps)
                log_now = is_eval or done == total_steps or done % log_interval == 0
                if log_now and dev.type == "cuda":
                    # Only where the time is read: queued kernels of earlier steps finish here and
                    # count as training time; a sync every step would stall the launch queue.
                    torch.cuda.synchronize(dev)
                train_time += time.perf_counter() - t0
                if clock is not None:
                    clock.compute(step)
                    fed = _feed(clock, comm.log, fed)
                bar.update(1)
                if not log_now:
                    continue
                if ranks is not None:  # every node's losses: the mean over all N nodes
                    dist.all_reduce(loss_sum)
                row: dict[str, Any] = {
                    "step": done,
                    "epoch": batches.epoch,
                    "train_loss": float(loss_sum) / (loss_count * num_nodes),
                    "lr": strategy.lr,
                    "samples": done * num_nodes * batch_size,
                    "bytes_sent": max(comm.bytes_sent),
                    "bytes_received": max(comm.bytes_received),
                    "wall_s": time.perf_counter() - wall_start,
                }
                if clock is not None:
                    row["sim_time_s"] = clock.now
                loss_sum.zero_()
                loss_count = 0
                if nonfinite is None:
                    bad = _first_bad_steps(first_bad, comm, ranks)
                    if bad:
                        first = min(bad.values())
                        nonfinite = {"step": first + 1,
                                     "nodes": sorted(i for i, s in bad.items() if s == first)}
                        message = (
                            f"non-finite training loss at step {first + 1} on node(s) "
                            f"{', '.join(map(str, nonfinite['nodes']))} of {num_nodes} "
                            f"(strategy {strategy.id}): the run diverged")
                        if not allow_nonfinite:
                            history.append(row)
                            if writer is not None:
                                writer.write(row)
                            sink.log(row)
                            raise NonFiniteLossError(
                                f"{message}; metrics so far are written. Lower the learning "
                                "rate(s), clip gradients (--set max_grad_norm=1), or pass "
                                "allow_nonfinite=True (--allow-nonfinite) to train on "
                                "regardless")
                        if lead:
                            warnings.warn(f"{message}; training on (allow_nonfinite=True)",
                                          RuntimeWarning, stacklevel=3)
                if is_eval:
                    row.update(evaluate(eval_set))
                    if clock is not None:  # a strategy may communicate to build its global model
                        fed = _feed(clock, comm.log, fed)
                emit(row)
                bar.set_postfix({k: f"{v:.4g}" for k, v in row.items()
                                 if k in ("train_loss", "eval_loss", "eval_accuracy")})
            if eval_set is not None:
                final = {k: v for k, v in history[-1].items() if k.startswith("eval_")}
                if eval_set is not eval_full:  # the last evaluation again, on the whole set
                    assert eval_full is not None
                    final = evaluate(eval_full)
                    if not allow_nonfinite and not math.isfinite(final.get("eval_loss", 0.0)):
                        raise NonFiniteLossError(
                            f"the global model's eval loss on the whole evaluation set is "
                            f"{final['eval_loss']} at the end (strategy {strategy.id})")
            report = trace = None
            if clock is not None and step_time_s is not None:
                fed = _feed(clock, comm.log, fed)
                report = clock.finish()
                trace = ClockTrace(num_nodes=num_nodes, steps=total_steps, step_time_s=step_time_s,
                                   compute_source=compute_source, overlap_steps=overlap_steps,
                                   records=tuple(comm.log[:fed]))
            model = copy.deepcopy(self.model).to(dev)
            state = self._global_state(strategy, comm, ranks)
            _load_state(model, state)
            if writer is not None:
                writer.save_model(model.state_dict())
            result = FitResult(
                model=model, history=history, final=final, strategy=strategy.id,
                hyperparameters=strategy.hyperparameters(), num_nodes=num_nodes, steps=total_steps,
                batch_size=batch_size, samples=total_steps * num_nodes * batch_size,
                train_time_s=train_time, wall_time_s=time.perf_counter() - wall_start,
                bytes_sent=list(comm.bytes_sent), bytes_received=list(comm.bytes_received),
                engine=nodes.engine, device=str(dev), seed=seed,
                out_dir=Path(out_dir) if out_dir is not None else None, comm_log=list(comm.log),
                eval_set=_describe_eval_set(eval_full),
                eval_during_training=(_describe_eval_set(eval_set)
                                      if eval_set is not eval_full else None),
                network=net, clock=report, trace=trace,
                processes=1 if ranks is None else ranks.world_size, nonfinite=nonfinite,
            )
        except BaseException:
            if writer is not None:
                writer.close()
            sink.finish(None)
            raise
        finally:
            bar.close()

        if writer is not None:
            writer.close(result.to_dict())
        sink.finish(result.to_dict())
        return result

    @staticmethod
    def _global_state(
        strategy: Strategy, comm: Communicator, ranks: RankContext | None
    ) -> dict[str, Tensor]:
        """The model to evaluate; across processes a collective (every rank calls it)."""
        if ranks is None:
            return strategy.global_state()
        assert isinstance(comm, DistributedCommunicator)
        return gather_global_state(strategy, comm)

    @staticmethod
    @torch.no_grad()
    def _evaluate(
        module: nn.Module, state: dict[str, Tensor], dataset: Dataset, batch_size: int,
        dev: torch.device,
    ) -> dict[str, float]:
        """Sample-weighted means of the model's scalar metrics over ``dataset``, ``eval_*``."""
        sums: dict[str, Tensor] = {}
        count = 0
        for batch, size in iterate_batches(dataset, batch_size):
            batch = _to(batch, dev)
            metrics = metrics_of(functional_call(module, state, (batch,)))
            for k, v in metrics.items():
                sums[k] = sums.get(k, 0) + v.detach().float().reshape(()) * size
            count += size
        out = {f"eval_{k}": float(v) / count for k, v in sums.items()}
        if "eval_perplexity" in out:
            # Perplexity does not average over batches: it is exp of the mean loss.
            out["eval_perplexity"] = math.exp(out["eval_loss"])
        return out


def _join(
    distributed: bool | None, num_nodes: int, dev: torch.device
) -> tuple[RankContext | None, bool, torch.device]:
    """Where this process stands: ``(ranks, owns_group, device)``; ranks None to simulate all
    nodes here. Joins torchrun's group when launched by torchrun and none is initialised."""
    if distributed is False:
        return None, False, dev
    live = dist.is_available() and dist.is_initialized()
    env = None if live else torchrun_env()
    if not live and env is None:
        if distributed:
            raise ValueError(
                "distributed=True needs torch.distributed initialised or a torchrun launch "
                "(RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT in the environment)")
        return None, False, dev
    owns = False
    if env is not None:
        dev = join_torchrun(env, dev)
        owns = True
    world = dist.get_world_size()
    if num_nodes % world:
        if owns:
            dist.destroy_process_group()
        raise ValueError(f"num_nodes={num_nodes} must be a multiple of the {world} processes "
                         "(each process holds num_nodes / world_size nodes)")
    return RankContext(dist.get_rank(), world, num_nodes // world, str(dev)), owns, dev


def _from_lead(value: Any, ranks: RankContext | None) -> Any:
    """Rank 0's ``value`` on every rank (a broadcast); as is in one process."""
    if ranks is None or ranks.world_size == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _first_bad_steps(first_bad: Tensor, comm: Communicator,
                     ranks: RankContext | None) -> dict[int, int]:
    """``{global node id: first 0-based step with a non-finite loss}`` over the whole run (a
    collective across processes, so that every rank stops at the same step)."""
    if ranks is not None:
        full = torch.full((comm.num_nodes,), -1, dtype=torch.long, device=first_bad.device)
        full[comm.node_ids] = first_bad
        dist.all_reduce(full, op=dist.ReduceOp.MAX)
        ids: list[int] = list(range(comm.num_nodes))
    else:
        full, ids = first_bad, comm.node_ids
    values = full.tolist()
    return {i: s for i, s in zip(ids, values, strict=True) if s >= 0}


def _check_sync(strategy: Strategy, total_steps: int, allow_unsynced: bool, *,
                warn: bool) -> None:
    """A run shorter than the strategy's period H is an error (the global model would never be
    fully updated) unless allowed; a run that is not a multiple of H gets a warning naming the
    strategy (so that a comparison warns for each one)."""
    period = strategy.sync_period
    if period is None:
        return
    if total_steps < period and not allow_unsynced:
        raise ValueError(
            f"{strategy.id}: the run has {total_steps} steps but H={period}: the nodes would "
            "never (fully) synchronise and the global model would stay the initial one. Train "
            f"for at least {period} steps, lower H (--set H=...), or pass allow_unsynced=True "
            "(--allow-unsynced) if that is intended")
    if warn and total_steps % period:
        warnings.warn(
            f"{strategy.id}: {total_steps} steps is not a multiple of H={period}: the last "
            f"{total_steps % period} local steps never reach the global model",
            stacklevel=4)


def _describe_eval_set(dataset: Dataset | None) -> str | None:
    """What an evaluation set is: its ``test_set`` attribute, else its size."""
    if dataset is None:
        return None
    name = getattr(dataset, "test_set", None)
    return name if name is not None else f"{len(dataset):,} samples"  # type: ignore[arg-type]


def _row0(t: Any) -> Any:
    """Node 0's part of a node-stacked batch leaf."""
    return t[0] if isinstance(t, Tensor) else t


def _feed(clock: SimClock, log: list[CommRecord], fed: int) -> int:
    """Give the clock the collectives logged since the last call; the new count."""
    for rec in log[fed:]:
        clock.collective(rec)
    return len(log)


def _to(batch: Any, dev: torch.device) -> Any:
    return tree_map(lambda t: t.to(dev) if isinstance(t, Tensor) else t, batch)


@torch.no_grad()
def _load_state(module: nn.Module, state: dict[str, Tensor]) -> None:
    for name, value in state.items():
        try:
            target = module.get_parameter(name)
        except AttributeError:
            target = module.get_buffer(name)
        target.copy_(value)


def _check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _total_steps(max_steps: int | None, num_epochs: float | None, steps_per_epoch: int) -> int:
    if (max_steps is None) == (num_epochs is None):
        raise ValueError("give exactly one of max_steps and num_epochs")
    if max_steps is not None:
        _check_int("max_steps", max_steps, 1)
        return max_steps
    assert num_epochs is not None
    if not num_epochs > 0:
        raise ValueError(f"num_epochs must be > 0, got {num_epochs!r}")
    return max(math.ceil(num_epochs * steps_per_epoch), 1)
