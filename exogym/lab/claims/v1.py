"""``claims-v1``: the published claims of ``claims-v0``, decided as a reviewer would accept.

What changed from ``claims-v0`` (:mod:`exogym.lab.claims.v0`, kept as it was recorded):

- **Intervals that cover**: Student's t-interval on each rule's per-seed paired statistic
  (:mod:`exogym.lab.claims.intervals`; its coverage is checked by simulation in the tests), not
  a bootstrap of 3 to 5 seeds (75 to 85% coverage).
- **Test seeds apart from the pilot's**: ``claims-v0``'s recorded seeds 0 to 4 are the pilot
  (their per-seed values, quoted in each claim's ``pilot``, set the seed count and the
  margins); the test seeds are 10 and up, never 0 to 4. Five at least; more where the pilot's
  spread and the rule's smallest effect ask for them and the 2-hour budget allows (a rule
  whose effect needs more says so: underpowered).
- **One margin policy for "matches"** (an equivalence rule: the whole interval inside the
  margin): on an image task, the difference of final accuracies within +-0.5 points
  (:data:`MATCH_POINTS`); on a language task, the ratio of final losses within +-1%
  (:data:`MATCH_RATIO`). Both are the resolution at which the papers call two methods equal
  (DiLoCo's Table 2: 15.02 against 15.30 perplexity, 0.7% in loss; FedProx's and FedAvg's
  figures move by points of accuracy). ``claims-v0`` used +0.02 in loss, 40-50% of DDP's final
  loss on its MNIST runs.
- **Quantities fixed by the configuration are reported, never evidence**: a schedule's bytes
  (DiLoCo at H = 50 sends 1/50 of DDP's) are shown beside the verdict.
- **Time to a target is censored**: both runs of a seed are read up to their common budget
  (the shorter one's simulated time), a run that does not reach the target by then counts as
  the budget, never as infinity (:attr:`exogym.lab.claims.spec.Rule.censored`).
- **Controls**: a null claim (DiLoCo against itself on other data orders: must come out
  equivalent) and a negative one (DiLoCo whose outer step drops the pseudo-gradient:
  :mod:`exogym.lab.claims.controls`, must come out not reproduced). If either fails, the suite
  publishes no verdict.
- **The methods as their papers define them**: FedAvg weights each model by its examples
  (McMahan et al.'s Algorithm 1), its stragglers follow the run's seed, MuLoCo keeps the outer
  layers on AdamW by role, FedAvg against FedSGD on the paper's CNN
  (``mnist-cnn-mcmahan-v0``), FedProx's proximal term tested against ``mu = 0``, FedBuff
  against its paper's synchronous baseline (FedAvgM), SPARTA at the paper's ``p = 0.1%``.
- **The papers' own words**: each ``paper_figure`` quotes the paper (table, figure or
  sentence) where its text was reached, and says what was tried where it was not.

Every rule here was written before any of its test seeds ran (2026-12-07). Each results folder
records its commit, versions, machine and times (:mod:`exogym.lab.claims.provenance`).
"""

from __future__ import annotations

from dataclasses import replace

from exogym.lab.claims import v0
from exogym.lab.claims.spec import Claim, Config, Paper, Rule

__all__ = ["CLAIMS", "MATCH_POINTS", "MATCH_RATIO", "SUITE", "matches"]

SUITE = "claims-v1"

MATCH_POINTS = 0.005
"""An image task's equivalence margin: final accuracies within half a point."""
MATCH_RATIO = 0.01
"""A language task's equivalence margin: final losses within 1% of each other."""

_MATCH = (-MATCH_POINTS, MATCH_POINTS)
_MATCH_R = (1 - MATCH_RATIO, 1 + MATCH_RATIO)
_TEST = {"first_seed": 10, "interval": "t"}
_EIGHT, _FOUR, _QUICK = v0._EIGHT, v0._FOUR, v0._QUICK
_DILOCO = v0._DILOCO


def _v1(claim: Claim, *, rules: tuple[Rule, ...], paper_figure: str, pilot: str,
        seeds: int = 5, **changes: object) -> Claim:
    """``claim`` (v0's) as a v1 claim: its rules, the paper's words, the pilot, the seeds."""
    return replace(claim, rules=rules, paper_figure=paper_figure, pilot=pilot, seeds=seeds,
                   **_TEST, **changes)  # type: ignore[arg-type]


