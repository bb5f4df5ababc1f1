"""The claims suite's machinery: the statistics and verdicts worked by hand, the specs' checks,
the runner (resumable, a changed spec refused) and ``exogym claims --quick`` end to end (a check
of the machinery, never of the verdicts)."""

from __future__ import annotations

import json
import math
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from exogym.cli import main
from exogym.lab.claims import (
    CLAIMS,
    SUITE,
    SUITES,
    Claim,
    Config,
    Paper,
    Rule,
    run_claims,
    select,
)
from exogym.lab.claims.measure import RunRecord
from exogym.lab.claims.provenance import DirtyTreeError, checked_source, source_state
from exogym.lab.claims.report import format_markdown
from exogym.lab.claims.stats import bootstrap_ci, claim_verdict, decide, per_seed
from exogym.lab.claims.suite import ClaimOutcome, command_of, fingerprint


# -- measures -----------------------------------------------------------------------------------
def test_measures_read_from_a_run_by_hand() -> None:
    summary = {"strategy": "fedavg", "hyperparameters": {"H": 20},
               "final": {"eval_loss": 0.5, "eval_accuracy": 0.9}, "sim_time_s": 7.0,
               "bytes_sent_per_node": [10.0, 30.0]}
    evals = [{"step": 20, "sim_time_s": 1.0, "eval_accuracy": 0.5},
             {"step": 60, "sim_time_s": 3.0, "eval_accuracy": 0.95}]
    # bytes: 0 by step 1, 4 by step 2, 4 by step 3, 10 by step 5 (3 a step over two steps)
    logged = [{"step": s, "bytes_sent": b} for s, b in ((1, 0.0), (2, 4.0), (3, 4.0), (5, 10.0))]
    run = RunRecord(summary, evals, logged)
    assert run.value("bytes_per_node") == 30.0
    assert run.value("steps_to_accuracy", 0.9) == 60.0
    assert run.value("time_to_accuracy", 0.9) == 3.0
    assert run.value("rounds_to_accuracy", 0.9) == 3.0  # 60 steps / H = 20
    assert run.value("rounds_to_accuracy", 0.99) == math.inf
    assert run.value("peak_bytes_per_step") == 4.0
    no_h = RunRecord({**summary, "strategy": "ddp", "hyperparameters": {}}, evals, logged)
    with pytest.raises(ValueError, match="'ddp' has H = None"):
        no_h.value("rounds_to_accuracy", 0.9)
    with pytest.raises(ValueError, match="set log_interval"):
        RunRecord(summary, evals).value("peak_bytes_per_step")


# -- statistics ---------------------------------------------------------------------------------
def test_per_seed_differences_and_ratios_by_hand() -> None:
    assert per_seed([3.0, 5.0], [1.0, 2.0], "diff") == [2.0, 3.0]
    assert per_seed([3.0, 5.0], [1.0, 2.0], "ratio") == [3.0, 2.5]
    assert per_seed([math.inf], [2.0], "ratio") == [math.inf]
    assert math.isnan(per_seed([math.inf], [math.inf], "diff")[0])  # neither reached
    assert math.isnan(per_seed([0.0], [0.0], "ratio")[0])


