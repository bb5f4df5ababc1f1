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
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from exogym.run.dist.ranks import close_group
from exogym.run.loop.config import RUN_CONFIG_KEYS
from exogym.run.loop.drive import checkpointing as checkpointing_of
from exogym.run.loop.drive import drive
from exogym.run.loop.run import Run
from exogym.run.nodes.paging import in_memory_nodes
from exogym.run.options import FitOptions
from exogym.run.options import resumed as resumed_values
from exogym.run.output.checkpoint import load_checkpoint
from exogym.run.output.result import FitResult, check_out_dir, read_json
from exogym.run.output.sinks import MultiSink, Sink
from exogym.run.resolve import (
    as_strategy,
    check_arrivals,
    check_client_store,
    check_engine,
    check_paging,
    check_same_run,
    check_sync,
    check_world,
    compute_of,
    join,
    participation_of,
    resumed_settings,
    seat_ranks,
    seats_for,
    strategy_from_config,
    total_steps,
)
from exogym.run.settings import RunSettings
from exogym.sim.arrivals import Arrivals, parse_arrivals
from exogym.sim.client_data import ClientBatches
from exogym.sim.engine import (
    EngineName,
    Precision,
    check_memory,
    resolve_device,
    same_device,
)
from exogym.sim.network import Network, parse_network
from exogym.sim.partition import Partition, parse_partition
from exogym.sim.round_policy import RoundPolicy, parse_round_policy
from exogym.sim.rows import check_rows
from exogym.sim.sharding import DatasetFactory, NodeBatches, is_map_style
from exogym.sim.world import World, parse_world
from exogym.strategy import StackedStrategy
from exogym.strategy.per_node import PerNodeStrategy, as_stacked
from exogym.strategy.server import follow_run
from exogym.utils.validation import check_int

__all__ = ["Trainer"]

_FIT_ARGUMENTS = frozenset(f.name for f in dataclasses.fields(FitOptions))
"""The keyword arguments of exogym's :meth:`Trainer.fit` (one per setting)."""