def matches(text: str, a: str, b: str) -> Rule:
    """An image task's "a matches b": final accuracy(a) - accuracy(b) within +-0.5 points."""
    return Rule(f"{text}: final accuracy({a}) - accuracy({b}) within +-0.5 points (the whole "
                "95% interval)", "final_accuracy", a, b, "diff", "below", 0.0,
                kind="equivalence", margin=_MATCH, effect=MATCH_POINTS / 2)


def _bytes(text: str, a: str, b: str, threshold: float) -> Rule:
    """A schedule's bytes: reported beside the verdict, fixed by the configuration."""
    return Rule(f"bytes per node({a}) / bytes({b}), {text} (fixed by the configuration: "
                "reported)", "bytes_per_node", a, b, "ratio", "below", threshold,
                kind="reported")


NULL_CONTROL = Claim(
    id="control-null-data-order",
    paper=Paper("exogym", 2026, "the suite's null control", "exogym/lab/claims/v1.py"),
    where="-", claim="DiLoCo (H = 50) matches itself trained on other data orders",
    paper_figure="equal by construction: a method is its own match",
    scale="as diloco-matches-ddp: 8 nodes, 400 steps", task="mnist", common=_EIGHT,
    configs=(Config("diloco", "diloco", {"H": "50"}),
             Config("diloco-other-order", "diloco", {"H": "50"}, data_offset=1000)),
    rules=(matches("the same method", "diloco", "diloco-other-order"),),
    seeds=5, quick=_QUICK, control="null", **_TEST,  # type: ignore[arg-type]
    pilot="none needed: the margin is the suite's; five seeds")

NEGATIVE_CONTROL = Claim(
    id="control-negative-broken-diloco",
    paper=Paper("exogym", 2026, "the suite's negative control", "exogym/lab/claims/v1.py"),
    where="-", claim="DiLoCo whose outer step drops the pseudo-gradient matches DDP",
    paper_figure="false by construction: its global model never leaves the initial one",
    scale="as diloco-matches-ddp: 8 nodes, 400 steps", task="mnist", common=_EIGHT,
    configs=(Config("ddp", "ddp"),
             Config("broken", "exogym.lab.claims.controls:DiLoCoWithoutOuterStep",
                    {"H": "50"})),
    rules=(matches("a broken method", "broken", "ddp"),),
    seeds=5, quick=_QUICK, control="negative", **_TEST,  # type: ignore[arg-type]
    pilot="none needed: five seeds")

DILOCO_MATCHES_DDP = _v1(
    v0.DILOCO_MATCHES_DDP,
    where="abstract; Table 2; Section 3",
    paper_figure="Table 2 (150M transformer, C4, 8 workers, H = 500, 88,000 steps): DiLoCo "
                 "15.02 perplexity against 15.30 for data parallelism at 8x batch (same compute "
                 "and data) and 14.72 for 8x updates, 'at the cost of being 8x slower'; "
                 "'communicates H = 500x less' (Section 3). It beats the same-compute baseline, "
                 "not every one",
    rules=(matches("DiLoCo H = 50 matches DDP at equal steps", "diloco-h50", "ddp"),
           _bytes("1/50 by H = 50", "diloco-h50", "ddp", 1 / 45)),
    pilot="v0 seeds 0-4: loss differences -0.009 to +0.011 (accuracy not recorded); five "
          "seeds, the suite's least")

DILOCO_NESTEROV = _v1(
    v0.DILOCO_NESTEROV,
    where="Section 3.1, Figure 6; Table 5 (the search grid)",
    paper_figure="'outer learning rate equal to 0.7 and outer momentum equal to 0.9 is very "
                 "robust'; SGD 'or Adam ... performed poorly' (Adam needed its epsilon raised "
                 "to 0.1); a plot only, no numbers",
    rules=(Rule("final loss(Nesterov) - loss(SGD, lr 1 = averaging): the 95% interval below 0",
                "final_loss", "nesterov", "sgd", "diff", "below", 0.0, effect=0.005),
           Rule("final loss(Nesterov) - loss(Adam, lr 0.1, eps 0.1): the 95% interval below 0",
                "final_loss", "nesterov", "adam", "diff", "below", 0.0, effect=0.005)),
    pilot="v0 seeds 0-4: -0.0134 to -0.0054 against SGD (sd 0.0034), -0.049 to -0.044 "
          "against Adam (sd 0.002): five seeds resolve 0.005")

