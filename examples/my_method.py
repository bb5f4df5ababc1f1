"""TopKDiLoCo: DiLoCo whose pseudo-gradient travels top-k sparsified, with error feedback.

The README's example of "your own method in one file": a variant of a built-in strategy is a
subclass that changes what it needs, here two defaults of DiLoCo's transport settings. Run it as
any strategy, from the repository's root::

    exogym run --task mnist --strategy examples/my_method.py:TopKDiLoCo --set H=50 --nodes 4 \\
        --steps 500
    exogym compare --task mnist --strategies ddp,diloco,examples/my_method.py:TopKDiLoCo,\\
examples/my_method.py:TopKDiLoCo-h10 --set TopKDiLoCo-h10.H=10 --nodes 4 --steps 500
    exogym check examples/my_method.py:TopKDiLoCo --set H=2

The method. DiLoCo (A. Douillard et al., "DiLoCo: Distributed Low-Communication Training of
Language Models", arXiv:2311.08105, Algorithm 1; :mod:`exogym.strategy.diloco`): every node takes
``H`` inner AdamW steps, then the nodes average their pseudo-gradients
``Delta_i = theta^(t-1) - theta_i^(t)`` and an outer Nesterov step updates the global model. Here
each node sends only the ``k = ceil(F n)`` largest-magnitude entries of each pseudo-gradient
tensor of ``n`` entries (top-k sparsification) and keeps what it did not send for the next outer
step (error feedback: it sends ``c = TopK(Delta_i + e_i)`` and keeps ``e_i <- Delta_i + e_i - c``;
S. U. Stich, J.-B. Cordonnier, M. Jaggi, "Sparsified SGD with Memory", NeurIPS 2018; S. P.
Karimireddy et al., "Error Feedback Fixes SignSGD and other Gradient Compression Schemes", ICML
2019). The outer step uses the mean of the sparse messages. Both parts are exogym's transport
codec (:mod:`exogym.sim.codecs`, ``topk:F`` with ``error_feedback``), which DiLoCo already passes
its pseudo-gradient through: this class only makes it the default and refuses any other codec.
SparseLoCo (:mod:`exogym.strategy.sparseloco`, arXiv:2508.15706) is the published, more elaborate
relative (an error-feedback accumulator in place of the outer momentum, chunked top-k, 2-bit
values).

Sent per outer step by each node: every node picks its own indices, so the mean cannot be summed
along a ring; the messages travel as an all-gather, ``(N-1) * S`` bytes with
``S = sum over tensors of 8 k`` (``k`` fp32 values and ``k`` int32 indices), plus an exact
all-reduce of the float buffers if the model has any. The MNIST CNN at ``F = 0.01`` keeps
4 + 1 + 128 + 1 + 2,008 + 2 + 13 + 1 = 2,158 entries, ``S`` = 17,264 bytes: 51,792 bytes per node
per outer step at ``N = 4`` (DiLoCo sends 1,292,220).
"""

from __future__ import annotations

from dataclasses import dataclass

from exogym.strategy import DiLoCo


@dataclass(kw_only=True)
class TopKDiLoCo(DiLoCo):
    """DiLoCo with its pseudo-gradient sent top-k sparsified and error feedback on.

    Every hyperparameter of DiLoCo applies (``H``, ``outer_lr``, ...); dropping outer gradients
    (``q > 0``) is refused, as DiLoCo refuses it with error feedback.

    Attributes:
        codec: the pseudo-gradient's transport codec, ``topk:F``: each node sends the
            ``ceil(F n)`` largest-magnitude entries of each tensor of ``n`` entries.
        error_feedback: each node keeps the entries it did not send and adds them to its next
            pseudo-gradient (False: they are lost).
    """

    codec: str | None = "topk:0.01"
    error_feedback: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()  # DiLoCo's checks, and the codec spec's (F in (0, 1])
        if not (isinstance(self.codec, str) and self.codec.strip().lower().startswith("topk:")):
            raise ValueError(f"codec must be topk:F with F in (0, 1] (TopKDiLoCo sends its "
                             f"pseudo-gradient top-k sparsified), got {self.codec!r}; for another "
                             "codec use diloco --set codec=...")