def _check_clients(o: FitOptions) -> None:
    """A population's options that name each other: the clients in flight are at most the
    population, and a client store is for clients that keep state."""
    if o.concurrency is not None and not isinstance(o.concurrency, bool) and isinstance(
            o.concurrency, int) and o.concurrency > o.num_nodes:
        raise ValueError(f"concurrency={o.concurrency} is more than the {o.num_nodes} clients "
                         "of the run (num_nodes): at most every client trains at once")
    default = FitOptions.__dataclass_fields__["client_store"].default
    check_client_store(o.client_store)  # a malformed value is named as such first
    if o.client_store != default and o.client_state != "keep":
        raise ValueError(f"client_store={o.client_store!r} is where clients that keep their "
                         f"state keep it: it needs client_state='keep' (got "
                         f"{o.client_state!r}, which stores nothing)")


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
        if val_dataset is not None and not is_map_style(val_dataset):
            if not callable(val_dataset):
                raise TypeError(
                    "val_dataset must be a Dataset (anything with __len__ and __getitem__, a "
                    "Hugging Face datasets.Dataset too), a dataset_factory or None, "
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
        arrivals: Arrivals | str | None = None,
        round_policy: RoundPolicy | str | None = None,
        clients_in_memory: str = "auto",
        client_store: str = "512MB",
        resident: int | None = None,
        offload: str = "host",
        compute: str = "profile",
        hardware: str | None = None,
        device_profiles: str | None = None,
        step_time: float | str | None = None,
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
        simulated ``network`` and ``world``, the compute price (``compute``: the step's FLOPs
        counted and priced on ``hardware``'s device by default, or measured on this host; or
        ``step_time``), ``out_dir`` and ``sinks``, checkpoints and ``resume``, and
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
        strategy, engine = as_strategy(o.strategy, o.engine)
        for name, least in (("num_nodes", 1), ("batch_size", 1), ("seed", 0),
                            ("eval_batch_size", 1), ("log_interval", 1)):
            check_int(name, getattr(o, name), least)
        for name in ("eval_samples", "micro_batch_size", "eval_interval"):
            if getattr(o, name) is not None:
                check_int(f"{name} (or None)", getattr(o, name), 1)
        check_engine(engine, o.precision)
        partition = parse_partition(o.partition)
        net = parse_network(o.network) if o.network is not None else None
        if net is not None:
            net.check_nodes(o.num_nodes)
        the_world = check_world(parse_world(o.world), o.num_nodes, net, strategy)
        policy = parse_round_policy(o.round_policy)
        _check_clients(o)
        for data, what in ((self.train_dataset, "train"), (self.val_dataset, "evaluation")):
            if data is not None and is_map_style(data):
                check_rows(data, what)
        arrivals = check_arrivals(parse_arrivals(o.arrivals), o.concurrency)
        participation = participation_of(o.participation, o.concurrency, o.client_state,
                                         o.seed, strategy, policy)
        resident = check_paging(o.resident, o.offload, o.num_nodes, strategy, engine)
        if participation is not None and net is not None and net.topology is None:
            net = dataclasses.replace(net, topology="server")  # a population's clients: FL's
        step_time_s, source, hardware = compute_of(o.values())
        if the_world.duration is not None and source == "measured":
            raise ValueError(f"world duration={the_world.duration.spec()} gives the clients' "
                             "compute times; compute='measured' would rescale them with this "
                             "host's step time: use compute='profile' (the default) or "
                             "step_time=")
        if hardware is not None:
            hardware.check_nodes(o.num_nodes)
        checkpointing = checkpointing_of(o.values())
        sink = MultiSink(o.sinks)  # a non-sink is an error before anything runs
        ranks, owns_group, dev = join(o.distributed, o.num_nodes, resolve_device(o.device))
        clean = False
        try:
            lead = ranks is None or ranks.rank == 0
            if lead and o.out_dir is not None:
                check_out_dir(o.out_dir)
            n_here = o.num_nodes if ranks is None else ranks.nodes_per_process
            seats = seats_for(o.clients_in_memory, participation, the_world, net, strategy,
                              resident, ranks, self.train_dataset, policy)
            if seats:
                assert participation is not None
                ranks = seat_ranks(ranks, participation.per_round(o.num_nodes))
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
            total = total_steps(o.max_steps, o.num_epochs, batches.steps_per_epoch)
            follow_run(strategy, population=participation is not None,
                       steps_per_epoch=batches.steps_per_epoch)
            check_sync(strategy, total, o.allow_unsynced, warn=lead, stacklevel=5)
            settings = RunSettings.of(
                o.values(), total_steps=total, partition=partition,
                eval_interval=o.eval_interval or max(total // 10, 1), engine=engine,
                network=net, step_time_s=step_time_s, compute_source=source,
                hardware=hardware, world=the_world,
                participation=participation, round_policy=policy, arrivals=arrivals,
                resident=resident,
                seats=seats,
                client_store=check_client_store(o.client_store))
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
        ranks, owns_group, dev = join(distributed, num_nodes, resolve_device(resumed["device"]))
        clean = False
        try:
            state, where = load_checkpoint(
                run_dir, rank=0 if ranks is None else ranks.rank,
                world_size=1 if ranks is None else ranks.world_size, map_location=dev)
            saved = state["config"]  # the checkpoint's own copy: its step's truth
            strategy = o.strategy if "strategy" in given else strategy_from_config(saved, where)
            strategy, _ = as_strategy(strategy, "loop")
            settings = resumed_settings(o, given, saved, strategy, num_nodes, int(
                state["step"]), where)
            if settings.seats:
                assert settings.participation is not None
                ranks = seat_ranks(ranks, settings.participation.per_round(num_nodes))
            run_info = {k: v for k, v in saved.items() if k not in RUN_CONFIG_KEYS}
            run_info.update(dict(o.run_info or {}))
            # as the run did, unless told
            checkpointing = checkpointing_of(resumed_values(o, given, saved))
            run = Run(self.model, self.train_dataset, self.val_dataset, strategy, settings,
                      device=dev, ranks=ranks, out_dir=run_dir, sink=sink,
                      progress=o.progress, run_info=run_info,
                      checkpointing=checkpointing.to_dict())
            check_same_run(saved, run.config, where)
            run.load_state_dict(state, where)
            run.resumed_from = {"step": int(state["step"]), "checkpoint": str(where)}
            check_sync(strategy, settings.total_steps, True, stacklevel=5,
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