DILOCO_NON_IID = _v1(
    v0.DILOCO_NON_IID,
    where="Figure 5; Table 3",
    paper_figure="'DiLoCo converges faster in the i.i.d. setting but towards the end both data "
                 "regimes attain similar generalization'; Table 3, 8 workers: 15.08 (i.i.d.) "
                 "and 15.02 (non-i.i.d.) perplexity",
    rules=(matches("DiLoCo on Dirichlet(0.1) shards matches i.i.d. shards", "non-iid", "iid"),),
    pilot="v0 seeds 0-4: i.i.d. minus Dirichlet(0.1) accuracy 3.3 to 6.6 points: far outside "
          "any margin; five seeds")

DILOCO_REPLICAS_AND_H = _v1(
    v0.DILOCO_REPLICAS_AND_H,
    where="Table 3 (replicas); Figure 4 (H)",
    paper_figure="Table 3, i.i.d.: 1 replica 16.23, 4: 15.23, 8: 15.08, 16: 15.02, 64: 14.95 "
                 "perplexity ('diminishing returns' past 8); Figure 4: 'when H = 1000 the "
                 "perplexity increases by only 2.9% relative to H = 50'",
    rules=(Rule("final loss(8 replicas) - loss(2 replicas), H = 50: the 95% interval below 0",
                "final_loss", "m8-h50", "m2-h50", "diff", "below", 0.0, effect=0.005),
           Rule("final loss(H = 10) - loss(H = 50), 4 replicas: the 95% interval below 0",
                "final_loss", "m4-h10", "m4-h50", "diff", "below", 0.0, effect=0.005),
           Rule("final accuracy(H = 50) - accuracy(H = 200), 4 replicas: the 95% interval "
                "below 0.02 (4x the period costs under two points)", "final_accuracy",
                "m4-h50", "m4-h200", "diff", "below", 0.02, effect=0.01)),
    pilot="v0 seeds 0-4: 8 against 2 replicas -0.025 to -0.006 (sd 0.007); H = 10 against 50 "
          "-0.007 to +0.003 (sd 0.004: an effect of 0.005 needs 6 seeds); H = 50 against 200 "
          "0.35 to 0.92 points", seeds=6)

STREAMING_DILOCO = _v1(
    v0.STREAMING_DILOCO,
    where="Sections 2.2-2.4, 3.3; Table 1; Table 4",
    paper_figure="'the peak communication is reduced by a factor of |p|/L'; Table 1 (1B model, "
                 "H = 100): eval loss 2.67 (data parallel) and 2.66 (Streaming DiLoCo, FP4, "
                 "overlapped) at 25B tokens, '400x fewer bits, reducing the peak bandwidth by "
                 "8x'; an overlap of up to 10 inner steps costs '<0.2%'",
    rules=(Rule("peak bytes per step(P = 4, FP32, no overlap) / peak(DiLoCo): below 0.35 "
                "(1/P = 0.25, fragments of unequal size; fixed by the configuration: reported)",
                "peak_bytes_per_step", "streaming-fp32", "diloco", "ratio", "below", 0.35,
                kind="reported"),
           Rule("final loss(P = 4, FP32) / loss(DiLoCo) within 1 +- 1%", "final_loss",
                "streaming-fp32", "diloco", "ratio", "below", 1.0, kind="equivalence",
                margin=_MATCH_R, effect=MATCH_RATIO / 2),
           Rule("final loss(P = 4, tau = 1, FP4) / loss(DiLoCo) within 1 +- 1%", "final_loss",
                "streaming-fp4-tau1", "diloco", "ratio", "below", 1.0, kind="equivalence",
                margin=_MATCH_R, effect=MATCH_RATIO / 2)),
    pilot="v0 seeds 0-2: ratios 0.990 to 0.998 (sd 0.003): five seeds resolve 0.5%")

DILOCO_CODECS = _v1(
    v0.DILOCO_CODECS,
    where="OpenDiLoCo: abstract; INTELLECT-1: abstract (their bodies not reached here)",
    paper_figure="OpenDiLoCo: pseudo-gradients 'can be all-reduced using FP16 without any "
                 "performance degradation'; INTELLECT-1: 'our custom int8 all-reduce ... 400x "
                 "reduction in communication bandwidth ... while delivering comparable "
                 "performance' (abstracts; the papers' tables not reached: full-text searches "
                 "for 'all-reduce in FP16' and 'int8 quantization on the pseudo' found none)",
    rules=(matches("FP16 pseudo-gradients match FP32", "fp16", "fp32"),
           matches("int8 pseudo-gradients match FP32", "int8", "fp32")),
    pilot="v0 seeds 0-4: loss differences within 0.001 of FP32; five seeds")

