"""What :meth:`exogym.Trainer.fit` is asked to do: its arguments as one validated object, and
each one's declaration as a run setting.

:class:`FitOptions` holds every argument of ``fit`` under the same name, documented here, and
checks what it can on its own (types and ranges; what depends on the model, the data or the
strategy is checked when the run is built). ``fit`` keeps them as explicit keyword arguments, so
that editors and ``help()`` show them (tests/run/test_settings.py checks that the two agree).

Each field is declared with :func:`setting`: its default and a :class:`Setting`, which says how
the setting appears outside ``fit``'s call: the flag and help of ``exogym run``
(:mod:`exogym.cli.run` builds its options from them), the key that records it in the run's
``config.json``, and what a resumed run does with it. The resume rules
(:mod:`exogym.run.trainer`), the keys of ``config.json`` (:mod:`exogym.run.loop.config`) and
the table of docs/settings.md (:func:`settings_table`) are read from the same declarations.

The simulated clock (:mod:`exogym.sim.clock`) never changes a training number: every row gains
``sim_time_s``, the result its :class:`exogym.sim.clock.ClockReport`. ``exogym.Trainer`` also
takes a per-node strategy (:class:`exogym.strategy.Strategy`), EXO Gym's built-ins and EXO Gym's
form of the call (its arguments, the model returned). In a multi-process run every rank returns
the same result; rank 0 alone shows progress, evaluates the global model (once per evaluation
step, the metrics sent to the other ranks) and writes ``out_dir``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from exogym.run.output.sinks import Sink
from exogym.sim.arrivals import Arrivals
from exogym.sim.engine import ENGINES, PRECISIONS, EngineName, Precision
from exogym.sim.network import Network
from exogym.sim.partition import Partition
from exogym.sim.round_policy import RoundPolicy
from exogym.sim.world import World
from exogym.strategy import StackedStrategy
from exogym.utils.validation import check_int

__all__ = ["RESUME_RULES", "FitOptions", "Setting", "changeable_records", "check_compute",
           "cli_default_of",
           "default_of", "recorded", "resumed", "setting", "settings", "settings_table"]

Resume = Literal["must equal", "may change", "as given", "refused"]

RESUME_RULES: dict[str, str] = {
    "must equal": "a resumed run takes the recorded value (`out_dir`: the folder it "
                  "continues); one given must equal it, or the resume is an error listing "
                  "every difference",
    "may change": "a resumed run takes the recorded value unless one is given",
    "as given": "not recorded; a resumed run takes the value given (or the default)",
    "refused": "not with a resume",
}
"""What a resumed run (``fit(resume=RUN_DIR)``, ``exogym run --resume``) does with a setting.
``exogym run --resume`` takes the flags of the settings that ``may change`` or are ``as given``
(and refuses the others: the run goes on as it was recorded)."""

_FIT_DEFAULT: Any = object()  # Setting.cli_default: the flag's default is fit's


@dataclass(frozen=True)
class Setting:
    """One run setting (a field of :class:`FitOptions`) outside ``fit``'s call.

    Attributes:
        help: what it does, in a line (``exogym run --help``, docs/settings.md).
        flag: ``exogym run``'s option for it (``"--nodes"``), or None where the command line
            has no plain option for it.
        parse: how the flag's text is read: a converter of :mod:`exogym.cli.common` by name
            (``"positive_int"``, ``"duration"``, ``"network"``, ...); None: the text as it is.
        metavar: the flag's value in the help.
        choices: the values the flag takes.
        cli_default: the flag's default where it is not ``fit``'s (``--nodes``: 4; None for
            one the command fills in, ``--batch-size``: the task's).
        negated: a flag without a value that gives False (``--no-progress``: progress=False).
        group: flags of the same group are mutually exclusive (``--steps`` / ``--epochs``).
        record: its key in ``config.json`` (``"section.key"`` in a section; a resolved value:
            ``step_time_s`` for the compute price), or None where the run does not record it.
        resume: what a resumed run does with it (:data:`RESUME_RULES`).
    """

    help: str
    flag: str | None = None
    parse: str | None = None
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    cli_default: Any = _FIT_DEFAULT
    negated: bool = False
    group: str | None = None
    record: str | None = None
    resume: Resume = "must equal"

    def __post_init__(self) -> None:
        if self.resume not in RESUME_RULES:
            raise ValueError(f"resume must be one of {list(RESUME_RULES)}, got {self.resume!r}")
        if self.record is None and self.resume == "may change":
            raise ValueError("a setting that may change on resume is recorded: give record=")

    def switch(self, default: Any) -> bool:
        """Whether the flag takes no value (``--trace``, ``--no-progress``), for a setting of
        this ``default``."""
        return self.negated or (isinstance(default, bool) and self.parse is None)

    @property
    def dest(self) -> str | None:
        """The attribute of the parsed command line that holds the flag's value."""
        return None if self.flag is None else self.flag.lstrip("-").replace("-", "_")


def setting(default: Any, help: str, **how: Any) -> Any:
    """A :class:`FitOptions` field: its ``default`` and its :class:`Setting` (``help``, ``how``)."""
    return field(default=default, metadata={"setting": Setting(help=help, **how)})


@dataclass(frozen=True)
class FitOptions:
    """The arguments of :meth:`exogym.Trainer.fit`.

    Attributes:
        strategy: a :class:`StackedStrategy` instance, or a registry id (``"diloco"``).
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
        engine: ``"loop"``, ``"vmap"``, ``"threads"`` or ``"auto"`` (vmap on CUDA;
            threads on a CPU for several nodes and intra-op threads; else the loop).
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
        sinks: more places for the same rows (:mod:`exogym.run.output.sinks`: ``CSVSink()``,
            ``TensorBoardSink()``, ``WandbSink(project)``); each is started with the config
            and ``out_dir``, gets every row, and is finished with the summary (None if the
            run fails).
        run_info: more entries for ``config.json`` (the CLI records ``{"task": id}``, which
            ``exogym sample`` reads); they may not replace the run's own keys.
        progress: show a progress bar.
        network: the simulated network under the run's clock (:mod:`exogym.sim.network`): a
            profile name (``"datacenter"``, ``"home-100mbps"``, ...), a spec string
            (``"bw=1Gbps,latency=5ms"``) or a :class:`Network`; None: no simulated clock.
        world: the world the nodes train in (:mod:`exogym.sim.world`): speeds, failures and
            rejoins, lost messages, a quorum, session durations; a spec string
            (``"speed=1:1:0.5:0.25,mtbf=30min,mttr=5min,seed=3"``) or a :class:`World`; None:
            a perfect world (the numbers of a run without one). What happened goes to
            ``events.jsonl`` and ``result.world``.
        participation: partial participation (:mod:`exogym.sim.participation`): ``K`` (an
            integer) or a fraction ``C`` in (0, 1] of the nodes take part in each round (the
            strategy's ``H`` steps), drawn at random among the nodes that are up, seeded by
            ``seed``; only they compute, send and are charged, and a client selected again
            receives the global model. None: every node every round. FedAvg, FedProx, the
            FedOpt family, DiLoCo, MuLoCo and SPARTA-DiLoCo take it.
        client_state: with ``participation``, whether a client's own state (inner optimizer
            state, residuals) starts ``"fresh"`` each round it takes part in (Flower's
            default: nothing is stored per client) or is kept from its previous round
            (``"keep"``: stored once it has trained, in ``client_store``).
        concurrency: an asynchronous strategy's clients in flight over a population of
            ``num_nodes`` clients (FedBuff's concurrency, :mod:`exogym.run.nodes.population`): at
            most ``C`` train at once; when the server receives one's update, the next client is
            drawn among the available ones not in flight (seeded by ``seed``), with its own
            speed (the world's) and data. None: every node is a client that is always there.
        arrivals: FLSim's client starts (:mod:`exogym.sim.arrivals`; with ``concurrency``).
        round_policy: a round's rules (:mod:`exogym.sim.round_policy`; with ``participation``).
        clients_in_memory: with ``participation``, which clients the run holds
            (:mod:`exogym.run.nodes.population`): ``"round"``, only the round's ``K`` participants
            (seats filled from the global model each round: time and memory set by ``K``, not
            ``N``); ``"all"``, a row for every client (what a world where participants fail
            during a round needs); ``"auto"`` (default): ``"round"`` where it applies (a world
            of speeds and availability only, one process, no paging), else ``"all"``.
        client_store: where clients that keep state keep it (``client_state="keep"`` with
            ``clients_in_memory="round"``): ``"SIZE"`` of host memory, the rest on disk in the
            run folder's ``client-store`` (a temporary folder without one), or ``"SIZE:DIR"``.
        resident: at most this many nodes' state in memory at once (:mod:`exogym.run.nodes.paging`):
            the nodes compute in groups of ``resident``, one group at a time, the others'
            state paged out to ``offload``; the numbers are those of the run with every node
            in memory, bit for bit. None: every node in memory. Synchronous strategies, the
            loop and threads engines, one process.
        offload: where paged-out groups live: ``"host"`` (host memory: on a GPU run, the
            device holds one group), ``"disk"`` (files in a temporary folder) or
            ``"disk:DIR"``. On a CPU only ``"disk"`` lowers the memory a run needs.
        compute: how the clock prices a step: ``"profile"`` (counted on the model, priced on
            ``hardware``: :mod:`exogym.sim.devices`) or ``"measured"`` (this host's time).
        hardware: every node's or client's simulated device (None: ``"rtx4090"``; a list, a
            mix, a custom one, a file: :func:`exogym.sim.devices.parse_hardware`).
        device_profiles: a JSON file of the user's own profiles, for ``hardware``.
        step_time: one node's compute per step, seconds (or ``"1.5s"``), instead of the
            hardware's price.
        distributed: run as one rank of a multi-process job over ``torch.distributed``:
            the ``N`` nodes are split evenly over the processes (``N / world_size`` stacked
            in each) and collectives cross processes. None (default): yes when
            ``torch.distributed`` is initialised or the process was launched by
            ``torchrun`` (it then joins torchrun's group, and leaves it at the end); False:
            simulate all ``N`` nodes in this process regardless.
        allow_nonfinite: a NaN or infinite training loss (any node) or eval loss stops the run
            with :class:`exogym.run.output.result.NonFiniteLossError` naming the step, the nodes and
            the strategy, after the metrics so far are written; True trains on regardless (the
            summary records where it first happened).
        allow_unsynced: a run shorter than the strategy's period ``H`` never (fully) updates
            the global model and is an error; True runs it anyway.
        checkpoint_every: write a checkpoint every this many steps, and at the end
            (:mod:`exogym.run.output.checkpoint`, ``out_dir/checkpoints/step-NNNNNNNN/``); None:
            none (but a Ctrl-C still writes one).
        checkpoint_interval: and/or every this much wall time (seconds, or ``"10min"``).
        keep_checkpoints: how many complete checkpoints are kept (the oldest are deleted).
        async_checkpoint: copy the state to host memory, then write it in a background
            thread while training goes on (one process; multi-process runs write
            synchronously).
        resume: a run folder to continue from its newest usable checkpoint, every setting
            from it (arguments given must agree, but ``max_steps`` may extend the run):
            bit-identical to a run that never stopped (wall-clock times aside).
        handle_signals: SIGINT (Ctrl-C) and SIGTERM end the run cleanly at the next (logged)
            step: a checkpoint with ``out_dir``, metrics flushed,
            :class:`exogym.run.loop.drive.RunInterrupted`; a second signal aborts at once.
        trace: write the simulated timeline as a Chrome trace, ``out_dir/trace.json``
            (:mod:`exogym.run.output.trace`; needs ``out_dir`` and a ``network``); a real
            multi-process run also writes ``trace_real.json``. ``timeline.png`` is drawn with
            it and beside every run with a world, unequal nodes or an asynchronous strategy.
    """

    # Each field is one run setting, declared once: its default, and (``setting``) the help and
    # flag of ``exogym run``, the key that records it in ``config.json`` and what a resumed run
    # does with it. The command line, the resume checks and docs/settings.md derive from these;
    # tests/run/test_settings.py checks that ``fit``'s signature, the CLI and the config agree.
    strategy: StackedStrategy | str = setting(
        "ddp", "the strategy: a StackedStrategy (or a per-node Strategy), or a registry id "
        "(exogym run: --strategy, made with its --set and --lr)", record="strategy")
    num_nodes: int = setting(
        1, "simulated nodes N (default 4)", flag="--nodes", parse="positive_int", cli_default=4,
        record="num_nodes")
    max_steps: int | None = setting(
        None, "training steps (default 500)", flag="--steps", parse="positive_int",
        group="length", record="steps", resume="may change")
    num_epochs: float | None = setting(
        None, "passes over each node's shard", flag="--epochs", parse="positive_number",
        group="length", resume="refused")
    batch_size: int = setting(
        64, "batch size per node (default: the task's)", flag="--batch-size",
        parse="positive_int", cli_default=None, record="batch_size_per_node")
    partition: Partition | str = setting(
        "iid", "how the training set is split among the nodes: iid (default), dirichlet:ALPHA "
        "label skew (0.1: few classes per node), contiguous blocks (text: each node its own "
        "span), natural (the dataset's own clients, one node each)", flag="--partition",
        parse="partition", metavar="iid|dirichlet:ALPHA|contiguous|natural",
        record="partition")
    eval_interval: int | None = setting(
        None, "steps between evaluations of the global model", flag="--eval-interval",
        parse="positive_int", record="eval_interval")
    eval_batch_size: int = setting(1000, "batch size of evaluation", record="eval_batch_size")
    eval_samples: int | None = setting(
        2000, "evaluations during training use a fixed random subset of K samples of the "
        "evaluation set, the final one the whole set (default 2000; all: the whole set every "
        "time)", flag="--eval-samples", parse="count_or_all", metavar="K|all",
        record="eval_samples")
    eval_at_start: bool = setting(
        False, "also evaluate the initial model, a first row at step 0", record="eval_at_start")
    log_interval: int = setting(
        10, "steps between metrics rows", flag="--log-interval", parse="positive_int",
        record="log_interval")
    engine: EngineName = setting(
        "auto", "loop over nodes, vmap, threads (nodes in CPU worker threads), or auto (vmap on "
        "CUDA; threads on a multi-core CPU; else loop); process: one local worker process per "
        "node over torch.distributed (gloo on CPU, nccl on CUDA)", flag="--engine",
        choices=(*ENGINES, "process"), record="engine")  # process: the command line's
    micro_batch_size: int | None = setting(
        None, "split each node's batch into micro-batches of M rows and accumulate their "
        "gradients (less activation memory, the same gradient for a mean loss)",
        flag="--micro-batch-size", parse="positive_int", metavar="M", record="micro_batch_size")
    precision: Precision = setting(
        "fp32", "bf16: forward passes under bfloat16 autocast (weights, gradients, optimizer "
        "state and evaluation stay fp32)", flag="--precision", choices=PRECISIONS,
        record="precision")
    device: str | torch.device = setting(
        "auto", "auto, cpu, cuda, cuda:N or mps", flag="--device", record="device")
    seed: int = setting(
        0, "seed (an integer >= 0)", flag="--seed", parse="non_negative_int", record="seed")
    out_dir: str | Path | None = setting(
        None, "run folder (default: runs/TASK-STRATEGY-nN-TIME)", flag="--out", parse="path")
    progress: bool = setting(
        True, "no progress bar", flag="--no-progress", negated=True, resume="as given")
    network: Network | str | None = setting(
        "datacenter", "simulated network: a profile (see `exogym networks`) or key=value items, "
        "e.g. bw=1Gbps,latency=5ms (default datacenter)", flag="--network", parse="network",
        record="network")
    world: World | str | None = setting(
        None, "the world the nodes train in: speed=1:1:0.5:0.25, mtbf=30min,mttr=5min, "
        "fail=NODE@STEP|TIME, rejoin=NODE@..., drop=0.05, min_nodes=K, seed=S, "
        "trace:FILE.json (default: perfect)", flag="--world", parse="world", metavar="SPEC",
        record="world")
    participation: int | float | str | None = setting(
        None, "partial participation: K nodes (an integer) or a fraction C in (0, 1] take part "
        "in each round (the strategy's H steps), drawn among the nodes that are up (fedavg, "
        "fedprox, fedopt's, diloco, muloco, sparta_diloco)", flag="--participation",
        metavar="K|C", record="participation.participation")
    client_state: str = setting(
        "fresh", "with --participation: a client's own state (inner optimizer state, residuals) "
        "starts fresh each round it takes part in (default, as Flower: nothing stored per "
        "client) or is kept (--client-store)", flag="--client-state", choices=("fresh", "keep"),
        record="participation.client_state")
    concurrency: int | None = setting(
        None, "asynchronous strategies (fedbuff, async_local_sgd) over a population of --nodes "
        "clients: at most C train at once; when the server receives an update the next client "
        "is drawn among the available ones", flag="--concurrency", parse="positive_int",
        metavar="C", record="population.concurrency")
    arrivals: Arrivals | str | None = setting(
        None, "with --concurrency C: clients start at R per simulated second, as FLSim starts "
        "them (C caps those in flight)", flag="--arrivals", parse="arrivals",
        metavar="constant:R|poisson:R", record="population.arrivals")
    round_policy: RoundPolicy | str | None = setting(
        None, "with --participation K: over_selection=1.3 (the first K reports of ceil(1.3 K)), "
        "deadline=60s, min_reports=M (fewer: the round is abandoned), dropouts=on|off",
        flag="--round-policy", parse="round_policy", metavar="KEY=VALUE,...",
        record="population.round_policy")
    clients_in_memory: str = setting(
        "auto", "with --participation: hold only the round's K clients (round: time and memory "
        "set by K, a million clients start in seconds) or a row per client (all: worlds whose "
        "participants fail inside a round); auto: round where it applies",
        flag="--clients-in-memory", choices=("auto", "round", "all"),
        record="population.clients_in_memory")
    client_store: str = setting(
        "512MB", "with --client-state keep: host memory for the clients' own state, the rest on "
        "disk in the run folder's client-store (or DIR); default 512MB", flag="--client-store",
        metavar="SIZE[:DIR]", record="population.client_store")
    resident: int | None = setting(
        None, "at most K nodes' state in memory at once: the nodes compute a group of K at a "
        "time, the others paged out (--offload); the numbers of the run with every node in "
        "memory, bit for bit (synchronous strategies, loop or threads engine)",
        flag="--resident", parse="positive_int", metavar="K", record="paging.resident")
    offload: str = setting(
        "host", "with --resident: where the other groups' state lives: host memory (default; "
        "on a GPU the device holds one group) or files on disk, in a temporary folder or DIR "
        "(on a CPU, disk is what saves memory)", flag="--offload", parse="offload",
        metavar="host|disk[:DIR]", record="paging.offload", resume="may change")
    compute: str = setting(
        "profile", "how the clock prices a step: profile (default: counted on the model, priced "
        "on --hardware, the same on every machine) or measured (this host's time of the step)",
        flag="--compute", choices=("profile", "measured"), record="compute")
    hardware: str | None = setting(
        None, "the simulated device of every node: a name (default rtx4090; exogym devices), "
        "one per node (h100:h100:m2), a mix drawn per client (phone-low=0.5,phone-high=0.5), "
        "a custom device (flops=80T,mem_bw=1TB/s) or a FedScale-form CSV or JSON file",
        flag="--hardware", metavar="DEVICE", record="hardware")
    device_profiles: str | None = setting(None, "a JSON file of your own device profiles, "
                                          "for --hardware", flag="--device-profiles",
                                          metavar="FILE", record="device_profiles")
    step_time: float | str | None = setting(
        None, "compute per step per node for the clock, e.g. 1.5s (instead of --hardware's)",
        flag="--step-time", parse="duration", metavar="TIME", record="step_time_s")
    distributed: bool | None = setting(
        None, "run as one rank of a torch.distributed job (None: when torch.distributed is "
        "initialised or torchrun launched the process)", resume="as given")
    sinks: Sequence[Sink] = setting(
        (), "more places for the metrics rows (exogym run: --csv, --tensorboard, --wandb)",
        resume="as given")
    run_info: Mapping[str, Any] | None = setting(
        None, "more entries for config.json (a resumed run adds them to the recorded ones)",
        resume="as given")
    allow_nonfinite: bool = setting(
        False, "train on when a loss turns NaN or infinite (default: stop with an error naming "
        "the step and the nodes)", flag="--allow-nonfinite", record="allow_nonfinite")
    allow_unsynced: bool = setting(
        False, "allow a run shorter than a strategy's H (its global model is then never fully "
        "updated; default: an error)", flag="--allow-unsynced", record="allow_unsynced")
    checkpoint_every: int | None = setting(
        None, "write a checkpoint every K steps and at the end (RUN/checkpoints/); Ctrl-C writes "
        "one anyway", flag="--checkpoint-every", parse="positive_int", metavar="K",
        record="checkpointing.every", resume="may change")
    checkpoint_interval: float | str | None = setting(
        None, "and/or one every TIME of wall clock, e.g. 10min", flag="--checkpoint-interval",
        parse="duration", metavar="TIME", record="checkpointing.interval_s",
        resume="may change")
    keep_checkpoints: int = setting(
        2, "complete checkpoints kept, the newest (default 2)", flag="--keep-checkpoints",
        parse="positive_int", metavar="K", record="checkpointing.keep", resume="may change")
    async_checkpoint: bool = setting(
        True, "write checkpoints while training waits (default: copied to memory, then written "
        "in the background)", flag="--sync-checkpoints", negated=True,
        record="checkpointing.asynchronous", resume="may change")
    resume: str | Path | None = setting(
        None, "continue RUN_DIR from its newest usable checkpoint, exactly as if it had never "
        "stopped (--steps may extend it)", flag="--resume", parse="path", metavar="RUN_DIR",
        resume="as given")
    handle_signals: bool = setting(
        True, "SIGINT and SIGTERM end the run cleanly at the next step (a checkpoint when there "
        "is a folder); a second one aborts", resume="as given")
    trace: bool = setting(
        False, "also write the run's timeline as a Chrome trace, RUN_DIR/trace.json (open it in "
        "https://ui.perfetto.dev); with --engine process also trace_real.json, the real "
        "processes on the wall clock", flag="--trace", resume="as given")

    def __post_init__(self) -> None:
        _check(self)

    def values(self) -> dict[str, Any]:
        """Every setting by name, as given (not copied, unlike ``dataclasses.asdict``)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}



def resumed(o: FitOptions, names: frozenset[str], config: Mapping[str, Any]) -> dict[str, Any]:
    """Every setting of a run resumed from ``config`` (its ``config.json``): the argument of
    ``o`` if the caller gave it (``names``), else the recorded value (:func:`recorded`); a
    setting the run does not record is the argument (or its default)."""
    return {name: getattr(o, name) if name in names or s.record is None
            else recorded(config, name) for name, s in settings().items()}


def _check(o: FitOptions) -> None:
    """What :class:`FitOptions` checks on its own (types and ranges; what depends on the model,
    the data or the strategy is checked when the run is built)."""
    for name in ("allow_nonfinite", "async_checkpoint", "allow_unsynced", "eval_at_start",
                 "handle_signals", "progress", "trace"):
        if not isinstance(getattr(o, name), bool):
            raise ValueError(f"{name} must be True or False, got {getattr(o, name)!r}")
    if o.distributed not in (None, True, False):
        raise ValueError(f"distributed must be None, True or False, got {o.distributed!r}")
    if o.checkpoint_every is not None:
        check_int("checkpoint_every (or None)", o.checkpoint_every, 1)
    check_int("keep_checkpoints", o.keep_checkpoints, 1)
    if o.trace and o.out_dir is None and o.resume is None:
        raise ValueError("trace=True writes trace.json into the run folder: give out_dir")
    if o.trace and o.network is None:
        raise ValueError("trace=True: a run's trace is the timeline of its simulated "
                         "clock; give the run a network")
    check_compute(o.compute, o.hardware, device_profiles=o.device_profiles,
                  step_time=o.step_time)
    unread = [(name, value) for name, value in (("hardware", o.hardware),
                                                ("device_profiles", o.device_profiles))
              if value is not None]
    if o.network is None and unread:
        name, value = unread[0]
        raise ValueError(f"{name}={str(value)!r} prices a step for the simulated clock; "
                         f"network=None gives the run no clock, so it would never be read: "
                         f"give the run a network or leave {name} out")


def check_compute(compute: str, hardware: Any, *, device_profiles: Any = None,
                  **prices: Any) -> None:
    """One price of a step: the hardware's (``compute="profile"``), the host's
    (``"measured"``), or a price given (``step_time``)."""
    if compute not in ("profile", "measured"):
        raise ValueError(f"compute must be 'profile' (the hardware's price of the counted step) "
                         f"or 'measured' (this host's time of the step), got {compute!r}")
    for name, value in (("hardware", hardware), ("device_profiles", device_profiles)):
        if value is not None and not isinstance(value, (str, Path)):
            raise ValueError(f"{name} must be a string (or None), got {value!r}")
    given = [name for name, value in prices.items() if value is not None]
    if hardware is not None and given:
        raise ValueError(f"hardware={hardware!r} prices the step on a device; {given[0]} "
                         f"prices it as given: give one of them")
    if compute == "measured" and (given or hardware is not None):
        raise ValueError(f"compute='measured' times the step on this host; "
                         f"{(given or ['hardware'])[0]} prices it otherwise: give one of them")
    if device_profiles is not None and (given or compute == "measured"):
        # the file only names devices for the hardware's price, which is then never made
        how = (f"{given[0]} ({settings()[given[0]].flag}) prices the step as given" if given
               else "compute='measured' (--compute measured) times it on this host")
        raise ValueError(f"device_profiles={str(device_profiles)!r} (--device-profiles) names "
                         f"devices for hardware= (--hardware) to price the step on; {how}, so "
                         f"the file would never be read: give one of them")


def settings() -> dict[str, Setting]:
    """Every run setting by name (``fit``'s keyword), in :class:`FitOptions`'s order."""
    return {f.name: f.metadata["setting"] for f in dataclasses.fields(FitOptions)}


def default_of(name: str) -> Any:
    """``fit``'s default of setting ``name``."""
    return FitOptions.__dataclass_fields__[name].default


def cli_default_of(name: str) -> Any:
    """``exogym run``'s default of setting ``name``'s flag (``fit``'s but where it differs)."""
    given = settings()[name].cli_default
    return default_of(name) if given is _FIT_DEFAULT else given


def recorded(config: Mapping[str, Any], name: str) -> Any:
    """The value of setting ``name`` that a run's ``config.json`` (``config``) records, or its
    default where the config holds none (a section that is None: the run had no paging, no
    participation; a key an earlier version did not write)."""
    key = settings()[name].record
    if key is None:
        raise ValueError(f"{name} is not recorded in config.json")
    value: Any = config
    for part in key.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return default_of(name)
        value = value[part]
    return value


def changeable_records() -> tuple[set[str], set[str]]:
    """The ``config.json`` keys that a resumed run may change (``may change`` settings), and
    the sections whose every recorded key may (``checkpointing``)."""
    keys: set[str] = set()
    sections: dict[str, bool] = {}
    for s in settings().values():
        if s.record is None:
            continue
        if s.resume == "may change":
            keys.add(s.record)
        if "." in s.record:
            section = s.record.split(".")[0]
            sections[section] = sections.get(section, True) and s.resume == "may change"
    return keys, {k for k, every in sections.items() if every}


def settings_table() -> str:
    """The run settings as a markdown table, and what each rule of a resume means
    (docs/settings.md)."""
    rows = ["| `fit` keyword | `exogym run` | default | `config.json` | on resume | what |",
            "|---|---|---|---|---|---|"]
    for name, s in settings().items():
        default = default_of(name)
        flag = f"`{s.flag}`" if s.flag else ""
        if s.flag and not s.switch(default):
            value = s.metavar or ("|".join(s.choices) if s.choices else str(s.dest).upper())
            flag = f"`{s.flag} {value}`".replace("|", "\\|")
        shown = "`()`" if default == () else f"`{default!r}`"
        record = f"`{s.record}`" if s.record else ""
        text = s.help.replace("|", "\\|")
        rows.append(f"| `{name}` | {flag} | {shown} | {record} | {s.resume} | {text} |")
    rules = [f"- **{rule}**: {text}." for rule, text in RESUME_RULES.items()]
    return "\n".join([*rows, "", "On resume:", "", *rules]) + "\n"
