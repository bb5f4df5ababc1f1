"""From ``fit``'s arguments to a run's settings: the checks that need the model, the data and the
strategy, the choices that follow from them (where the nodes live, a population's seats, the
processes a run joins), and the resume rules (a resumed run's settings from its checkpoint's
``config.json`` and the arguments given).

:class:`exogym.run.options.FitOptions` checks what an argument can say on its own; what is here
needs more: the strategy (its period against the run's length, what a population or paging
allows it), the network and the world (their node counts), the data (its epochs, a population's
clients), the process group (torchrun's, or none). :class:`exogym.run.trainer.Trainer` calls
these in order and builds :class:`~exogym.run.settings.RunSettings` from them.
"""

from __future__ import annotations

import dataclasses
import json
import math
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from exogym.run.dist.ranks import RankContext, close_group, join_torchrun, torchrun_env
from exogym.run.nodes.client_store import parse_client_store
from exogym.run.nodes.paging import parse_offload, resident_check
from exogym.run.options import FitOptions, changeable_records, recorded
from exogym.run.options import resumed as resumed_values
from exogym.run.settings import RunSettings
from exogym.sim.arrivals import Arrivals, parse_arrivals
from exogym.sim.clock import resolve_step_time
from exogym.sim.devices import Hardware, load_profiles, parse_hardware
from exogym.sim.engine import (
    ENGINES,
    PRECISIONS,
    EngineName,
)
from exogym.sim.network import Network, parse_network
from exogym.sim.participation import Participation, parse_participation
from exogym.sim.partition import parse_partition
from exogym.sim.round_policy import RoundPolicy, parse_round_policy
from exogym.sim.sharding import is_map_style
from exogym.sim.world import World, parse_world, speeds_of
from exogym.strategy import StackedStrategy, make
from exogym.strategy import get as get_strategy
from exogym.strategy.server import ServerStrategy
from exogym.utils.config import ConfigError, apply_overrides, config_fields
from exogym.utils.validation import check_int

__all__ = [
    "as_strategy",
    "check_arrivals",
    "check_client_store",
    "check_engine",
    "check_paging",
    "check_same_run",
    "check_sync",
    "check_world",
    "compute_of",
    "join",
    "participation_of",
    "resumed_settings",
    "seat_ranks",
    "seats_for",
    "seats_of",
    "strategy_from_config",
    "total_steps",
]