FEDAVG_ROUNDS = _v1(
    v0.FEDAVG_ROUNDS,
    task="mnist-cnn-mcmahan-v0",
    # the paper's CNN costs about 8x v0's a step here: FedSGD 500 rounds (it reached 96% by
    # round 200 in a trial of this CNN), FedAvg 20 rounds of 20 steps
    configs=(Config("fedsgd", "fedavg", {"H": "1", "optim.name": "sgd", "optim.lr": "0.05"},
                    {"batch_size": 20, "max_steps": 500, "eval_interval": 10}),
             Config("fedavg", "fedavg", {"H": "20", "optim.name": "sgd", "optim.lr": "0.05"},
                    {"batch_size": 10, "max_steps": 400, "eval_interval": 20})),
    where="Table 2 (MNIST CNN, C = 0.1, 99% target); Section 3 (the CNN)",
    paper_figure="Table 2, IID: FedSGD 626 rounds to 99%, FedAvg E = 5, B = 10 (u = 300) 20 "
                 "rounds (31.3x), E = 1, B = 10 (u = 60) 34 (18.4x); non-IID: FedSGD 483, "
                 "FedAvg 173 to 1000 (2.8x to 0.5x); the CNN: 'two 5x5 convolution layers (32 "
                 "and 64 channels) ... a fully connected layer with 512 units ... (1,663,370 "
                 "total parameters)'",
    # not censored: the two run other numbers of rounds by design (FedSGD a step a round), so
    # no common budget exists; both reached 95% on every v0 seed
    rules=(Rule("rounds to 95% accuracy, FedSGD / FedAvg: the 95% interval above 10",
                "rounds_to_accuracy", "fedsgd", "fedavg", "ratio", "above", 10.0, target=0.95,
                effect=3.0),),
    pilot="v0 seeds 0-2 (its smaller CNN): 15.4, 15.7, 19.2 (sd 2.1): five seeds resolve 3",
    scale="paper: the 1.66M-parameter CNN, 100 IID clients, C = 0.1, 99%; here: the same CNN "
          "(mnist-cnn-mcmahan-v0), 100 IID clients, 10 a round, FedSGD one step of batch 20 a "
          "round against FedAvg 20 steps of batch 10 (plain SGD, lr 0.05), target 95% on 1,000 "
          "test images")

FEDADAM_NON_IID = _v1(
    v0.FEDADAM_NON_IID,
    where="abstract (Table 2 not reached here)",
    paper_figure="adaptive server optimizers 'can significantly improve the performance of "
                 "federated learning' (abstract); Table 2 not reached (searches for its task "
                 "names and 'over the last 100 rounds' found no full text)",
    rules=(Rule("final accuracy(FedAdam) - accuracy(FedAvg, weighted by examples): the 95% "
                "interval above 0", "final_accuracy", "fedadam", "fedavg", "diff", "above",
                0.0, effect=0.01),),
    pilot="v0 seeds 0-4 (FedAvg then unweighted): +0.7 to +5.8 points (sd 1.9): an effect of "
          "one point would need 32 seeds; five resolve about 2.5 points (underpowered for 1)")

FEDPROX_STRAGGLERS = _v1(
    v0.FEDPROX_STRAGGLERS,
    where="Section 5.2; Figure 1; Section 5.3.2",
    paper_figure="'FedAvg will simply drop these 0%, 50%, and 90% stragglers'; 'incorporating "
                 "variable amounts of work (FedProx, mu = 0) is beneficial'; 'mu > 0 leads to "
                 "more stable convergence and enables otherwise divergent methods to converge' "
                 "(best mu 1 on MNIST, from {0.001, 0.01, 0.1, 1}); +22% absolute accuracy on "
                 "average at 90% stragglers",
    rules=(Rule("final accuracy(FedProx mu = 0, partial work) - accuracy(FedAvg, stragglers "
                "dropped): the 95% interval above 0", "final_accuracy", "fedprox-mu0",
                "fedavg-drop", "diff", "above", 0.0, effect=0.03),
           Rule("final accuracy(FedProx mu = 1) - accuracy(FedProx mu = 0): the 95% interval "
                "above 0 (the proximal term helps, the paper's second half)",
                "final_accuracy", "fedprox-mu1", "fedprox-mu0", "diff", "above", 0.0,
                effect=0.01)),
    pilot="v0 seeds 0-4: mu = 0 against dropping +3.5 to +13.3 points; mu = 1 minus mu = 0 "
          "-3.0 to -1.7 points (worse on every seed: the second rule is expected to fail)")

