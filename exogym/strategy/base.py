"""The node-stacked base, :class:`StackedStrategy`: what a distributed-training method defines.

A strategy is a small keyword-only dataclass (its fields are its hyperparameters, validated in
``__post_init__``) that also owns the inner optimizer and decides what to communicate when. The
trainer owns the loop and calls, in order:

1. :meth:`~StackedStrategy.setup` once (the base builds the inner optimizer over the
   node-stacked parameters, then calls the subclass's :meth:`~StackedStrategy.init_state`);
2. per step, after every node's backward has filled ``nodes.grads``:
   :meth:`~StackedStrategy.step`, which must update the parameters (usually by calling
   :meth:`~StackedStrategy.inner_step`) and communicate through ``self.comm`` only; the
   trainer zeroes the gradients afterwards;
3. :meth:`~StackedStrategy.global_state` whenever the global model is evaluated.

Code written for ONE node (EXO Gym's form, ``step(self)`` on ``self.model``, with collectives) has
its own base, :class:`exogym.strategy.Strategy` (also named ``PerNodeStrategy``,
:mod:`exogym.strategy.per_node`); a subclass of this base, at any depth, that defines such a
``step(self)`` is refused when it is defined (a ``TypeError`` naming that base), and so is a
node-stacked ``step(self, step)`` on the per-node base.

State (checkpoints, live recovery): everything a strategy sets on itself at run time is its
state, saved by :meth:`~StackedStrategy.state_dict` and restored by
:meth:`~StackedStrategy.load_state_dict` without any code in the subclass: tensors (restored in
place, so optimizers keep their references), dicts and lists of them, ``torch.optim``
optimizers and schedulers, codecs, ``torch.Generator`` objects, plain Python values, and any
object with ``state_dict()`` / ``load_state_dict()``. An attribute that
:meth:`~StackedStrategy.init_state` rebuilds from the hyperparameters alone (a cache, an index
layout) is listed in the class attribute ``derived_state`` and not saved; any other kind of
object is an error naming the attribute, so a strategy can never be checkpointed incompletely
without saying so.

Absent nodes (a world, docs/design/world.md). When some nodes do not compute a step (down,
recovering) the communicator knows who computed (``comm.active``: ``N`` booleans; None: all,
set by the run through the communicator's :class:`~exogym.sim.comm.Attendance`) and
:attr:`~StackedStrategy.active` gives this process's rows of it;
:meth:`~StackedStrategy.inner_step` then steps only those rows, each node with its own step
count (:mod:`exogym.strategy.masked`). At a synchronisation, :meth:`~StackedStrategy.arrivals`
says whose contributions arrive (the active nodes, minus lost messages and the ones a
``deadline`` cuts); the strategy passes it as ``members=`` to its collectives and defines in its
docstring what a node that did not take part does. A node that comes back up, or that a
strategy reports out of sync (:meth:`~StackedStrategy.request_recovery`), is brought back by
:meth:`~StackedStrategy.recover` from a live peer, point to point, its bytes counted and timed.
With no absent node every one of these is None or empty and the code paths are exactly those
without a world.

Compressed communication: the fields ``codec`` (a spec of :func:`exogym.sim.codecs.make_codec`,
``"int8"``, ``"topk:0.1"``, ...), ``error_feedback`` and ``codec_seed`` select a transport codec;
:meth:`StackedStrategy.setup` builds it afresh for every run as ``self.transport_codec`` (``None``
without a codec), and the strategy passes it to its main collective
(``self.comm.all_reduce_(..., codec=self.transport_codec)``). A strategy whose communication
cannot go through a codec sets the class attribute ``supports_codec = False``; it then rejects a
codec at construction.
"""

from __future__ import annotations

import abc
import inspect
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor

from exogym.sim.clock import parse_deadline
from exogym.sim.codecs import Codec, make_codec
from exogym.sim.comm import Communicator, ReduceOp
from exogym.sim.engine import NodeStack
from exogym.strategy.checkpointing import restore_value, save_value
from exogym.strategy.masked import masked_step
from exogym.strategy.optim import LRSchedule, OptimSpec
from exogym.utils.validation import check_number, in_range, positive_int

__all__ = ["StackedStrategy", "in_range", "positive_int", "restart_rows"]


def _per_node_step(namespace: dict[str, Any]) -> bool:
    step = namespace.get("step")
    return callable(step) and len(inspect.signature(step).parameters) == 1


@dataclass(kw_only=True)
class StackedStrategy(metaclass=abc.ABCMeta):
    """Base class of every strategy.

    Attributes:
        id: (class attribute) the id a run records and ``compare`` labels it by; a subclass that
            does not set it is named by its class name.
        optim: the inner (per-node) optimizer; every node keeps its own state.
        schedule: warm-up and cosine decay of the inner learning rate.
        max_grad_norm: clip each node's gradient to this L2 norm before the inner step (None: off).
        codec: transport codec of the strategy's main collective (None: exact fp32): fp16, bf16,
            int8, int8:CHUNK, int4[:CHUNK], fp4[:CHUNK], topk:FRACTION, randk:FRACTION.
        error_feedback: keep each node's compression error and add it to its next message
            (needs a codec).
        codec_seed: seed of randk's index generator, shared by all nodes.
        deadline: straggler deadline at every synchronisation: a multiple of the median time
            since the last one (``"2x"``), or a duration (``"30s"``); a node arriving later is
            cut, as if its message was lost (needs a simulated network), and sits out the
            following steps until the others' clocks reach its own (it is still finishing the
            round it was cut from; the run does not wait for it). None: wait for all.
        recovery: what a node that comes back gets of its inner optimizer state: ``"copy"``
            (the donor's, as torchft heals), ``"restart"`` (fresh) or ``"keep"`` (its own, as it
            was when it left: a client that sat out rounds of partial participation, or a node
            whose optimizer state survived its outage).
    """

    id: ClassVar[str] = ""
    supports_codec: ClassVar[bool] = True
    #: Whether partial participation applies (``fit(participation=K)``): a method with a
    #: global model that a client selected again receives (FedAvg, FedOpt, DiLoCo).
    supports_participation: ClassVar[bool] = False
    #: Attributes :meth:`init_state` rebuilds from the hyperparameters alone (caches, layouts):
    #: not part of :meth:`state_dict`.
    derived_state: ClassVar[tuple[str, ...]] = ()
    optim: OptimSpec = field(default_factory=OptimSpec)
    schedule: LRSchedule = field(default_factory=LRSchedule)
    max_grad_norm: float | None = None
    codec: str | None = None
    error_feedback: bool = False
    codec_seed: int = 0
    deadline: str | None = None
    recovery: Literal["copy", "restart", "keep"] = "copy"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if _per_node_step(cls.__dict__):  # code for one node, on the node-stacked base
            parents = ", ".join(b.__name__ for b in cls.__bases__)
            raise TypeError(
                f"{cls.__name__} defines a per-node step(self), but it subclasses {parents}, "
                "a node-stacked strategy whose step(self, step) updates all the nodes at once; "
                "for code written for one node, subclass exogym.strategy.Strategy (the per-node "
                "base, EXO Gym's) instead")
        if "id" not in cls.__dict__:  # a class of its own is not its parent's strategy
            cls.id = cls.__name__

    def __post_init__(self) -> None:
        if not isinstance(self.optim, OptimSpec):
            raise TypeError(f"optim must be an OptimSpec, got {type(self.optim).__name__}")
        if not isinstance(self.schedule, LRSchedule):
            raise TypeError(f"schedule must be an LRSchedule, got {type(self.schedule).__name__}")
        if self.max_grad_norm is not None:
            check_number("max_grad_norm (or None)", self.max_grad_norm, lo=0.0, lo_open=True)
        if self.codec is not None and not type(self).supports_codec:
            raise ValueError(f"strategy {type(self).__name__} does not support a transport codec; "
                             f"got codec={self.codec!r}, allowed: None")
        if isinstance(self.codec_seed, bool) or not isinstance(self.codec_seed, int) \
                or not 0 <= self.codec_seed < 2**31:
            raise ValueError(f"codec_seed must be an integer in [0, 2^31), got {self.codec_seed!r}")
        try:
            self._make_codec()
        except ValueError as err:
            raise ValueError(f"codec={self.codec!r}, error_feedback={self.error_feedback!r}: "
                             f"{err}") from None
        if self.deadline is not None:
            parse_deadline(self.deadline)
        if self.recovery not in ("copy", "restart", "keep"):
            raise ValueError(f"recovery must be 'copy', 'restart' or 'keep', got {self.recovery!r}")

    # -- called by the trainer -----------------------------------------------------------------
    def setup(self, nodes: NodeStack, comm: Communicator, total_steps: int, *,
              seed: int = 0) -> None:
        """Bind to the nodes and communicator of a run and build the inner optimizer; ``seed``:
        the run's seed (:attr:`run_seed`: what a method's own draws follow unless it is given
        a seed of its own)."""
        if total_steps < 1:
            raise ValueError(f"total_steps must be >= 1, got {total_steps}")
        self.nodes = nodes
        self.comm = comm
        self.total_steps = total_steps
        self.run_seed = seed
        # Per-node step counts of the inner optimizer, once some node missed a step (None while
        # every node stepped every time: the optimizer's own count is everyone's).
        self.node_steps: Tensor | None = None
        self.pending_recovery: list[int] = []  # nodes out of sync, recovered before next step
        self.transport_codec: Codec | None = self._make_codec()
        self.optimizer = self.optim.build(list(nodes.params.values()))
        self.scheduler: torch.optim.lr_scheduler.LambdaLR | None = None
        if self.schedule.active:
            schedule, total = self.schedule, total_steps
            self.scheduler = torch.optim.lr_scheduler.LambdaLR(
                self.optimizer, lambda t: schedule.factor(t, total)
            )
        self.init_state()

    def init_state(self) -> None:  # noqa: B027 (an optional hook, empty on purpose)
        """Allocate the strategy's own state (global copies, outer optimizers). Optional."""

    @abc.abstractmethod
    def step(self, step: int) -> None:
        """Update every node after the backward of ``step`` (0-based); communicate via ``comm``."""

    @torch.no_grad()
    def global_state(self) -> dict[str, Tensor]:
        """Parameters and buffers of the model the method would deploy, keyed like a state_dict.

        Default: node 0, right for methods that keep all nodes identical (DDP).
        """
        return {k: v.clone() for k, v in self.nodes.node_state(0).items()}

    @torch.no_grad()
    def node_mean_state(self) -> dict[str, Tensor]:
        """The node mean of the parameters and float buffers over all the run's nodes (every
        engine, every process: a multi-process run gathers the rows), node 0's integer
        buffers: the global model of a method whose nodes never hold one model (SPARTA,
        DES-LOC), for :meth:`global_state`. Not traffic: it is what evaluation reads. Inside
        :meth:`step`, nodes exchange values only through ``self.comm`` (``all_reduce``: counted
        and timed); ``exogym check`` fails a step that reads the node mean."""
        floats = {k: p.detach() for k, p in self.nodes.params.items()}
        floats.update((k, b) for k, b in self.nodes.buffers.items() if b.is_floating_point())
        means = dict(zip(floats, self.comm.mean_rows(list(floats.values())), strict=True))
        return {k: means[k] if k in means else b[0].clone()
                for k, b in (*self.nodes.params.items(), *self.nodes.buffers.items())}

    # -- state ---------------------------------------------------------------------------------
    def _state_names(self) -> list[str]:
        """The attributes that are state: set at run time, neither a hyperparameter, nor the
        run's binding (nodes, communicator), nor listed in ``derived_state``."""
        skip = {f.name for f in fields(self)} | set(_BINDING) | set(type(self).derived_state)
        return [name for name in vars(self) if name not in skip]

    def state_dict(self) -> dict[str, Any]:
        """The strategy's state between two steps (after :meth:`setup`), keyed by attribute.

        Tensors are returned by reference (a checkpoint copies them to host memory); optimizers,
        schedulers and codecs as their own ``state_dict()``. Raises TypeError naming an attribute
        whose kind cannot be saved (list it in ``derived_state`` if it is rebuilt from the
        hyperparameters, or give its class ``state_dict``/``load_state_dict``).
        """
        if not hasattr(self, "nodes"):
            raise RuntimeError(f"{type(self).__name__}.state_dict() needs setup() first")
        where = type(self).__name__
        return {name: save_value(getattr(self, name), f"{where}.{name}") for name in
                self._state_names()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` into a strategy freshly :meth:`setup` for the same run
        (same hyperparameters, nodes and model); tensors are given on the run's device.

        Raises:
            ValueError: the state has other attributes than this strategy (naming them), or a
                tensor's shape or dtype differs.
        """
        own = set(self._state_names())
        missing, unexpected = sorted(own - set(state)), sorted(set(state) - own)
        if missing or unexpected:
            raise ValueError(f"{type(self).__name__}: the saved state does not fit this strategy "
                             f"(missing {missing}, unexpected {unexpected})")
        for name in self._state_names():
            setattr(self, name, restore_value(getattr(self, name), state[name],
                                         f"{type(self).__name__}.{name}"))

    # -- helpers for subclasses ----------------------------------------------------------------
    def _make_codec(self) -> Codec | None:
        """A fresh transport codec (fresh error-feedback residuals and randk counter)."""
        return make_codec(self.codec, error_feedback=self.error_feedback, seed=self.codec_seed)

    @torch.no_grad()
    def inner_step(self, rows: Tensor | None = None) -> None:
        """Per-node gradient clipping, one inner optimizer step, one schedule step.

        ``rows`` (``[n_local]`` bool; default :attr:`active`): only these nodes step, each with
        its own count; the others' parameters and optimizer state stay as they are.
        """
        if self.max_grad_norm is not None:
            self.nodes.clip_grad_norm_(self.max_grad_norm)
        if rows is None:
            rows = self.active
        if rows is None and self.node_steps is None:
            self.optimizer.step()  # every node, one count: exactly torch's step
        else:
            if self.node_steps is None:
                self.node_steps = torch.full((self.nodes.num_nodes,), _count(self.optimizer),
                                             dtype=torch.long)
            if rows is None:
                rows = torch.ones(self.nodes.num_nodes, dtype=torch.bool,
                                  device=self.nodes.device)
            masked_step(self.optimizer, rows, self.node_steps)
        if self.scheduler is not None:
            self.scheduler.step()

    # -- absent nodes ----------------------------------------------------------------------------
    @property
    def active(self) -> Tensor | None:
        """This process's rows of the nodes that computed this step (``[n_local]`` bool on the
        device), or None when all did."""
        mask = self.comm.active
        return None if mask is None else self.comm.local_rows(mask, self.nodes.device)

    def arrivals(self) -> list[bool] | None:
        """Whose contributions arrive at this step's synchronisation (``N`` booleans, global
        order): the active nodes minus lost messages and those the ``deadline`` cuts; None when
        everyone's do. Call it once per synchronisation (every call draws its message losses)."""
        return self.comm.arrivals(self.deadline)

    def request_recovery(self, nodes: Sequence[int] | Sequence[bool]) -> None:
        """Mark nodes as out of sync (they missed an update the others applied): the trainer
        recovers them from a live peer before the next step (:meth:`recover`). Takes node ids,
        or ``N`` booleans."""
        ids = ([i for i, f in enumerate(nodes) if f] if nodes and isinstance(nodes[0], bool)
               else [int(i) for i in nodes])
        self.pending_recovery = sorted(set(self.pending_recovery) | set(ids))

    @torch.no_grad()
    def recover(self, node: int, donor: int) -> None:
        """Bring ``node`` (back up, or out of sync) to the run's state from the live ``donor``,
        point to point: by default (a method whose replicas are identical: DDP, DeMo, SPARTA)
        the donor's parameters and buffers, its inner optimizer state (``recovery="copy"``) and
        the strategy's own per-node state (:meth:`node_state`); ``recovery="restart"`` gives
        the node a fresh optimizer state instead. What the node had not sent (error-feedback
        residuals) is lost, unless it keeps its own state (``recovery="keep"``: a client of a
        population that returns with its stored residuals). Methods with a global model
        override it (DiLoCo: the global model and the outer optimizer's momentum)."""
        tensors = list(self.nodes.params.values()) + list(self.nodes.buffers.values())
        tensors += list(self.node_state().values())
        if self.recovery == "copy":
            tensors += _optimizer_rows(self.optimizer, self.nodes.num_nodes)
        self.copy_rows(tensors, donor, node, tag="recovery")
        self._after_recovery(node, donor)

    def _after_recovery(self, node: int, donor: int) -> None:
        """The bookkeeping every recovery ends with: the node's step count (the donor's, or 0
        with a fresh optimizer state), and its error-feedback residuals zeroed."""
        row = self._row(node)
        if self.node_steps is None:
            self.node_steps = torch.full((self.nodes.num_nodes,), _count(self.optimizer),
                                         dtype=torch.long)
        if self.recovery == "copy":
            # the donor's step count travels with its optimizer state; another process, or
            # another group of a paged run, may hold the donor (every process asks)
            steps = self.comm.fetch_row(self.node_steps.to(self.nodes.device), donor).cpu()
        if row is not None:
            if self.recovery == "restart":
                for t in _optimizer_rows(self.optimizer, self.nodes.num_nodes):
                    t[row].zero_()
                self.node_steps[row] = 0
            elif self.recovery == "copy":
                self.node_steps[row] = steps
        residuals = getattr(self.transport_codec, "residuals", None)
        if residuals and row is not None and self.recovery != "keep":
            for e in residuals.values():  # what the node had not sent is lost; a client
                e[row].zero_()              # that keeps its state keeps them

    def client_state(self) -> list[Tensor]:
        """The node-stacked tensors that are a node's own state besides its model: the inner
        optimizer's state (moments, momentum), :meth:`node_state` and the transport codec's
        error-feedback residuals. A client of a population that keeps its state
        (``client_state="keep"``) carries its rows of these from one round to its next; the
        per-node step counts (:attr:`node_steps`) go with them."""
        tensors = _optimizer_rows(self.optimizer, self.nodes.num_nodes)
        tensors += list(self.node_state().values())
        residuals = getattr(self.transport_codec, "residuals", None)
        return tensors + list((residuals or {}).values())

    def restart_row(self, row: int) -> None:
        """Local row ``row`` starts afresh: zero inner optimizer state, step count 0, no
        residuals (a client that keeps no state, at the start of each of its rounds)."""
        if self.node_steps is None:
            self.node_steps = torch.full((self.nodes.num_nodes,), _count(self.optimizer),
                                         dtype=torch.long)
        for t in self.client_state():
            t[row].zero_()
        self.node_steps[row] = 0

    def node_state(self) -> dict[str, Tensor]:
        """The strategy's own node-stacked tensors besides the parameters, buffers and inner
        optimizer state (DeMo's momenta), which a recovering node copies from its donor."""
        return {}

    def copy_rows(self, tensors: Sequence[Tensor], src: int, dst: int, *, tag: str) -> None:
        """``dst``'s rows of node-stacked ``tensors`` <- ``src``'s, through :meth:`Communicator.
        send` (the bytes counted and timed)."""
        if not tensors:
            return
        sent = self.comm.send(list(tensors), src, dst, tag=tag)
        row = self._row(dst)
        if row is not None:
            for t, value in zip(tensors, sent, strict=True):
                t[row].copy_(value)

    def send_global(self, values: Sequence[Tensor], dst: int, src: int, *, tag: str) -> None:
        """Account a transfer of global (not node-stacked) tensors, e.g. a global model and an
        outer momentum, to ``dst`` (every process already holds the values): from peer ``src``,
        or through a server (``topology="server"``) a download from the server, which holds
        them (:meth:`Communicator.download`; ``src`` sends nothing)."""
        if values:
            n = self.comm.n_local
            rows = [v.unsqueeze(0).expand(n, *v.shape) for v in values]
            if self.comm.server:
                self.comm.download(rows, dst, tag=tag)
            else:
                self.comm.send(rows, src, dst, tag=tag)

    def _row(self, node: int) -> int | None:
        """This process's row of global node ``node`` (None if another process holds it)."""
        ids = self.comm.node_ids
        return ids.index(node) if node in ids else None

    def snapshot(self) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """Copies of node 0's parameters and buffers: a global/server model's starting point."""
        state = self.nodes.node_state(0)
        return ({k: state[k].clone() for k in self.nodes.params},
                {k: state[k].clone() for k in self.nodes.buffers})

    def all_reduce_with_buffers(
        self, payload: list[Tensor], buffers: list[Tensor], op: ReduceOp, *, tag: str,
        members: Sequence[bool] | None = None,
    ) -> tuple[list[Tensor], list[Tensor]]:
        """Reduce ``payload`` through the transport codec and the float ``buffers`` exactly,
        among ``members`` (None: every node).

        Without a codec one collective carries both (one record, tag ``tag``); with a codec the
        buffers travel uncompressed in a second one tagged ``"buffers"``.
        """
        codec = self.transport_codec
        if codec is None:
            reduced = list(self.comm.all_reduce(payload + buffers, op, tag=tag, members=members))
            return reduced[: len(payload)], reduced[len(payload):]
        out = list(self.comm.all_reduce(payload, op, tag=tag, codec=codec, members=members))
        return out, (list(self.comm.all_reduce(buffers, op, tag="buffers", members=members))
                     if buffers else [])

    @torch.no_grad()
    def recover_from_global(self, node: int, donor: int, params: dict[str, Tensor],
                            buffers: dict[str, Tensor], shared: Sequence[Tensor] = ()) -> None:
        """Recovery for a method with a global model (DiLoCo, FedAvg, FedOpt): the node gets
        the global ``params`` and float ``buffers`` and the method's ``shared`` state (an outer
        optimizer's momentum) from ``donor``, plus the donor's inner optimizer state
        (``recovery="copy"``) or a fresh one."""
        self.send_global([*params.values(), *(buffers[k] for k in self.nodes.float_buffers),
                          *shared], node, donor, tag="recovery")
        row = self._row(node)
        if row is not None:
            for k, p in self.nodes.params.items():
                p[row].copy_(params[k])
            for k, b in self.nodes.float_buffers.items():
                b[row].copy_(buffers[k])
        if self.recovery == "copy":
            self.copy_rows(_optimizer_rows(self.optimizer, self.nodes.num_nodes), donor, node,
                           tag="recovery")
        self._after_recovery(node, donor)

    @torch.no_grad()
    def adopt_buffers(
        self, means: list[Tensor], into: dict[str, Tensor], keep: Tensor | None = None
    ) -> None:
        """Float buffers: every node's (``keep``'s rows only, if given) and ``into`` <- ``means``;
        then the integer counters of ``into`` (``num_batches_tracked``) <- node 0's."""
        for (k, b), mean in zip(self.nodes.float_buffers.items(), means, strict=True):
            restart_rows(b, mean, keep)
            into[k].copy_(mean)
        self.copy_counters(into)

    def copy_counters(self, into: dict[str, Tensor]) -> None:
        """``into``'s integer buffers (``num_batches_tracked``) <- node 0's."""
        for k, b in self.nodes.buffers.items():
            if not b.is_floating_point():
                into[k].copy_(b[0])

    @property
    def overlap_steps(self) -> int | None:
        """Steps after its start by which an ``overlap=True`` collective's result is needed.

        The network clock lets such a collective run under that many steps of compute. None (the
        default): until the next collective with the same tag. Streaming DiLoCo returns its tau.
        """
        return None

    def communicates(self, step: int) -> bool | None:
        """Whether :meth:`step` of ``step`` may make a collective: False when it certainly
        makes none (a local step of a method that synchronises every ``H`` steps), None when
        it may (the default). A paged run (:mod:`exogym.run.nodes.paging`) saves a group before a
        step that may communicate, so that it can replay the step; a step that says False and
        communicates is an error there."""
        return None

    def _communicates_every_H(self, step: int, owner: type[StackedStrategy]) -> bool | None:
        """:meth:`communicates` of a method whose ``owner.step`` makes collectives only at the
        last step of every ``H``-step round (DiLoCo, FedAvg, FedOpt): False at the other steps;
        None for a subclass with a ``step`` of its own."""
        period = self.sync_period  # their H
        if type(self).step is not owner.step or period is None:
            return None
        return None if (step + 1) % period == 0 else False

    @property
    def sync_period(self) -> int | None:
        """Steps between the synchronisations that update the whole global model (the paper's
        ``H``), or None for a method that synchronises every step. The trainer refuses a run
        shorter than this (the global model would stay the initial one) unless told otherwise.
        Default: the field ``H`` if the strategy has one."""
        period = getattr(self, "H", None)
        return period if isinstance(period, int) else None

    @property
    def lr(self) -> float:
        """The current inner learning rate."""
        return float(self.optimizer.param_groups[0]["lr"])

    def hyperparameters(self) -> dict[str, Any]:
        """Every field, nested configs flattened as ``optim.lr``; for logs and summaries."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if hasattr(value, "__dataclass_fields__"):
                for sub in fields(value):
                    out[f"{f.name}.{sub.name}"] = getattr(value, sub.name)
            else:
                out[f.name] = value
        return out



# what setup() binds the strategy to: not its state
_BINDING = ("nodes", "comm", "total_steps", "run_seed")


def _count(optimizer: torch.optim.Optimizer) -> int:
    """The optimizer's own step count (every node's while they stepped together)."""
    for state in optimizer.state.values():
        step = state.get("step")
        if step is not None:  # one count (torch), or one per node (Muon's): the largest
            return int(step.max()) if isinstance(step, Tensor) else int(step)
    return 0


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> list[Tensor]:
    """Every tensor of an optimizer's state but its step counts (an outer optimizer's momentum,
    Adam's moments): what a recovering node receives of a shared optimizer."""
    return [v for state in optimizer.state.values() for k, v in state.items()
            if isinstance(v, Tensor) and k != "step"]


def _optimizer_rows(optimizer: torch.optim.Optimizer, n_local: int) -> list[Tensor]:
    """The node-stacked tensors of an optimizer's state (moments, momentum buffers)."""
    out = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            for value in optimizer.state.get(p, {}).values():
                if isinstance(value, Tensor) and value.dim() >= 1 and value.shape[0] == n_local:
                    out.append(value)
    return out


def restart_rows(stacked: Tensor, value: Tensor, keep: Tensor | None = None) -> None:
    """Every row of node-stacked ``stacked`` (``keep``'s rows only, if given) becomes ``value``."""
    if keep is None:
        stacked.copy_(value.expand_as(stacked))
    else:
        mask = keep.view(-1, *([1] * (stacked.dim() - 1)))
        stacked.copy_(torch.where(mask, value.unsqueeze(0), stacked))