def test_the_bootstrap_interval_by_hand() -> None:
    """Two seeds 0 and 1: a resample's mean is 0 (prob 1/4), 0.5 (1/2) or 1 (1/4), so the 2.5%
    and 97.5% quantiles are 0 and 1. Three seeds 0, 0, 3: the mean is 0 with prob 8/27 and 3
    with prob 1/27 (> 2.5%): the interval is [0, 3]. One seed, or equal values: the point."""
    assert bootstrap_ci([0.0, 1.0]) == (0.0, 1.0)
    assert bootstrap_ci([0.0, 0.0, 3.0]) == (0.0, 3.0)
    assert bootstrap_ci([0.7]) == (0.7, 0.7) and bootstrap_ci([2.0, 2.0, 2.0]) == (2.0, 2.0)
    lo, hi = bootstrap_ci([1.0, 2.0, 3.0, 4.0, 5.0])
    assert 1.0 < lo < 3.0 < hi < 5.0
    assert bootstrap_ci([1.0, 2.0, 3.0, 4.0, 5.0]) == (lo, hi)  # a fixed generator
    # nine zeros and a one: a resample's median is above 0 only with 5 or more ones
    # (Binomial(10, 0.1): p = 0.0016 < 0.025), its mean reaches 0.3 with p = 0.070 > 0.025 and
    # 0.4 with p = 0.013: the 97.5% quantiles are 0 and 0.3
    assert bootstrap_ci([0.0] * 9 + [1.0], statistic="median") == (0.0, 0.0)
    lo, hi = bootstrap_ci([0.0] * 9 + [1.0])
    assert lo == 0.0 and hi == pytest.approx(0.3)
    with pytest.raises(ValueError, match="'mean' or 'median'"):
        bootstrap_ci([1.0, 2.0], statistic="mode")  # type: ignore[arg-type]


def test_verdicts_by_where_the_interval_lies() -> None:
    assert decide([0.01, 0.02, 0.015], "below", 0.05).verdict == "reproduced"
    assert decide([0.06, 0.07, 0.08], "below", 0.05).verdict == "not reproduced"
    assert decide([0.0, 0.1], "below", 0.05).verdict == "inconclusive"  # CI [0, 0.1]
    assert decide([2.0, 3.0], "above", 1.0).verdict == "reproduced"
    assert decide([0.5, 0.9], "above", 1.0).verdict == "not reproduced"
    assert decide([math.inf, 3.0], "above", 1.0).verdict == "reproduced"  # one never reached
    assert decide([math.nan, 3.0], "above", 1.0).verdict == "inconclusive"
    o = decide([1.0, 3.0], "above", 0.0)
    assert o.mean == 2.0 and o.ci == (1.0, 3.0) and o.values == (1.0, 3.0)
    assert claim_verdict(["reproduced", "reproduced"]) == "reproduced"
    assert claim_verdict(["reproduced", "not reproduced", "inconclusive"]) == "not reproduced"
    assert claim_verdict(["reproduced", "inconclusive"]) == "inconclusive"
    # one seed (--quick) is a value, not a verdict
    one = decide([0.2741], "below", 0.05)
    assert one.verdict == "not decided" and one.mean == 0.2741 and all(map(math.isnan, one.ci))
    assert claim_verdict(["reproduced", "not decided", "not reproduced"]) == "not decided"


def test_a_quick_report_shows_no_verdict_no_interval_and_its_own_scale() -> None:
    claim = tiny(quick={"max_steps": 2, "num_nodes": 3}, scale="8 nodes, 400 steps")
    rules = tuple(decide([v], r.side, r.threshold)
                  for r, v in zip(claim.rules, (0.2741, 0.5), strict=True))
    text = format_markdown([ClaimOutcome(claim, rules, claim_verdict([r.verdict for r in rules]),
                                         1, True)], "t")
    row = next(line for line in text.splitlines() if line.startswith("| `tiny`"))
    assert "**" not in text and "[0.2741, 0.2741]" not in text
    assert row.endswith("0.2741; final_loss(diloco) - final_loss(ddp): 0.5 (1 seed) | "
                        "not decided (one seed) |")
    assert ("Scale (--quick): 3 nodes, 2 steps, batch 8, one seed: a check of the machinery "
            "(the suite's: 8 nodes, 400 steps)") in text


