"""``exogym.Trainer``: N simulated nodes, one strategy, periodic evaluation of the global model.

>>> trainer = Trainer(model, train_dataset, val_dataset)    # model(batch) -> scalar loss
>>> result = trainer.fit(strategy=DiLoCo(H=100), num_nodes=4, max_steps=500, batch_size=64)
>>> print(result.summary())

:meth:`Trainer.fit` checks its arguments (:class:`exogym.run.options.FitOptions`), builds the
run (:class:`exogym.run.loop.run.Run`) and drives it (:mod:`exogym.run.loop.drive`), or resumes
one. It takes either kind of strategy: node-stacked (:class:`exogym.strategy.StackedStrategy`,
or a registry id) or per-node (:class:`exogym.strategy.Strategy`, run through
:func:`exogym.strategy.per_node.as_stacked`).

EXO Gym's scripts use this same class (``from exogym import Trainer``, its path
``exogym.trainer.Trainer``): its constructor's ``start_port``, ``device`` and ``devices`` are
arguments here, and its form of the ``fit`` call (arguments by position or by EXO Gym's names,
EXO Gym's defaults, the model returned) is recognised and handed to
:mod:`exogym.compat.exo_gym.fit_form`, which is imported only for such a call
(docs/from-exo-gym.md).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import Dataset

from exogym.run.dist.ranks import RankContext, close_group, join_torchrun, torchrun_env
from exogym.run.loop.config import RUN_CONFIG_KEYS
from exogym.run.loop.drive import checkpointing as checkpointing_of
from exogym.run.loop.drive import drive
from exogym.run.loop.run import Run
from exogym.run.nodes.client_store import parse_client_store
from exogym.run.nodes.paging import in_memory_nodes, parse_offload, resident_check
from exogym.run.options import FitOptions, changeable_records, recorded
from exogym.run.options import resumed as resumed_values
from exogym.run.output.checkpoint import load_checkpoint
from exogym.run.output.result import FitResult, check_out_dir, read_json
from exogym.run.output.sinks import MultiSink, Sink
from exogym.run.settings import RunSettings
from exogym.sim.client_data import ClientBatches
from exogym.sim.clock import resolve_step_time
from exogym.sim.engine import (
    ENGINES,
    PRECISIONS,
    EngineName,
    Precision,
    check_memory,
    resolve_device,
    same_device,
)
from exogym.sim.network import Network, parse_network
from exogym.sim.participation import Participation, parse_participation
from exogym.sim.partition import Partition, parse_partition
from exogym.sim.sharding import DatasetFactory, NodeBatches
from exogym.sim.world import World, parse_world, speeds_of
from exogym.strategy import StackedStrategy, make
from exogym.strategy import get as get_strategy
from exogym.strategy.per_node import PerNodeStrategy, as_stacked
from exogym.strategy.server import ServerStrategy
from exogym.utils.config import ConfigError, apply_overrides, config_fields
from exogym.utils.validation import check_int

__all__ = ["Trainer"]

_FIT_ARGUMENTS = frozenset(f.name for f in dataclasses.fields(FitOptions))
"""The keyword arguments of exogym's :meth:`Trainer.fit` (one per setting)."""