FEDBUFF_FASTER = _v1(
    v0.FEDBUFF_FASTER,
    where="abstract (AISTATS; arXiv v1); the body not reached here",
    paper_figure="'FedBuff is 3.3x more efficient than synchronous FL' (AISTATS abstract); "
                 "'converges up to 3.8x faster than ... synchronous FL (e.g., FedAvgM)' (arXiv "
                 "v1): the synchronous baseline is FedAvg with server momentum; whether 3.3x "
                 "counts client updates or time was not reached (full text not found)",
    configs=(Config("fedbuff", "fedbuff", {"H": "10", "K": "10"},
                    {"concurrency": 100, "max_steps": 800}),
             Config("fedavgm", "fedavgm", {"H": "10"},
                    {"participation": "100", "max_steps": 300})),
    rules=(Rule("simulated time to 90% accuracy, FedAvgM / FedBuff (censored at the pair's "
                "simulated time): the 95% interval above 1", "time_to_accuracy", "fedavgm",
                "fedbuff", "ratio", "above", 1.0, target=0.9, censored=True, effect=0.5),),
    pilot="v0 seeds 0-2 (against FedAvg): ratios 3.6 to 5.4 (sd 1.0); three seeds resolve "
          "0.5 only with an effect this large: the suite's 2-hour budget gives this 10,000-"
          "client claim 3", seeds=3)

ASYNC_LOCAL_SGD = _v1(
    v0.ASYNC_LOCAL_SGD,
    where="Tables 1-4; footnote 5",
    paper_figure="Table 1 (20M model, heterogeneity none to very): synchronous DiLoCo 41.35 "
                 "perplexity, asynchronous DiLoCo 44.27 to 44.38, DN + DyLU 41.09 to 41.27 "
                 "(footnote 5: its small lead 'is due to the numerical error')",
    rules=(Rule("final loss(naive asynchronous) - loss(DiLoCo): the 95% interval above 0",
                "final_loss", "async-nesterov", "diloco", "diff", "above", 0.0, effect=0.05),
           matches("DN + DyLU matches DiLoCo", "async-dn-dylu", "diloco"),
           Rule("simulated time to 95% accuracy, DiLoCo / DN + DyLU (censored at the pair's "
                "simulated time): the 95% interval above 1", "time_to_accuracy", "diloco",
                "async-dn-dylu", "ratio", "above", 1.0, target=0.95, censored=True,
                effect=0.1)),
    pilot="v0 seeds 0-4: naive minus DiLoCo loss +25 to +104; DN + DyLU minus DiLoCo +0.10 "
          "to +0.14 in loss; its time rule was decided by an infinity (never reached): now "
          "censored")

DEMO_VS_DDP = _v1(
    v0.DEMO_VS_DDP,
    where="abstract (v1 and v2); the table not reached here",
    paper_figure="v1: 'reduces inter-accelerator communication requirements by several orders "
                 "of magnitude' and models 'match or exceed' AdamW; v2 (2026): 'up to 85x less "
                 "data per GPU than AdamW-DDP while achieving comparable loss and accuracy' "
                 "(under two orders of magnitude)",
    rules=(matches("DeMo matches AdamW DDP", "demo", "ddp"),
           _bytes("1/16 by DeMo's defaults", "demo", "ddp", 0.1)),
    pilot="v0 seeds 0-4: loss differences -0.015 to -0.001; five seeds")

SPARTA_VS_DDP = _v1(
    v0.SPARTA_VS_DDP,
    where="abstract; the EXO blog (the OpenReview text not reached here)",
    paper_figure="abstract: SPARTA 'outperforms ... DiLoCo in both bandwidth efficiency and "
                 "practical robustness'; EXO's post: 'more than 1,000x reduction in "
                 "communication without major degradation' with p = 0.1% of the parameters a "
                 "step, against averaging every step (DDP-like), not DiLoCo",
    configs=(Config("ddp", "ddp"), Config("sparta", "sparta", {"p": "0.001"})),
    rules=(matches("SPARTA (p = 0.1%) matches DDP", "sparta", "ddp"),
           _bytes("1/1000 by p = 0.1%", "sparta", "ddp", 0.002)),
    pilot="v0 seeds 0-4 at p = 0.5%: loss +0.014 to +0.028 over DDP; five seeds")