# -- specs --------------------------------------------------------------------------------------
def tiny(**changes: object) -> Claim:
    """DDP against DiLoCo (H = 2) on MNIST, 2 nodes, 4 steps of batch 8."""
    claim = Claim(
        id="tiny", paper=Paper("A", 2020, "T", "arXiv 0000.00000"), where="nowhere",
        claim="c", paper_figure="f", scale="s", task="mnist",
        common={"num_nodes": 2, "max_steps": 4, "batch_size": 8, "eval_interval": 2,
                "eval_samples": 100},
        configs=(Config("ddp", "ddp"), Config("diloco", "diloco", {"H": "2"})),
        rules=(Rule("bytes", "bytes_per_node", "diloco", "ddp", "ratio", "below", 0.6),
               Rule("loss", "final_loss", "diloco", "ddp", "diff", "below", 1.0)),
        seeds=2, quick={"max_steps": 2})
    return replace(claim, **changes)


def test_specs_are_checked_by_name() -> None:
    with pytest.raises(ValueError, match="a rule compares 'fedavg', not one of its configs"):
        tiny(rules=(Rule("r", "final_loss", "fedavg", "ddp", "diff", "below", 0.0),))
    with pytest.raises(ValueError, match="'nodes' is not a run setting a claim gives"):
        tiny(common={"nodes": 2})
    with pytest.raises(ValueError, match="'seed' is not a run setting"):
        Config("x", "ddp", settings={"seed": 3})
    with pytest.raises(ValueError, match="rule metric 'loss' is not one of"):
        Rule("r", "loss", "a", "b", "diff", "below", 0.0)
    with pytest.raises(ValueError, match="target is required"):
        Rule("r", "time_to_accuracy", "a", "b", "ratio", "above", 1.0)
    with pytest.raises(ValueError, match="config labels repeat"):
        tiny(configs=(Config("ddp", "ddp"), Config("ddp", "diloco")))
    with pytest.raises(ValueError, match=r"unknown claim\(s\) nope; the suite's: "):
        select(CLAIMS, ["nope"])


def test_the_suite_s_claims_are_distinct_and_each_config_renders_as_a_command() -> None:
    assert SUITE == "claims-v1" and sorted(SUITES) == ["claims-v0", "claims-v1",
                                                       "claims-v1-diagnostics"]
    for name, claims in SUITES.items():
        assert len({c.id for c in claims}) == len(claims) >= (12 if "diag" in name else 16)
    claim = select(CLAIMS, ["diloco-matches-ddp"])[0]
    assert command_of(claim, claim.config("diloco-h50")) == (
        "exogym run --task mnist --strategy diloco --set H=50 --nodes 8 --steps 400 "
        "--batch-size 32 --eval-interval 50 --network datacenter")
    assert "--nodes 2 --steps 50 --batch-size 8" in command_of(claim, claim.config("ddp"), True)



# -- the command line ---------------------------------------------------------------------------
def test_claims_help_shows_a_single_percent_sign(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["claims", "--help"])
    shown = " ".join(capsys.readouterr().out.split())  # argparse wraps the description
    assert "a t-interval of the compared per-seed statistic" in shown and "%%" not in shown


def test_claims_list_pads_the_ids_to_the_longest(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["claims", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    width = max(len(c.id) for c in CLAIMS)
    assert width > 28  # streaming-diloco-peak-bandwidth: longer than the old fixed column
    assert [line[:width + 1] for line in lines] == [f"{c.id:{width}s} " for c in CLAIMS]
    assert [line[width + 1:].split(" ")[0] for line in lines] == [
        c.paper.authors.split(" ")[0] for c in CLAIMS]  # the authors start in one column


@pytest.mark.parametrize("only", [",", "", "diloco-non-iid,", "diloco-non-iid,,tiny"])
def test_claims_only_with_an_empty_id_is_refused(
        only: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["claims", "--only", only, "--list"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"exogym: error: --only {only!r}: an empty claim id; give "
                                   "one or more of control-null-data-order, "
                                   "control-negative-broken-diloco, diloco-matches-ddp")
    assert all(c.id in captured.err for c in CLAIMS)


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"suite": "t"}',
                                  '{"suite": "t", "quick": false, "claims": [1]}'])