def _records_given_arguments(fit: Callable[..., FitResult]) -> Callable[..., FitResult]:
    """Remember which keyword arguments a call passed (``self._given``): a resumed run checks
    exactly those against its checkpoint, and takes every other setting from it. A call in
    another form (:meth:`Trainer._call_form`: EXO Gym's, a per-node strategy, the trainer's own
    device) is handed to that form, with ``run``."""
    @functools.wraps(fit)
    def wrapper(self: Trainer, *args: Any, **kwargs: Any) -> Any:
        def run(**given: Any) -> FitResult:
            self._given = frozenset(given)
            self.result = fit(self, **given)
            return self.result

        form = self._call_form(args, kwargs)
        if form is not None:
            return form(run)
        if args:
            raise TypeError(f"fit() takes keyword arguments only, got {len(args)} arguments by "
                            "position")
        self._given = frozenset(kwargs)  # inline, not run(): warnings point at the caller
        self.result = fit(self, **kwargs)
        return self.result

    return wrapper


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
        start_port: EXO Gym's first rendezvous port of the processes it spawned per ``fit``.
            Accepted and unused: the simulated nodes of a run live in one process and open no
            port. Kept as ``self.start_port`` (an int in [1, 65535] or None); real processes
            take their port from ``exogym.run.launch.fit_processes(..., port=)``.
        device: the device of this trainer's runs (EXO Gym's ``Trainer(device=)``); a
            ``fit(device=)`` given as well must agree with it. None or ``""``: ``fit``'s, else
            ``"auto"``.
        devices: EXO Gym's CUDA device indices, node ``i`` on ``devices[i % len(devices)]``.
            exogym's simulated nodes share one device: one index (the runs' device is then
            ``cuda:INDEX``) or None.
    """

    def __init__(
        self,
        model: nn.Module,
        train_dataset: Dataset | DatasetFactory,
        val_dataset: Dataset | DatasetFactory | None = None,
        start_port: int | None = None,
        device: str | None = None,
        devices: Sequence[int] | None = None,
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
        self._given: frozenset[str] = frozenset()
        #: The last :meth:`fit`'s result (EXO Gym's form of the call returns its model).
        self.result: FitResult | None = None
        if start_port is not None and (isinstance(start_port, bool)
                                       or not isinstance(start_port, int)
                                       or not 1 <= start_port <= 65535):
            raise ValueError(f"start_port must be an integer in [1, 65535] or None, got "
                             f"{start_port!r}")
        self.start_port = start_port
        if device is not None and not isinstance(device, str):
            raise TypeError(f"device must be a device name or None, got {device!r}")
        self.device = _device(device or None, devices)

    def _call_form(self, args: tuple[Any, ...], kwargs: dict[str, Any]
                   ) -> Callable[[Callable[..., FitResult]], Any] | None:
        """How this trainer runs a :meth:`fit` call that is not exogym's own form with
        exogym's arguments as given: a function of ``run`` (``run(**kwargs)`` is exogym's
        ``fit``) that runs it, or None for exogym's own call, run as it is.

        The other forms: EXO Gym's (arguments by position, an EXO Gym-only argument, an EXO Gym
        strategy: :mod:`exogym.compat.exo_gym.fit_form`, imported only when a call may be in
        it: positional arguments, an argument ``fit`` does not have, or a per-node strategy); a
        per-node strategy in exogym's form (run through :func:`as_stacked`); this trainer's own
        ``device``."""
        strategy = kwargs.get("strategy", args[1] if len(args) > 1 else None)
        if args or not set(kwargs) <= _FIT_ARGUMENTS or isinstance(strategy, PerNodeStrategy):
            import exogym.compat.exo_gym.fit_form as fit_form  # EXO Gym's (the docstring)

            if fit_form.is_exo_gym_call(args, kwargs):
                return functools.partial(fit_form.fit, self, args=args, kwargs=kwargs,
                                         device=self.device)
        strategy = kwargs.get("strategy", "ddp")
        if not isinstance(strategy, (str, StackedStrategy, PerNodeStrategy)):
            raise TypeError(
                "strategy must be a node-stacked strategy (exogym.strategy.StackedStrategy, "
                "every registered one), a registry id, a per-node strategy "
                "(exogym.strategy.Strategy, EXO Gym's form) or one of EXO Gym's built-ins "
                f"(exogym.strategy.diloco.DiLoCoStrategy, ...), got {type(strategy).__name__}")
        given = dict(kwargs)
        if isinstance(strategy, PerNodeStrategy):
            given["strategy"] = as_stacked(strategy, kwargs.get("num_nodes", 1))
        if self.device is not None:
            if given.get("device") is not None and not same_device(given["device"], self.device):
                raise ValueError(f"fit(device={given['device']!r}) and Trainer(device="
                                 f"{self.device!r}) differ: give one of them")
            given["device"] = self.device
        if given.keys() == kwargs.keys() and all(given[k] is kwargs[k] for k in kwargs):
            return None  # exogym's own call, run inline (its warnings point at the caller)
        return lambda run: run(**given)

    @_records_given_arguments
    def fit(
        self,
        *,
        strategy: StackedStrategy | str = "ddp",
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
        world: World | str | None = None,
        participation: int | float | str | None = None,
        client_state: str = "fresh",
        concurrency: int | None = None,
        clients_in_memory: str = "auto",
        client_store: str = "512MB",
        resident: int | None = None,
        offload: str = "host",
        step_time: float | str | None = None,
        flops_per_sample: float | None = None,
        device_flops: float | None = None,
        distributed: bool | None = None,
        sinks: Sequence[Sink] = (),
        run_info: Mapping[str, Any] | None = None,
        allow_nonfinite: bool = False,
        allow_unsynced: bool = False,
        checkpoint_every: int | None = None,
        checkpoint_interval: float | str | None = None,
        keep_checkpoints: int = 2,
        async_checkpoint: bool = True,
        resume: str | Path | None = None,
        handle_signals: bool = True,
        trace: bool = False,
    ) -> FitResult:
        """Train on ``num_nodes`` simulated nodes and return the global model and its metrics.

        Every argument is documented on :class:`exogym.run.options.FitOptions`, under the same
        name (``help(exogym.run.options.FitOptions)``). In short: ``strategy`` (an instance or
        a registry id), the run's length (``max_steps`` or ``num_epochs``), the data
        (``batch_size`` per node, ``partition``), evaluation, the engine and device, the
        simulated ``network`` and ``world``, the compute price (measured by default, or
        ``step_time``, or FLOPs), ``out_dir`` and ``sinks``, checkpoints and ``resume``, and
        ``trace`` (the run's timeline as a Chrome trace).

        It also takes a per-node strategy (:class:`exogym.strategy.Strategy`), EXO Gym's
        built-in strategies and EXO Gym's form of this call (its arguments, the model
        returned; :meth:`_call_form`). In a multi-process run every rank returns the same
        :class:`FitResult`.
        """
        options = FitOptions(**{k: v for k, v in locals().items() if k != "self"})
        if options.resume is not None:
            return self._resume(options, self._given)
        return self._start(options)

    def _start(self, o: FitOptions) -> FitResult:
        """A new run of ``o``: the checks that need the model, data and strategy, then the run."""
        strategy, engine = _as_strategy(o.strategy, o.engine)
        for name, least in (("num_nodes", 1), ("batch_size", 1), ("seed", 0),
                            ("eval_batch_size", 1), ("log_interval", 1)):
            check_int(name, getattr(o, name), least)
        for name in ("eval_samples", "micro_batch_size", "eval_interval"):
            if getattr(o, name) is not None:
                check_int(f"{name} (or None)", getattr(o, name), 1)
        _check_engine(engine, o.precision)
        partition = parse_partition(o.partition)
        net = parse_network(o.network) if o.network is not None else None
        if net is not None:
            net.check_nodes(o.num_nodes)
        the_world = _check_world(parse_world(o.world), o.num_nodes, net, strategy)
        participation = _participation(o.participation, o.concurrency, o.client_state, o.seed,
                                       strategy)
        resident = _check_paging(o.resident, o.offload, o.num_nodes, strategy, engine)
        step_time_s, source = resolve_step_time(o.step_time, o.flops_per_sample,
                                                o.device_flops, o.batch_size)
        checkpointing = checkpointing_of(o.values())
        sink = MultiSink(o.sinks)  # a non-sink is an error before anything runs
        ranks, owns_group, dev = _join(o.distributed, o.num_nodes, resolve_device(o.device))
        clean = False
        try:
            lead = ranks is None or ranks.rank == 0
            if lead and o.out_dir is not None:
                check_out_dir(o.out_dir)
            n_here = o.num_nodes if ranks is None else ranks.nodes_per_process
            seats = _seats(o.clients_in_memory, participation, the_world, net, strategy,
                           resident, ranks, self.train_dataset)
            if seats:
                assert participation is not None
                ranks = _seat_ranks(ranks, participation.per_round(o.num_nodes))
                n_here = (participation.per_round(o.num_nodes) if ranks is None
                          else ranks.nodes_per_process)
            if resident is not None:
                if ranks is not None:
                    raise ValueError("resident= pages nodes within one process; a "
                                     "multi-process run (torchrun, distributed=True) spreads "
                                     "them over processes instead: give one or the other")
                n_here = in_memory_nodes(o.num_nodes, resident, o.offload, dev)
            check_memory(self.model, n_here, dev, strategy.optim.states_per_parameter)
            batches = (ClientBatches if seats else NodeBatches)(
                self.train_dataset, o.num_nodes, o.batch_size, seed=o.seed, partition=partition)
            total = _total_steps(o.max_steps, o.num_epochs, batches.steps_per_epoch)
            _check_sync(strategy, total, o.allow_unsynced, warn=lead, stacklevel=5)
            settings = RunSettings.of(
                o.values(), total_steps=total, partition=partition,
                eval_interval=o.eval_interval or max(total // 10, 1), engine=engine,
                network=net, step_time_s=step_time_s, compute_source=source, world=the_world,
                participation=participation, resident=resident, seats=seats,
                client_store=_check_client_store(o.client_store))
            run = Run(self.model, self.train_dataset, self.val_dataset, strategy, settings,
                      device=dev, ranks=ranks, out_dir=o.out_dir, sink=sink,
                      progress=o.progress, run_info=dict(o.run_info or {}), batches=batches,
                      checkpointing=checkpointing.to_dict())
            result = drive(run, None, checkpointing, o.handle_signals)
            clean = True
            return result
        finally:
            if owns_group:
                close_group(clean=clean)

    def _resume(self, o: FitOptions, given: frozenset[str]) -> FitResult:
        """:meth:`fit` continuing ``o.resume`` from its newest usable checkpoint: the settings
        are the checkpoint's, overridden by the arguments given (which must then equal them,
        but for ``max_steps``); any difference is an error listing them."""
        assert o.resume is not None
        run_dir = Path(o.resume)
        saved = read_json(run_dir / "config.json", "resume takes a run folder that exogym "
                          "wrote with checkpoints (--checkpoint-every)")
        if o.out_dir is not None and Path(o.out_dir).resolve() != run_dir.resolve():
            raise ValueError(f"resume={str(run_dir)!r} continues that folder; out_dir="
                             f"{str(o.out_dir)!r} is another (give one of them)")
        if "num_epochs" in given:
            raise ValueError("a resumed run takes max_steps (to extend it), not num_epochs")
        checkpointing_of(o.values())  # the arguments checked before any work
        sink = MultiSink(o.sinks)
        resumed = resumed_values(o, given, saved)
        num_nodes = check_int("num_nodes", resumed["num_nodes"], 1)
        distributed = o.distributed
        if distributed is None and saved.get("processes", 1) == 1:
            distributed = False  # a simulated run continues simulated
        ranks, owns_group, dev = _join(distributed, num_nodes, resolve_device(resumed["device"]))
        clean = False
        try:
            state, where = load_checkpoint(
                run_dir, rank=0 if ranks is None else ranks.rank,
                world_size=1 if ranks is None else ranks.world_size, map_location=dev)
            saved = state["config"]  # the checkpoint's own copy: its step's truth
            strategy = o.strategy if "strategy" in given else _strategy_from_config(saved, where)
            strategy, _ = _as_strategy(strategy, "loop")
            settings = _resumed_settings(o, given, saved, strategy, num_nodes, int(
                state["step"]), where)
            if settings.seats:
                assert settings.participation is not None
                ranks = _seat_ranks(ranks, settings.participation.per_round(num_nodes))
            run_info = {k: v for k, v in saved.items() if k not in RUN_CONFIG_KEYS}
            run_info.update(dict(o.run_info or {}))
            # as the run did, unless told
            checkpointing = checkpointing_of(resumed_values(o, given, saved))
            run = Run(self.model, self.train_dataset, self.val_dataset, strategy, settings,
                      device=dev, ranks=ranks, out_dir=run_dir, sink=sink,
                      progress=o.progress, run_info=run_info,
                      checkpointing=checkpointing.to_dict())
            _check_same_run(saved, run.config, where)
            run.load_state_dict(state, where)
            run.resumed_from = {"step": int(state["step"]), "checkpoint": str(where)}
            _check_sync(strategy, settings.total_steps, True, stacklevel=5,
                        warn=run.lead and settings.total_steps != saved["steps"])
            result = drive(run, int(state["step"]), checkpointing, o.handle_signals)
            clean = True
            return result
        finally:
            if owns_group:
                close_group(clean=clean)


def _device(device: str | None, devices: Sequence[int] | None) -> str | None:
    """EXO Gym's ``Trainer(device=, devices=)`` as one device for the simulated nodes."""
    if devices is None:
        return device
    indices = list(devices)
    if len(indices) != 1 or isinstance(indices[0], bool) or not isinstance(indices[0], int):
        raise ValueError(f"devices={devices!r}: exogym simulates every node of a run on one "
                         "device; give one CUDA index (devices=[0]) or None (EXO Gym placed "
                         "node i on devices[i % len(devices)])")
    if device not in (None, "cuda"):
        raise ValueError(f"devices={devices!r} names CUDA devices, but device={device!r}; "
                         "give device='cuda' or None")
    return f"cuda:{indices[0]}"


