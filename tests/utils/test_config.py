"""Typed ``KEY=VALUE`` overrides (exogym.utils.config), the strategy registry (exogym.strategy)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import pytest

from exogym.strategy import DDP, DiLoCo, FedAvg, describe, get, make, registry
from exogym.strategy.optim import OptimSpec
from exogym.utils.config import ConfigError, apply_overrides, config_fields, parse_value

# -- make: parsing --------------------------------------------------------------------------------


def test_int_is_parsed():
    s = make("diloco", H="50")
    assert isinstance(s, DiLoCo)
    assert s.H == 50
    assert type(s.H) is int


def test_non_string_values_are_used_as_given():
    s = make("diloco", H=7, outer_lr=0.5)
    assert (s.H, s.outer_lr) == (7, 0.5)


def test_dotted_nested_key():
    s = make("diloco", **{"optim.lr": "3e-4"})
    assert s.optim.lr == 3e-4
    assert s.optim.name == "adamw"  # the other fields keep their defaults


def test_short_nested_key():
    s = make("diloco", lr="3e-4", warmup_steps="10")
    assert s.optim.lr == 3e-4
    assert s.schedule.warmup_steps == 10


def test_several_nested_keys_go_into_one_section():
    s = make("fedavg", **{"optim.name": "sgd", "optim.momentum": "0.9", "optim.nesterov": "yes"})
    assert isinstance(s, FedAvg)
    assert (s.optim.name, s.optim.momentum, s.optim.nesterov) == ("sgd", 0.9, True)


@pytest.mark.parametrize(
    ("text", "value"),
    [("false", False), ("False", False), ("0", False), ("no", False), ("off", False),
     ("true", True), ("TRUE", True), ("1", True), ("yes", True), ("on", True)],
)
def test_bool_parsing(text, value):
    # outer nesterov False needs no momentum change; True keeps the default momentum 0.9
    s = make("streaming_diloco", nesterov=text)
    assert s.nesterov is value


def test_top_level_name_wins_over_nested_short_name():
    # "nesterov" is Streaming DiLoCo's outer nesterov, not optim.nesterov
    s = make("streaming_diloco", nesterov="false")
    assert s.nesterov is False
    assert s.optim.nesterov is False
    # DDP has no top-level nesterov: the short name reaches optim.nesterov
    d = make("ddp", name="sgd", momentum="0.5", nesterov="true")
    assert isinstance(d, DDP)
    assert d.optim.nesterov is True


@pytest.mark.parametrize("strategy", ["diloco", "muloco"])
def test_a_retired_key_is_refused_not_resolved_to_a_nested_one(strategy):
    # DiLoCo's earlier `nesterov` switch: the short name would reach optim.nesterov and change
    # nothing the user meant; it names what replaced it instead
    with pytest.raises(ConfigError, match=r"has no 'nesterov': the outer optimizer is "
                                          r"outer_optimizer=nesterov\|sgd\|adam"):
        make(strategy, nesterov="false")
    assert make(strategy, outer_optimizer="sgd").outer_optimizer == "sgd"


def test_the_inner_nesterov_is_still_set_by_its_full_key():
    s = make("diloco", **{"optim.name": "sgd", "optim.momentum": "0.9", "optim.nesterov": "true"})
    assert s.optim.nesterov is True and s.outer_optimizer == "nesterov"


@pytest.mark.parametrize("text", ["none", "None", "null"])
def test_optional_none(text):
    assert make("ddp", max_grad_norm=text).max_grad_norm is None


def test_optional_number():
    s = make("ddp", max_grad_norm="1.5")
    assert s.max_grad_norm == 1.5


def test_tuple_of_floats():
    s = make("diloco", betas="0.9,0.95")
    assert s.optim.betas == (0.9, 0.95)
    s2 = make("diloco", **{"optim.betas": "(0.8, 0.99)"})
    assert s2.optim.betas == (0.8, 0.99)


def test_int_written_as_float_literal():
    # "1e2" = 100.0, an integer value
    assert make("diloco", H="1e2").H == 100


# -- make: errors ---------------------------------------------------------------------------------
def test_typo_suggests_and_lists_allowed_keys():
    with pytest.raises(ConfigError) as info:
        make("diloco", Hh=5)
    msg = str(info.value)
    assert "did you mean 'H'" in msg
    assert "'Hh'" in msg
    for key in ("H", "outer_lr", "outer_momentum", "outer_optimizer", "optim.lr",
                "schedule.cosine", "max_grad_norm"):
        assert key in msg, key


def test_unknown_key_without_close_match_still_lists_keys():
    with pytest.raises(ConfigError, match=r"unknown key 'zzzzzz'; allowed: .*outer_lr"):
        make("diloco", zzzzzz="1")


@pytest.mark.parametrize("text", ["abc", "1.5", "", "true"])
def test_bad_int_names_the_key(text):
    with pytest.raises(ConfigError, match=r"\bH takes an integer"):
        make("diloco", H=text)


def test_bad_float_names_the_key():
    with pytest.raises(ConfigError, match=r"outer_lr takes a number.*'fast'"):
        make("diloco", outer_lr="fast")


def test_bad_bool_names_the_key():
    with pytest.raises(ConfigError, match=r"nesterov takes true/false.*'maybe'"):
        make("streaming_diloco", nesterov="maybe")


def test_bad_optional_number_names_the_key():
    with pytest.raises(ConfigError, match=r"max_grad_norm takes a number"):
        make("ddp", max_grad_norm="big")


def test_wrong_tuple_length():
    with pytest.raises(ConfigError, match=r"optim.betas takes 2 comma-separated values"):
        make("diloco", betas="0.9")


@pytest.mark.parametrize(
    ("overrides", "name"),
    [
        ({"H": "0"}, "H"),
        ({"outer_momentum": "1.0"}, "outer_momentum"),
        ({"outer_momentum": "0", "outer_optimizer": "nesterov"}, "outer_momentum"),
        ({"optim.lr": "-1"}, "lr"),
        ({"optim.name": "lamb"}, "lamb"),
        ({"max_grad_norm": "0"}, "max_grad_norm"),
    ],
)
def test_invalid_values_become_config_errors(overrides, name):
    with pytest.raises(ConfigError, match=name):
        make("diloco", **overrides)


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


def test_unknown_strategy_lists_available_ids():
    listed = re.escape(", ".join(registry()))
    with pytest.raises(ConfigError, match=r"unknown strategy 'dilloco' \(did you mean "
                                          rf"'diloco'\?\); available: {listed} "
                                          r"\(or path/to/file.py:Class, package.module:Class\)$"):
        make("dilloco")
    with pytest.raises(ConfigError, match="unknown strategy 'nope'; available"):
        get("nope")


def test_a_strategy_is_found_by_its_class_name_in_any_case():
    assert get("DiLoCo") is get("diloco") and get("FedAvg") is get("fedavg")
    assert get("StreamingDiLoCo") is get("streaming_diloco")
    assert get("SPARTA_DiLoCo") is get("sparta_diloco")
    assert make("DiLoCo", H=7).H == 7


# -- registry / describe --------------------------------------------------------------------------
def test_registry_has_the_builtin_strategies():
    ids = registry()
    assert {"ddp", "diloco", "fedavg"} <= set(ids)
    assert ids == sorted(ids)


def test_get_returns_the_classes():
    assert get("ddp") is DDP
    assert get("diloco") is DiLoCo
    assert get("fedavg") is FedAvg


def test_describe_diloco():
    d = describe("diloco")
    assert d["H"][:2] == (int, 100)
    assert d["outer_lr"][:2] == (float, 0.7)
    assert d["outer_momentum"][1] == 0.9
    assert d["outer_optimizer"][1] == "nesterov"
    assert d["optim.lr"][:2] == (float, 1e-3)
    assert d["optim.name"][1] == "adamw"
    assert d["max_grad_norm"][1] is None
    for key in ("H", "outer_lr", "outer_momentum", "outer_optimizer", "optim.lr",
                "schedule.cosine", "max_grad_norm"):
        assert d[key][2].strip(), f"no doc for {key}"
    assert "inner steps" in d["H"][2]
    assert "optim" not in d  # nested configs are flattened


def test_describe_fedavg_and_ddp():
    f = describe("fedavg")
    assert f["H"][1] == 100 and f["H"][2]
    assert "outer_lr" not in f
    d = describe("ddp")
    assert d["broadcast_buffers"][1] is True and d["broadcast_buffers"][2]


# -- apply_overrides / parse_value on their own ---------------------------------------------------
@dataclass(kw_only=True)
class Section:
    """A nested section.

    Attributes:
        lr: the rate.
        steps: how many.
    """

    lr: float = 0.5
    steps: int = 3


@dataclass(kw_only=True)
class Top:
    """A config.

    Attributes:
        sec: a section.
        label: a name, spread
            over two lines.
    """

    sec: Section = field(default_factory=Section)
    label: str = "x"


def test_apply_overrides_on_a_plain_dataclass():
    cfg = apply_overrides(Top, {"sec.lr": "0.25", "steps": "4", "label": "run-1"})
    assert cfg == Top(sec=Section(lr=0.25, steps=4), label="run-1")


def test_apply_overrides_with_nothing_gives_the_defaults():
    assert apply_overrides(Top, {}) == Top()


def test_config_fields_docs_and_continuation_lines():
    spec = config_fields(Top)
    assert list(spec) == ["sec.lr", "sec.steps", "label"]
    assert spec["sec.lr"] == (float, 0.5, "the rate.")
    assert spec["label"] == (str, "x", "a name, spread over two lines.")


def test_parse_value_names_the_key():
    assert parse_value("7", int, "n") == 7
    with pytest.raises(ConfigError, match="n takes an integer"):
        parse_value("7.5", int, "n")


def test_large_int_is_parsed_exactly():
    # 2**53 + 1 = 9007199254740993 is not representable as a float64
    assert parse_value("9007199254740993", int, "n") == 9007199254740993


@dataclass(kw_only=True)
class WithSgd:
    """A config whose nested default differs from the nested class's own defaults.

    Attributes:
        optim: the optimizer.
    """

    optim: OptimSpec = field(default_factory=lambda: OptimSpec(name="sgd", lr=0.1))


def test_nested_override_keeps_the_fields_own_nested_defaults():
    # describe-style view: optim.name defaults to "sgd" here
    assert config_fields(WithSgd)["optim.name"][1] == "sgd"

    cfg = apply_overrides(WithSgd, {"optim.lr": "0.2"})

    # only lr was overridden: name must stay "sgd" (it becomes OptimSpec's own "adamw")
    assert cfg.optim.lr == 0.2
    assert cfg.optim.name == "sgd"