SPARSELOCO_MULOCO = _v1(
    v0.SPARSELOCO_MULOCO,
    where="SparseLoCo: abstract; MuLoCo: abstract v1 and v2 (tables not reached here)",
    paper_figure="SparseLoCo: 'extreme sparsity as low as 1-3% [2-bit] while outperforming "
                 "full-precision DiLoCo'; MuLoCo v1: 'significantly outperforms DiLoCo while "
                 "communicating 8X less', v2: better than DiLoCo 'in absolute terms'; MuLoCo's "
                 "code keeps embeddings and the output layer on AdamW",
    rules=(Rule("final loss(SparseLoCo) - loss(DiLoCo): the 95% interval below 0", "final_loss",
                "sparseloco", "diloco", "diff", "below", 0.0, effect=0.01),
           _bytes("under 1/10 by top-k and 2 bits", "sparseloco", "diloco", 0.1),
           Rule("final loss(MuLoCo, outer layers on AdamW) - loss(DiLoCo): the 95% interval "
                "below 0", "final_loss", "muloco", "diloco", "diff", "below", 0.0,
                effect=0.01)),
    pilot="v0 seeds 0-4: SparseLoCo +0.053 to +0.069 over DiLoCo; MuLoCo +0.019 to +0.074 "
          "(its CNN's outer layers then on Muon); five seeds")

DESLOC = _v1(
    v0.DESLOC,
    where="abstract (the body not reached here)",
    paper_figure="'DES-LOC can communicate 170x less than DDP and 2x less than the previous "
                 "state-of-the-art Local ADAM' on models 'up to 1.7B' (abstract)",
    rules=(matches("DES-LOC matches DDP", "desloc", "ddp"),
           _bytes("1/16 + 1/48 + 1/48 = 0.104 of DDP's", "desloc", "ddp", 0.125),
           matches("DES-LOC matches Local Adam", "desloc", "local-adam"),
           _bytes("5/9 of Local Adam's", "desloc", "local-adam", 0.6)),
    pilot="v0 seeds 0-4: loss +0.003 to +0.017 over DDP, within 0.003 of Local Adam; five "
          "seeds")

DILOCO_ONE_REPLICA = _v1(
    v0.DILOCO_ONE_REPLICA,
    where="abstract; Introduction; Table 4",
    paper_figure="'When well-tuned, DiLoCo scales better than data-parallel training'; 'DiLoCo "
                 "with M = 1 achieves lower evaluation loss at all model scales': Table 4, 35M "
                 "3.482 against 3.485 (-0.1%), 1.3B 2.451 against 2.460, 2.4B 2.317 against "
                 "2.326 (-0.4%); H = 30, outer Nesterov momentum 0.9",
    rules=(Rule("final loss(DiLoCo M = 1) - loss(plain), batch 32: the 95% interval below 0",
                "final_loss", "diloco-b32", "dp-b32", "diff", "below", 0.0, effect=0.01),
           Rule("final loss(DiLoCo M = 1) - loss(plain), batch 256: the 95% interval below 0",
                "final_loss", "diloco-b256", "dp-b256", "diff", "below", 0.0, effect=0.01)),
    pilot="v0 seeds 0-4: +0.014 to +0.065 at batch 32, -0.010 to +0.044 at batch 256 (sd "
          "0.021: an effect of 0.01 needs more than the budget's 6 seeds: underpowered); the "
          "paper's 'well-tuned' outer learning rate is not swept here", seeds=6)

CLAIMS: tuple[Claim, ...] = (NULL_CONTROL, NEGATIVE_CONTROL,
                             DILOCO_MATCHES_DDP, DILOCO_NESTEROV, DILOCO_NON_IID,
                             DILOCO_REPLICAS_AND_H, STREAMING_DILOCO, DILOCO_CODECS,
                             FEDAVG_ROUNDS, FEDADAM_NON_IID, FEDPROX_STRAGGLERS, FEDBUFF_FASTER,
                             ASYNC_LOCAL_SGD, DEMO_VS_DDP, SPARTA_VS_DDP, SPARSELOCO_MULOCO,
                             DESLOC, DILOCO_ONE_REPLICA)
"""The suite: the two controls first, then v0's 16 claims as v1 decides them."""