def _resumed_settings(o: FitOptions, given: frozenset[str], saved: dict[str, Any],
                      strategy: StackedStrategy, num_nodes: int, step: int,
                      where: Path) -> RunSettings:
    """A resumed run's settings: the checkpoint's config, overridden by what was ``given``
    (:func:`exogym.run.options.resumed`), resolved as a new run's are."""
    v = resumed_values(o, given, saved)
    max_steps = check_int("max_steps", v["max_steps"] or recorded(saved, "max_steps"), 1)
    if max_steps < step:
        raise ValueError(f"max_steps={max_steps} is before the checkpoint's step {step} "
                         f"({where}); a resumed run can only be extended")
    net = parse_network(v["network"]) if v["network"] is not None else None
    # the compute price is recorded resolved (step_time_s) from any of three arguments
    step_time_s, source = saved["step_time_s"], saved["compute_source"]
    if given & {"step_time", "flops_per_sample", "device_flops"}:
        step_time_s, source = resolve_step_time(o.step_time, o.flops_per_sample,
                                                o.device_flops, int(v["batch_size"]))
    the_world = _check_world(parse_world(v["world"]), num_nodes, net, strategy)
    _check_engine(v["engine"], v["precision"])
    return RunSettings.of(
        v, num_nodes=num_nodes, total_steps=max_steps,
        partition=parse_partition(v["partition"]),
        eval_interval=v["eval_interval"] or recorded(saved, "eval_interval"),
        engine=v["engine"], network=net, step_time_s=step_time_s, compute_source=source,
        world=the_world, participation=_resumed_participation(v, given, strategy),
        **_resumed_paging(v, num_nodes, strategy), **_resumed_population(v, given, saved))


