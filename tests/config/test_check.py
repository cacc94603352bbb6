"""mcplhost/config/check.py: the walk finds exactly what msgspec refuses, and hands the rules a typed config."""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from mcplhost.config import Config, problems
from mcplhost.config.check import check

#: Values of the wrong type (or out of limits) for any key: what a person may write by mistake.
JUNK = st.one_of(st.integers(-2, 2), st.booleans(), st.sampled_from(["", "x"]), st.just(1.5), st.just([]),
                 st.just({}), st.just([1]), st.just({"x": 1}))


def maybe(good: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly `good`, sometimes junk."""
    return st.integers(0, 5).flatmap(lambda k: JUNK if k == 0 else good)


def table(fields: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[dict[str, Any]]:
    """A TOML table writing any of `fields` (each mostly well typed), plus now and then an unknown key."""
    return st.fixed_dictionaries({}, optional={**{k: maybe(v) for k, v in fields.items()}, "surprise": JUNK})


NAMES = st.sampled_from(["a", "b", "scout"])
BACKEND = table({"kind": st.sampled_from(["scripted", "openai", "oracle"]), "model": NAMES,
                 "max_tokens": st.integers(0, 3), "script": st.lists(st.sampled_from(["hi", "{{echo}}"]))})
CONNECTOR = table({"name": NAMES, "command": st.lists(st.sampled_from(["sh", ""]), max_size=2),
                   "grant": st.lists(maybe(st.sampled_from(["pushEvents", "channels.*"])), max_size=2),
                   "env": st.dictionaries(st.sampled_from(["A", "MY KEY"]), maybe(st.just("v")), max_size=2),
                   "env_pass": st.lists(st.sampled_from(["GOOD", "not a name"]), max_size=2),
                   "cwd": st.just("."), "restart": table({"policy": st.sampled_from(["always", "sometimes"]),
                                                          "burst": st.integers(0, 2)})})
AGENT = table({"name": NAMES, "hears": st.lists(NAMES, max_size=2), "wake_on": st.lists(NAMES, max_size=2),
               "debounce_ms": st.integers(-1, 500), "max_wait_ms": st.integers(-1, 5000), "backend": BACKEND})
DOCUMENTS = st.one_of(JUNK, table({
    "store": table({"path": st.just("x.db"), "synchronous": st.sampled_from(["NORMAL", "FAST"])}),
    "connectors": st.lists(maybe(CONNECTOR), max_size=2),
    "agents": st.lists(maybe(AGENT), max_size=2),
    "inference": table({"backend": BACKEND}),
    "console": table({"actions": st.lists(st.sampled_from(["restart-connector", "drop"]), max_size=2)}),
    "moderation": table({"kind": st.sampled_from(["command", "openai", "other"]), "command": st.just(["sh"])}),
}))


class TestTheWalk:
    @given(DOCUMENTS)
    def test_it_finds_a_problem_exactly_when_msgspec_refuses_and_reads_what_msgspec_decodes(self, raw: Any) -> None:
        """The walk agrees with msgspec, its oracle: no type problem means msgspec decodes the document, to the
        config the rules read; any problem means msgspec refuses it (the walk only goes on to list them all).
        Either way the rules run after it on the checked config, without raising."""
        checked = check(raw)
        assert problems(raw)[:len(checked.problems)] == checked.problems
        try:
            decoded = msgspec.convert(raw, Config)
        except msgspec.ValidationError:
            assert checked.problems
        else:
            assert checked.problems == [] and checked.refused == frozenset()
            assert checked.config == decoded

    def test_a_value_of_the_wrong_type_is_refused_where_it_is(self) -> None:
        """A placeholder stands for `cwd = 3`, and only that path (with what lies in it) is unusable."""
        checked = check({"connectors": [{"name": "a", "command": ["sh"], "cwd": 3, "grant": ["pushEvents", 4]}]})
        assert checked.refused == {"connectors[0].cwd", "connectors[0].grant[1]"}
        (connector,) = checked.config.connectors
        assert (connector.name, connector.command, connector.grant) == ("a", ["sh"], ["pushEvents", ""])
        assert not checked.usable("connectors[0].cwd") and checked.usable("connectors[0].command")
        assert not checked.usable_in("connectors[0]")("grant[1]") and checked.usable("connectors[0].grant[0]")

    def test_a_refused_table_refuses_what_lies_in_it(self) -> None:
        """`store = 5` leaves a table of defaults, none of whose values is the document's."""
        checked = check({"store": 5, "agents": [1, {"name": "a"}]})
        assert checked.config.store.path == "mcplhost.db" and not checked.usable("store.path")
        assert not checked.usable("agents[0].name") and checked.usable("agents[1].name")
        assert checked.usable("storey")  # a sibling whose name begins the same is not inside it

    def test_a_value_out_of_its_limits_is_kept(self) -> None:
        """Only a wrong type is replaced: `max_wait_ms = -5` and `name = ""` are read as written."""
        checked = check({"agents": [{"name": "", "max_wait_ms": -5}]})
        assert checked.refused == frozenset() and len(checked.problems) == 2
        (agent,) = checked.config.agents
        assert (agent.name, agent.max_wait_ms) == ("", -5)

    def test_an_optional_string_of_the_wrong_type_is_written_but_empty(self) -> None:
        """`model = 5` counts as written (no "model: required" besides its type problem), as the file has it."""
        found = problems({"agents": [{"name": "a", "backend": {"kind": "openai", "model": 5}}]})
        assert found == ["agents[0].backend.model: Expected `str | null`, got `int`"]


class TestRulesBesideTypeProblems:
    def test_a_name_that_is_an_array_or_a_table_is_a_type_problem(self) -> None:
        """`name = []` was an unhashable key to the raw rules, and check-config died with a traceback; now it
        is one problem, and the other agent's missing parent is still found."""
        found = problems({"agents": [{"name": []}, {"name": {"x": 1}, "parent": "b"}, {"name": "c", "parent": "d"}]})
        assert found == ["agents[0].name: Expected `str`, got `array`", "agents[1].name: Expected `str`, got `object`",
                         "agents[1].parent: no agent is named 'b'", "agents[2].parent: no agent is named 'd'"]

    def test_a_mistyped_debounce_skips_the_max_wait_rule(self) -> None:
        """The rule comparing max_wait_ms with debounce_ms needs both: no comparison with a placeholder."""
        assert problems({"agents": [{"name": "a", "debounce_ms": "x", "max_wait_ms": -5}]}) == [
            "agents[0].debounce_ms: Expected `int`, got `str`", "agents[0].max_wait_ms: Expected `int` >= 0"]

    def test_an_unknown_moderation_kind_checks_no_kind_s_keys(self) -> None:
        """Neither kind's rules apply to a kind that is neither; its key variable is still withheld."""
        found = problems({"moderation": {"kind": "other", "api_key_env": "K"},
                          "connectors": [{"name": "c", "command": ["sh"], "env_pass": ["K"]}]})
        assert [p.partition(":")[0] for p in found] == ["moderation.kind", "connectors[0].env_pass[0]"]