def test_a_broken_suite_record_is_named_with_what_to_do(tmp_path: Path, text: str) -> None:
    out = tmp_path / "claims"
    out.mkdir()
    (out / "suite.json").write_text(text)
    with pytest.raises(ValueError) as err:
        run_claims([tiny()], out, suite="t", allow_dirty=True)  # refused before any data
    message = str(err.value)
    assert message.startswith(f"{out / 'suite.json'} is ")
    assert message.endswith(": it is not a claims suite record written by `exogym claims`; "
                            f"give another --out, or remove the folder {out} to start afresh")
    assert (out / "suite.json").read_text() == text  # left as it was
    assert sorted(p.name for p in out.iterdir()) == ["suite.json"]


# -- the runner ---------------------------------------------------------------------------------
def test_a_claims_run_decides_resumes_and_refuses_a_changed_spec(
        tmp_path: Path, mnist_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "claims"
    (o,) = run_claims([tiny()], out, suite="t", data_dir=mnist_data, download=False,
                      progress=True, allow_dirty=True)
    shown = capsys.readouterr().out.splitlines()
    assert [line.split(" ->")[0] for line in shown] == [
        "[1/4] tiny: ddp seed 0", "[2/4] tiny: diloco seed 0", "[3/4] tiny: ddp seed 1",
        "[4/4] tiny: diloco seed 1"]
    assert "left)" not in shown[0] and all(line.endswith(" left)") for line in shown[1:])
    # DiLoCo (H = 2) sends what DDP sends every other step: half the bytes, exactly
    assert o.rules[0].values == (0.5, 0.5) and o.rules[0].verdict == "reproduced"
    assert o.seeds == 2 and len(o.rules[1].values) == 2
    runs = sorted(p.name for p in (out / "tiny").iterdir())
    assert runs == ["ddp-seed0", "ddp-seed1", "diloco-seed0", "diloco-seed1"]
    # again: every run read back, none trained (an unfinished one is trained again)
    (out / "tiny" / "ddp-seed1" / "summary.json").unlink()
    stamp = (out / "tiny" / "ddp-seed0" / "summary.json").stat().st_mtime_ns
    (again,) = run_claims([tiny()], out, suite="t", data_dir=mnist_data, download=False,
                          progress=True, allow_dirty=True)
    assert [line.split(" ->")[0] for line in capsys.readouterr().out.splitlines()] == [
        "[3/4] tiny: ddp seed 1"]  # the only run trained again
    assert (out / "tiny" / "ddp-seed0" / "summary.json").stat().st_mtime_ns == stamp
    assert again.rules == o.rules  # the rerun seed 1 gives the same numbers
    with pytest.raises(ValueError, match="the spec of tiny changed since its runs"):
        run_claims([tiny(seeds=3)], out, suite="t", data_dir=mnist_data, download=False,
                   allow_dirty=True)
    with pytest.raises(ValueError, match=r"holds the runs of t \(quick=False\)"):
        run_claims([tiny()], out, suite="t", quick=True, data_dir=mnist_data,
                   allow_dirty=True)
    # each session that trained into the folder is on record: the code, versions, times
    sessions = json.loads((out / "provenance.json").read_text())
    assert len(sessions) == 2 and all(s["ended"] and s["allowed_dirty"] for s in sessions)
    assert sessions[0]["versions"]["torch"] and sessions[0]["machine"]["cores"] >= 1
    assert fingerprint(tiny()) != fingerprint(tiny(seeds=3))
    assert fingerprint(tiny()) == fingerprint(tiny(claim="in other words"))  # prose only


def test_a_run_two_claims_share_trains_once(tmp_path: Path, mnist_data: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "claims"
    other = tiny(id="other", configs=(Config("ddp", "ddp"), Config("h4", "diloco", {"H": "4"})),
                 rules=(Rule("loss", "final_loss", "h4", "ddp", "diff", "below", 1.0),))
    run_claims([tiny(), other], out, suite="t", data_dir=mnist_data, download=False,
               progress=True)
    trained = [line.split(" ->")[0] for line in capsys.readouterr().out.splitlines()]
    # the second claim's DDP runs are the first's (the same task, settings and seeds)
    assert [t for t in trained if "other" in t] == ["[6/8] other: h4 seed 0",
                                                    "[8/8] other: h4 seed 1"]
    assert not (out / "other" / "ddp-seed0").exists()
    index = json.loads((out / "runs.json").read_text())
    assert sorted(index.values()) == sorted([
        "tiny/ddp-seed0", "tiny/diloco-seed0", "tiny/ddp-seed1", "tiny/diloco-seed1",
        "other/h4-seed0", "other/h4-seed1"])


@pytest.mark.slow  # about a minute: CI's slow step runs it (.ci/run)
def test_exogym_claims_quick_runs_every_claim(tmp_path: Path, mnist_data: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "quick"
    assert main(["claims", "--quick", "--out", str(out), "--data-dir", str(mnist_data),
                 "--no-download", "--no-progress", "--allow-dirty"]) == 0
    shown = capsys.readouterr().out
    report = json.loads((out / "claims.json").read_text())
    assert [c["id"] for c in report["claims"]] == [c.id for c in CLAIMS]
    for c in report["claims"]:
        assert c["quick"] and c["seeds"] == 1
        assert c["verdict"] == "not decided"  # one seed: no verdict
        assert (out / f"{c['id']}.png").stat().st_size > 0
    assert "--quick: a check of the machinery, not the verdicts" in shown


def test_provenance_names_the_commit_and_refuses_a_dirty_tree(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EXOGYM_ALLOW_DIRTY")  # conftest's: this test is of the refusal
    repo = tmp_path / "code"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.email=a@b", "-c", "user.name=a"]
    subprocess.run([*git, "init", "-q"], check=True)
    (repo / "a.py").write_text("x = 1\n")
    subprocess.run([*git, "add", "a.py"], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    (repo / "runs").mkdir()  # untracked: not a change to the code
    assert source_state(repo) == {"commit": head, "dirty": False, "changed": []}
    (repo / "a.py").write_text("x = 2\n")
    assert source_state(repo)["dirty"] and source_state(repo)["changed"] == ["a.py"]
    with pytest.raises(DirtyTreeError, match=r"uncommitted changes \(a.py\).*--allow-dirty"):
        checked_source(root=repo)
    allowed = checked_source(root=repo, allow_dirty=True)
    assert allowed["allowed_dirty"] and allowed["commit"] == head
    monkeypatch.setenv("EXOGYM_ALLOW_DIRTY", "1")
    assert checked_source(root=repo)["allowed_dirty"]
    assert source_state(tmp_path / "elsewhere")["commit"] is None  # no checkout: the version


@pytest.mark.slow  # about two minutes: CI's slow step runs it (.ci/run)
def test_the_diagnostics_quick_run_concludes_nothing_from_one_seed(
        tmp_path: Path, mnist_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from exogym.lab.claims import diagnostics

    out = tmp_path / "diag"
    assert main(["claims", "--suite", "claims-v1-diagnostics", "--quick", "--out", str(out),
                 "--data-dir", str(mnist_data), "--no-download", "--no-progress",
                 "--allow-dirty"]) == 0
    shown = capsys.readouterr().out
    report = json.loads((out / "claims.json").read_text())
    assert [c["id"] for c in report["claims"]] == [c.id for c in diagnostics.CLAIMS]
    assert all(c["verdict"] == "not decided" and c["diagnoses"] for c in report["claims"])
    assert "## Scale or defect" in shown and "| **not decided** |" in shown
    assert "**not decided (no identity check: a defect not ruled out)**" in shown