def _participation(participation: Any, concurrency: int | None, client_state: str, seed: int,
                   strategy: StackedStrategy) -> Participation | None:
    """Partial participation (a synchronous strategy's ``K`` per round), or an asynchronous
    one's ``concurrency`` (its clients in flight), as one :class:`Participation`."""
    if concurrency is None:
        if participation is not None and isinstance(strategy, ServerStrategy):
            raise ValueError(f"{strategy.id} is asynchronous: its clients are in flight, not "
                             f"drawn per round; give concurrency=C (the clients it keeps in "
                             f"flight), not participation={participation!r}")
        return parse_participation(participation, client_state=client_state, seed=seed)
    if not isinstance(strategy, ServerStrategy):
        raise ValueError(f"concurrency={concurrency!r} is an asynchronous server's clients in "
                         f"flight; {strategy.id} is synchronous: it takes participation=K")
    if participation is not None:
        raise ValueError(f"{strategy.id}: give concurrency (its clients in flight), not "
                         f"participation={participation!r}")
    check_int("concurrency", concurrency, 1)
    return Participation(count=concurrency, client_state=client_state,  # type: ignore[arg-type]
                         seed=seed)


def _resumed_population(v: dict[str, Any], given: frozenset[str],
                        saved: dict[str, Any]) -> dict[str, Any]:
    """A resumed run holds its clients as recorded (seats or a row each: its state's shape);
    the client store is the recorded one unless given (its folder must hold the records)."""
    seats = recorded(saved, "clients_in_memory") == "round"
    asked = v["clients_in_memory"] if "clients_in_memory" in given else "auto"
    if asked not in ("auto", "round" if seats else "all"):
        raise ValueError(f"clients_in_memory={asked!r}: the checkpoint's run holds "
                         f"{'the round' if seats else 'all'} of its clients; a resumed run holds "
                         "them as it did")
    return {"seats": seats, "client_store": _check_client_store(v["client_store"])}