def resumed_settings(o: FitOptions, given: frozenset[str], saved: dict[str, Any],
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
    ran = saved.get("network")
    if (net is not None and net.topology is None and ran is not None
            and parse_network(ran).topology == "server"):
        net = dataclasses.replace(net, topology="server")  # the population's default, as run
    # a given or measured price is recorded resolved (step_time_s); a profile's is counted
    # again (the same count), unless the resume gives another price
    step_time_s, source = saved["step_time_s"], saved["compute_source"]
    hardware = None
    if source == "profile" or given & {"step_time", "compute", "hardware"}:
        # a given price is recorded as step_time_s: the argument as given
        step_time_s, source, hardware = compute_of({**v, "step_time": o.step_time})
    if (net is not None and hardware is not None and hardware.table is not None
            and "network" not in given):
        # the recorded network holds the links a FedScale-form file gave every node (a run
        # refuses them given twice); they are the file's again, set when it is priced
        net = dataclasses.replace(net, node_up_bps=None, node_down_bps=None)
    the_world = check_world(parse_world(v["world"]), num_nodes, net, strategy)
    check_engine(v["engine"], v["precision"])
    return RunSettings.of(
        v, num_nodes=num_nodes, total_steps=max_steps,
        partition=parse_partition(v["partition"]),
        eval_interval=v["eval_interval"] or recorded(saved, "eval_interval"),
        engine=v["engine"], network=net, step_time_s=step_time_s, compute_source=source,
        hardware=hardware, world=the_world,
        participation=_resumed_participation(v, given, strategy),
        round_policy=parse_round_policy(v["round_policy"]),
        arrivals=check_arrivals(parse_arrivals(v["arrivals"]), v["concurrency"]),
        **_resumed_paging(v, num_nodes, strategy), **_resumed_population(v, given, saved))


def check_arrivals(arrivals: Arrivals | None, concurrency: int | None) -> Arrivals | None:
    """Arrivals start an asynchronous server's clients: they need its ``concurrency``."""
    if arrivals is not None and concurrency is None:
        raise ValueError(f"arrivals={arrivals.spec()!r} start an asynchronous server's clients "
                         "at a rate: give the run concurrency=C (the most in flight at once; "
                         "fedbuff, async_local_sgd)")
    return arrivals


def participation_of(participation: Any, concurrency: int | None, client_state: str, seed: int,
                     strategy: StackedStrategy, policy: RoundPolicy | None = None
                     ) -> Participation | None:
    """Partial participation (a synchronous strategy's ``K`` per round, drawn with the round
    policy's over-selection), or an asynchronous one's ``concurrency`` (its clients in flight),
    as one :class:`Participation`."""
    if policy is not None and (concurrency is not None or participation is None):
        raise ValueError(f"round_policy={policy.spec()!r} rules a synchronous population's "
                         "rounds: give the run participation=K (an asynchronous server's "
                         "clients report when they are done)")
    if concurrency is None:
        if participation is not None and isinstance(strategy, ServerStrategy):
            raise ValueError(f"{strategy.id} is asynchronous: its clients are in flight, not "
                             f"drawn per round; give concurrency=C (the clients it keeps in "
                             f"flight), not participation={participation!r}")
        drawn = parse_participation(participation, client_state=client_state, seed=seed)
        if policy is None or drawn is None:
            return drawn
        return dataclasses.replace(drawn, over_selection=policy.over_selection)
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
    return {"seats": seats, "client_store": check_client_store(v["client_store"])}


def seats_of(strategy: StackedStrategy, num_nodes: int, fit_args: Mapping[str, Any],
             data: Any) -> int | None:
    """How many seats a run of :meth:`Trainer.fit`'s ``fit_args`` holds (its round's clients,
    :mod:`exogym.run.nodes.population`), or None when it holds a row per node: how many processes a
    process run of it needs (:func:`exogym.run.launch.fit_processes`)."""
    policy = parse_round_policy(fit_args.get("round_policy"))
    participation = participation_of(fit_args.get("participation"), fit_args.get("concurrency"),
                                     fit_args.get("client_state", "fresh"),
                                     fit_args.get("seed", 0), strategy, policy)
    if participation is None:
        return None
    network = fit_args.get("network", "datacenter")
    holds = seats_for(fit_args.get("clients_in_memory", "auto"), participation,
                   parse_world(fit_args.get("world")),
                   parse_network(network) if network is not None else None, strategy,
                   fit_args.get("resident"), None, data, policy)
    return participation.per_round(num_nodes) if holds else None


def seat_ranks(ranks: RankContext | None, seats: int) -> RankContext | None:
    """A multi-process run of a population: each process holds ``seats / world_size`` of the
    round's seats."""
    if ranks is None:
        return None
    if seats % ranks.world_size:
        raise ValueError(f"the round's {seats} clients (participation or concurrency) must be a "
                         f"multiple of the {ranks.world_size} processes (each holds its share "
                         "of the seats)")
    return dataclasses.replace(ranks, nodes_per_process=seats // ranks.world_size)


def check_client_store(spec: str) -> str:
    parse_client_store(spec)
    return spec.strip()


def seats_for(asked: str, participation: Participation | None, world: World,
           net: Network | None, strategy: StackedStrategy, resident: int | None,
           ranks: RankContext | None, data: Any, policy: RoundPolicy | None = None) -> bool:
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
        if policy is not None:
            raise ValueError(f"round_policy={policy.spec()!r} rules a population's rounds in "
                             "seats: give clients_in_memory 'auto' or 'round'")
        if world.duration is not None:
            raise ValueError(f"world duration={world.duration.spec()} draws a population's "
                             "client sessions: give the run participation=K or concurrency=C "
                             "and clients_in_memory 'auto' or 'round'")
        return False
    why = None
    if participation is None:
        why = "the run has no partial participation (participation=K): every node trains"
    elif (world.mtbf_s and not (policy is not None and policy.dropouts)) or world.events \
            or world.drop or world.min_nodes != 1 or strategy.deadline is not None:
        why = (f"world {world.spec()!r} (failures, message loss, a quorum or a deadline change "
               "who computes inside a round: a row per client; with --round-policy, mtbf "
               "failures are seats' dropouts)")
    elif net is not None and (net.node_up_bps or net.node_down_bps or net.bw_sigma
                              or net.node_speed or net.speed_sigma):
        why = (f"network {net.spec()!r} lists per-node values (a population's clients get "
               "their speeds from the world: --world speed_sigma=...)")
    elif resident is not None:
        why = "resident= pages the rows of every client"
    elif not is_map_style(data):
        why = "a dataset_factory builds every node's data up front"
    if why is None:
        return True
    if policy is not None:
        raise ValueError(f"round_policy={policy.spec()!r} rules a population's rounds in seats "
                         f"(clients_in_memory 'auto' or 'round'), but {why}")
    if world.duration is not None:
        raise ValueError(f"world duration={world.duration.spec()} draws a population's client "
                         "sessions, which needs the round's clients in seats "
                         "(participation=K or concurrency=C, clients_in_memory 'auto' or "
                         f"'round'), but {why}")
    if asked == "round":
        raise ValueError(f"clients_in_memory='round' holds only the round's clients, but {why}; "
                         "use clients_in_memory='all'")
    return False


def _resumed_paging(v: dict[str, Any], num_nodes: int, strategy: StackedStrategy) -> dict[str, Any]:
    """A resumed run pages as recorded (``resident`` must then be the checkpoint's: its
    groups); ``offload`` may change (where the pages live is not the run's state)."""
    return {"resident": check_paging(v["resident"], v["offload"], num_nodes, strategy,
                                      v["engine"]),
            "offload": v["offload"]}


def check_paging(resident: int | None, offload: str, num_nodes: int, strategy: StackedStrategy,
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
    return participation_of(participation, v["concurrency"], v["client_state"], v["seed"],
                            strategy, parse_round_policy(v["round_policy"]))


def check_engine(engine: str, precision: str) -> None:
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")

def join(
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


def check_world(world: World, num_nodes: int, net: Network | None,
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


def check_sync(strategy: StackedStrategy, total_steps: int, allow_unsynced: bool, *,
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


def strategy_from_config(config: dict[str, Any], where: Path) -> StackedStrategy:
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


def check_same_run(saved: dict[str, Any], now: dict[str, Any], where: Path) -> None:
    """The continued run must be the checkpointed one: every recorded setting equal, but for
    those that may change (:func:`exogym.run.options.changeable_records`: ``steps``, a resumed
    run may be extended; how it writes checkpoints; where a paged run keeps its pages), and
    what its steps were priced on (``priced``: every device's figures, a FedScale-form table's
    digest) the same, down to the figure that changed (a run of an earlier version recorded
    none, and resumes as it did). Raises ValueError listing every difference."""
    def flat(config: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in _as_json(config).items():
            if key == "priced":
                continue  # compared below, figure by figure
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
    if "priced" in saved:
        diffs += [f"{k}: checkpoint {x!r}, now {y!r}" for k, x, y in _changes(
            "priced", _as_json(saved["priced"]), _as_json(now.get("priced")))]
    if diffs:
        raise ValueError(f"this is not the run of {where}: " + "; ".join(diffs))


def _as_json(value: Any) -> Any:
    """``value`` as ``config.json`` holds it (tuples as lists, paths as strings)."""
    return json.loads(json.dumps(value, default=str))


def _changes(key: str, a: Any, b: Any) -> list[tuple[str, Any, Any]]:
    """Where ``a`` and ``b`` differ: ``(key.sub.key, a's, b's)``, into every object both
    are."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [c for k in sorted(set(a) | set(b))
                for c in _changes(f"{key}.{k}", a.get(k), b.get(k))]
    return [] if a == b else [(key, a, b)]


def total_steps(max_steps: int | None, num_epochs: float | None, steps_per_epoch: int) -> int:
    if (max_steps is None) == (num_epochs is None):
        raise ValueError("give exactly one of max_steps and num_epochs")
    if max_steps is not None:
        check_int("max_steps", max_steps, 1)
        return max_steps
    assert num_epochs is not None
    if not num_epochs > 0:
        raise ValueError(f"num_epochs must be > 0, got {num_epochs!r}")
    return max(math.ceil(num_epochs * steps_per_epoch), 1)


def as_strategy(strategy: Any, engine: EngineName) -> tuple[StackedStrategy, EngineName]:
    """The strategy ``fit`` was given (a strategy, or a registry id: made), and the engine."""
    if isinstance(strategy, str):
        strategy = make(strategy)
    if not isinstance(strategy, StackedStrategy):
        raise TypeError(f"strategy must be a StackedStrategy (exogym.strategy) or a registry "
                        f"id, got {type(strategy).__name__}")
    return strategy, engine


def compute_of(values: Mapping[str, Any]) -> tuple[float | None, str, Hardware | None]:
    """How the clock prices a step, from ``fit``'s arguments (by name): ``(step_time_s,
    source, hardware)``: a given step time (``given``), this host's
    measurement (``measured``: the time comes from the run), or the hardware's price of the
    counted step (``profile``: the time comes from :func:`exogym.run.settings.priced`)."""
    step_time_s, source = resolve_step_time(values["step_time"])
    if source != "measured" or values["compute"] == "measured":
        return step_time_s, source, None
    profiles = (load_profiles(values["device_profiles"])
                if values["device_profiles"] is not None else None)
    return None, "profile", parse_hardware(values["hardware"], profiles)