def seats_of(strategy: StackedStrategy, num_nodes: int, fit_args: Mapping[str, Any],
             data: Any) -> int | None:
    """How many seats a run of :meth:`Trainer.fit`'s ``fit_args`` holds (its round's clients,
    :mod:`exogym.run.nodes.population`), or None when it holds a row per node: how many processes a
    process run of it needs (:func:`exogym.run.launch.fit_processes`)."""
    participation = _participation(fit_args.get("participation"), fit_args.get("concurrency"),
                                   fit_args.get("client_state", "fresh"),
                                   fit_args.get("seed", 0), strategy)
    if participation is None:
        return None
    network = fit_args.get("network", "datacenter")
    holds = _seats(fit_args.get("clients_in_memory", "auto"), participation,
                   parse_world(fit_args.get("world")),
                   parse_network(network) if network is not None else None, strategy,
                   fit_args.get("resident"), None, data)
    return participation.per_round(num_nodes) if holds else None


def _seat_ranks(ranks: RankContext | None, seats: int) -> RankContext | None:
    """A multi-process run of a population: each process holds ``seats / world_size`` of the
    round's seats."""
    if ranks is None:
        return None
    if seats % ranks.world_size:
        raise ValueError(f"the round's {seats} clients (participation or concurrency) must be a "
                         f"multiple of the {ranks.world_size} processes (each holds its share "
                         "of the seats)")
    return dataclasses.replace(ranks, nodes_per_process=seats // ranks.world_size)


def _check_client_store(spec: str) -> str:
    parse_client_store(spec)
    return spec.strip()


def _seats(asked: str, participation: Participation | None, world: World,
           net: Network | None, strategy: StackedStrategy, resident: int | None,
           ranks: RankContext | None, data: Any) -> bool:
    """Whether a run holds only the round's clients (:mod:`exogym.run.nodes.population`): asked
    (``"round"``: an error naming what prevents it), allowed (``"auto"``), or not
    (``"all"``)."""
    if asked not in ("auto", "round", "all"):
        raise ValueError(f"clients_in_memory must be 'auto', 'round' or 'all', got {asked!r}")
    if isinstance(strategy, ServerStrategy) and participation is not None:
        if asked == "all":
            raise ValueError(f"{strategy.id}: concurrency holds only the clients in flight; "
                             "clients_in_memory='all' does not apply to it")
        asked = "round"  # clients in flight are seats, always
    if asked == "all" or (participation is None and asked == "auto"):
        return False
    why = None
    if participation is None:
        why = "the run has no partial participation (participation=K): every node trains"
    elif world.mtbf_s or world.events or world.drop or world.min_nodes != 1 \
            or strategy.deadline is not None:
        why = (f"world {world.spec()!r} (failures, message loss, a quorum or a deadline change "
               "who computes inside a round: a row per client)")
    elif net is not None and (net.node_up_bps or net.node_down_bps or net.bw_sigma
                              or net.node_speed or net.speed_sigma):
        why = (f"network {net.spec()!r} lists per-node values (a population's clients get "
               "their speeds from the world: --world speed_sigma=...)")
    elif resident is not None:
        why = "resident= pages the rows of every client"
    elif not isinstance(data, Dataset):
        why = "a dataset_factory builds every node's data up front"
    if why is None:
        return True
    if asked == "round":
        raise ValueError(f"clients_in_memory='round' holds only the round's clients, but {why}; "
                         "use clients_in_memory='all'")
    return False


def _resumed_paging(v: dict[str, Any], num_nodes: int, strategy: StackedStrategy) -> dict[str, Any]:
    """A resumed run pages as recorded (``resident`` must then be the checkpoint's: its
    groups); ``offload`` may change (where the pages live is not the run's state)."""
    return {"resident": _check_paging(v["resident"], v["offload"], num_nodes, strategy,
                                      v["engine"]),
            "offload": v["offload"]}


def _check_paging(resident: int | None, offload: str, num_nodes: int, strategy: StackedStrategy,
                  engine: str) -> int | None:
    """``resident`` validated (None: every node in memory, also when ``resident >= N``)."""
    parse_offload(offload)
    resident = resident_check(resident, num_nodes)
    if resident is None:
        return None
    if isinstance(strategy, ServerStrategy):
        raise ValueError(f"resident= pages the nodes of a synchronous strategy; "
                         f"{strategy.id} is asynchronous (its event loop steps one node at a "
                         "time): run it with every node in memory")
    if engine == "vmap":
        raise ValueError("resident= computes with the loop or threads engine, got "
                         "engine='vmap' (vmap batches the nodes it holds: a group's kernels "
                         "would not be the whole run's)")
    return resident


def _resumed_participation(v: dict[str, Any], given: frozenset[str],
                           strategy: StackedStrategy) -> Participation | None:
    """The recorded partial participation, or an asynchronous strategy's clients in flight
    (``concurrency``), or the ones given (which must then agree)."""
    participation = v["participation"]
    if v["concurrency"] is not None and "participation" not in given:
        participation = None  # an asynchronous run records its clients in flight as both
    return _participation(participation, v["concurrency"], v["client_state"], v["seed"],
                          strategy)


def _check_engine(engine: str, precision: str) -> None:
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")

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
            close_group(clean=False)
        raise ValueError(f"num_nodes={num_nodes} must be a multiple of the {world} processes "
                         "(each process holds num_nodes / world_size nodes)")
    return RankContext(dist.get_rank(), world, num_nodes // world, str(dev)), owns, dev


def _check_world(world: World, num_nodes: int, net: Network | None,
                 strategy: StackedStrategy) -> World:
    """A world fits the run: per-node settings of N nodes; failures by simulated time and a
    straggler deadline need a simulated network (the clock); node speeds are not given twice."""
    world.check_nodes(num_nodes)
    if net is None and world.time_dependent:
        raise ValueError(f"world {world.spec()!r} decides who is up by simulated time: give the "
                         "run a network (the clock), or use failures by step (fail=2@300)")
    deadline = strategy.deadline
    if net is None and deadline is not None:
        raise ValueError(f"{strategy.id}: deadline={deadline!r} needs a simulated network (a "
                         "clock to tell who is late)")
    if net is not None:
        speeds_of(world, net.node_speeds(num_nodes))  # given twice is an error
    return world


def _check_sync(strategy: StackedStrategy, total_steps: int, allow_unsynced: bool, *,
                warn: bool, stacklevel: int = 2) -> None:
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
            stacklevel=stacklevel)


def _strategy_from_config(config: dict[str, Any], where: Path) -> StackedStrategy:
    """The strategy a run recorded: its class and every hyperparameter, by the full keys it
    recorded (never read as a short name: a key the class no longer has would set another
    field).

    Raises:
        ConfigError: a recorded key is not a field of the class (a run of an earlier version).
    """
    entry = config.get("strategy_class")
    cls = get_strategy(entry if entry else config["strategy"])
    recorded = dict(config["hyperparameters"])
    known = config_fields(cls)
    gone = [key for key in recorded if key not in known]
    if gone:
        raise ConfigError(
            f"cannot resume {where}: its strategy {cls.__name__} was recorded with "
            f"{', '.join(f'{k}={recorded[k]!r}' for k in gone)}, which {cls.__name__} no "
            "longer has (a run of an earlier version of exogym or of the class); resume it "
            "with the version that wrote it")
    return apply_overrides(cls, recorded)


def _check_same_run(saved: dict[str, Any], now: dict[str, Any], where: Path) -> None:
    """The continued run must be the checkpointed one: every recorded setting equal, but for
    those that may change (:func:`exogym.run.options.changeable_records`: ``steps``, a resumed
    run may be extended; how it writes checkpoints; where a paged run keeps its pages). Raises
    ValueError listing every difference."""
    def flat(config: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in json.loads(json.dumps(config, default=str)).items():
            if isinstance(value, dict) and key != "partition_stats":
                out.update({f"{key}.{k}": v for k, v in value.items()})
            else:
                out[key] = value
        return out

    a, b = flat(saved), flat(now)
    changeable, sections = changeable_records()
    keys = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)
            and k not in changeable and k.split(".")[0] not in sections]
    derived = {"partition_stats", "steps_per_epoch"}  # follow from N, batch size, partition
    if any(k not in derived for k in keys):
        keys = [k for k in keys if k not in derived]
    diffs = [f"{k}: checkpoint {a.get(k)!r}, now {b.get(k)!r}" for k in keys]
    if diffs:
        raise ValueError(f"this is not the run of {where}: " + "; ".join(diffs))


def _total_steps(max_steps: int | None, num_epochs: float | None, steps_per_epoch: int) -> int:
    if (max_steps is None) == (num_epochs is None):
        raise ValueError("give exactly one of max_steps and num_epochs")
    if max_steps is not None:
        check_int("max_steps", max_steps, 1)
        return max_steps
    assert num_epochs is not None
    if not num_epochs > 0:
        raise ValueError(f"num_epochs must be > 0, got {num_epochs!r}")
    return max(math.ceil(num_epochs * steps_per_epoch), 1)


def _as_strategy(strategy: Any, engine: EngineName) -> tuple[StackedStrategy, EngineName]:
    """The strategy ``fit`` was given (a strategy, or a registry id: made), and the engine."""
    if isinstance(strategy, str):
        strategy = make(strategy)
    if not isinstance(strategy, StackedStrategy):
        raise TypeError(f"strategy must be a StackedStrategy (exogym.strategy) or a registry "
                        f"id, got {type(strategy).__name__}")
    return strategy, engine
