"""mcplhost/agents/wakes/rules.py: who an item wakes (docs/agents.md#scheduling), read from host-written fields only."""

from __future__ import annotations

from typing import Any

import pytest

from mcplhost.agents.wakes.rules import (
    NO_ADDRESSING,
    REFUSED_NOT_ADDRESSED,
    REFUSED_WAKE_ON,
    addressing_of,
    hears,
    is_echo,
    sender_key,
    view_of,
    wake_matches,
    wake_refusal,
)
from mcplhost.config import AgentConfig, ConnectorConfig

from .wakes import ROOM, event

ADDRESSED = ["chat:addressed"]
PRIVATE = ["chat:addressed", "chat:dm", "chat:private"]


def scout(**fields: Any) -> AgentConfig:
    return AgentConfig(name="scout", **fields)


def wakes(config: AgentConfig, /, *args: Any, **fields: Any) -> bool:
    return wake_matches(config, view_of(event(1, *args, **fields)))


class TestView:
    def test_the_view_reads_the_pipeline_s_metadata(self) -> None:
        """Server, channel, tags, lane, kind, author id, conversation and acceptedAt come from the stored item."""
        view = view_of(event(7, tags=ADDRESSED, author_id="u1", thread="t1"))
        assert (view.id, view.server_id, view.channel_id, view.lane, view.source_kind) == (
            7, "disc", ROOM, "channels/incoming", "channel")
        assert (view.tags, view.author_id, view.participant, view.thread_id) == (
            frozenset(ADDRESSED), "u1", "Alice", "t1")
        assert view.conversation_id is not None and view.accepted_at == 1_790_000_000_000
        assert not view.echo_of

    def test_claims_in_the_adapter_object_are_never_read(self) -> None:
        """A connector's own authorId, tags or echoOf in metadata.adapter do not count."""
        stored = event(1)
        stored.item.metadata["adapter"] = {"authorId": "boss", "tags": ["chat:addressed"], "echoOf": True}
        view = view_of(stored)
        assert (view.author_id, view.tags, view.echo_of) == (None, frozenset(), False)


class TestWakeOn:
    @pytest.mark.parametrize(("wake_on", "fields", "expected"), [
        (["all"], {}, True),
        (["addressed"], {"tags": ADDRESSED}, True),
        (["addressed"], {}, False),
        (["dm"], {"tags": PRIVATE}, True),
        (["dm"], {"tags": ADDRESSED}, False),
        (["push"], {"lane": "push/event"}, True),
        (["push"], {"lane": "push/event", "channel": None}, True),
        (["push"], {}, False),
        (["disc"], {}, True),
        (["other"], {}, False),
        (["disc/disc:g1:*"], {}, True),
        (["disc/disc:g2:*"], {}, False),
        (["disc/disc:g1:*"], {"lane": "push/event", "channel": None}, False),
        (["dm", "disc/disc:g1:room"], {}, True),
        ([], {"tags": PRIVATE}, False),
    ])
    def test_each_entry_of_the_table(self, wake_on: list[str], fields: dict[str, Any], expected: bool) -> None:
        """all, addressed, dm, push, NAME and NAME/GLOB match as docs/agents.md#scheduling's table says."""
        assert wakes(scout(wake_on=wake_on), **fields) is expected

    def test_channel_globs_are_case_sensitive(self) -> None:
        """Channel ids are ids: a glob matches them exactly as written, on every platform."""
        assert not wakes(scout(wake_on=["disc/DISC:*"]))


class TestHears:
    @pytest.mark.parametrize(("hears_", "fields", "expected"), [
        (None, {}, True),
        (["disc"], {}, True),
        (["zulip"], {}, False),
        (["disc/disc:g1:*"], {}, True),
        (["disc/disc:g2:*"], {}, False),
        (["zulip", "disc/disc:g1:room"], {}, True),
    ])
    def test_hears_narrows_what_wakes(self, hears_: list[str] | None, fields: dict[str, Any],
                                      expected: bool) -> None:
        """An item the agent does not hear never wakes it, whatever wake_on says."""
        agent = scout(hears=hears_, wake_on=["all"])
        assert hears(agent, view_of(event(1, **fields))) is expected
        assert wakes(agent, **fields) is expected


class TestNeverAWake:
    def test_echoes_of_our_own_publish(self) -> None:
        """Tagged chat:from-self, or marked echoOf (an outbox id or true): heard, never a wake."""
        agent = scout(wake_on=["all"])
        assert is_echo(view_of(event(1, tags=["chat:from-self"]))) and not wakes(agent, tags=["chat:from-self"])
        assert not wakes(agent, echo_of=17) and not wakes(agent, echo_of=True)
        assert wakes(agent, echo_of=False)

    def test_the_agent_s_own_rows_and_other_agents_rows(self) -> None:
        """A row of the agent itself never wakes it; another agent's row is not even heard."""
        agent = scout(wake_on=["all"])
        assert hears(agent, view_of(event(1, agent="scout"))) and not wakes(agent, agent="scout")
        assert not hears(agent, view_of(event(1, agent="lead"))) and not wakes(agent, agent="lead")

    def test_surface_items_wake_only_the_agent_they_are_typed_to(self) -> None:
        """Console input typed to this agent wakes it (whatever wake_on); untyped or another's never does."""
        agent = scout(wake_on=["dm"], hears=["disc"])
        assert wakes(agent, surface=True, agent="scout")
        assert not wakes(agent, surface=True) and not wakes(agent, surface=True, agent="lead")
        assert not hears(agent, view_of(event(1, surface=True)))


class TestWhoMayWake:
    def test_bots_wake_only_when_allowed(self) -> None:
        """chat:from-bot items wake only with wake_from_bots = true."""
        tags = ["chat:addressed", "chat:from-bot"]
        assert not wakes(scout(), tags=tags)
        assert wakes(scout(wake_from_bots=True), tags=tags)

    @pytest.mark.parametrize(("author_id", "participant", "expected"), [
        ("1234", "Mallory", True),
        ("12345678", "Alice", True),
        ("999", "1234", False),  # a display name that looks like the id does not count
        (None, "1234", False),  # no author id: fail closed
    ])
    def test_wake_from_matches_the_author_id_never_the_name(self, author_id: str | None, participant: str,
                                                           expected: bool) -> None:
        """wake_from globs are matched on connector/authorId; other senders are heard but do not wake."""
        agent = scout(wake_from=["disc/1234*"])
        assert wakes(agent, tags=ADDRESSED, author_id=author_id, participant=participant) is expected

    def test_wake_from_names_the_connector_too(self) -> None:
        """The same author id on another connector does not match."""
        agent = scout(wake_from=["zulip/1234"], wake_on=["all"])
        assert not wakes(agent, author_id="1234")
        assert wakes(agent, server="zulip", channel="zulip:stream:1", author_id="1234")

    def test_pushes_have_no_sender_for_wake_from(self) -> None:
        """A push wakes on `push` even when wake_from is set: it has no author to match."""
        assert wakes(scout(wake_on=["push"], wake_from=["disc/1"]), lane="push/event", channel=None)


def connector(name: str = "disc", **fields: Any) -> ConnectorConfig:
    return ConnectorConfig(name=name, command=["unused"], **fields)


class TestAddressing:
    """docs/agents.md#addressing: whom an addressed item of a connector addresses, when several agents share it."""

    ADA, BOB = AgentConfig(name="ada", wake_on=["addressed"]), AgentConfig(name="bob", wake_on=["addressed"])

    def woken(self, addressing: Any, body: str, *agents: AgentConfig, tags: list[str] = ADDRESSED) -> list[str]:
        stored = event(1, body, tags=tags)
        return [a.name for a in agents if wake_matches(a, view_of(stored, addressing), addressing)]

    def test_a_connector_s_agent_is_the_only_one_its_addressed_items_address(self) -> None:
        """With `agent = "ada"`, `@bob` on that connector still addresses ada only; bob hears it as ambient."""
        addressing = addressing_of([connector(agent="ada")], [self.ADA, self.BOB])
        assert self.woken(addressing, "@bob only you", self.ADA, self.BOB) == ["ada"]
        bob_view = view_of(event(1, "@bob only you", tags=ADDRESSED), addressing)
        assert wake_refusal(self.BOB, bob_view, addressing) == REFUSED_NOT_ADDRESSED
        assert hears(self.BOB, bob_view)

    def test_without_agent_several_addressed_wakers_are_addressed_by_name(self) -> None:
        """`@NAME` anywhere or `NAME:` / `NAME,` at the start, any case; a mention naming no one wakes no one."""
        addressing = addressing_of([connector()], [self.ADA, self.BOB])
        assert addressing.by_name == {"disc": ("ada", "bob")}
        assert self.woken(addressing, "@ada only you, please", self.ADA, self.BOB) == ["ada"]
        assert self.woken(addressing, "BOB: and you?", self.ADA, self.BOB) == ["bob"]
        assert self.woken(addressing, "hey @Ada and @bob", self.ADA, self.BOB) == ["ada", "bob"]
        assert self.woken(addressing, "hello bot", self.ADA, self.BOB) == []
        assert self.woken(addressing, "@ada hi", self.ADA, self.BOB, tags=[]) == []  # not addressed at all

    def test_one_addressed_waker_changes_nothing(self) -> None:
        """Only one agent wakes on addressed items of the connector (the other wakes on dms): no rule applies."""
        dms = AgentConfig(name="bob", wake_on=["dm"])
        addressing = addressing_of([connector()], [self.ADA, dms])
        assert addressing == NO_ADDRESSING
        assert self.woken(addressing, "hello bot", self.ADA, dms) == ["ada"]

    def test_agents_that_do_not_hear_the_connector_do_not_count(self) -> None:
        """bob hears zulip only: disc's addressed items are ada's alone, zulip's are shared by name."""
        bob = AgentConfig(name="bob", wake_on=["addressed"], hears=["zulip/stream:*"])
        assert addressing_of([connector(), connector("zulip")], [self.ADA, bob]).by_name == {"zulip": ("ada", "bob")}

    def test_another_wake_on_entry_still_wakes(self) -> None:
        """The rule narrows `addressed` only: an agent waking on `all` or on the connector wakes as before."""
        everything = AgentConfig(name="bob", wake_on=["addressed", "disc"])
        addressing = addressing_of([connector(agent="ada")], [self.ADA, everything])
        assert self.woken(addressing, "@ada", self.ADA, everything) == ["ada", "bob"]

    def test_a_view_built_without_the_names_addresses_no_one(self) -> None:
        """Fail closed: the rule never guesses names it was not given the body for."""
        addressing = addressing_of([connector()], [self.ADA, self.BOB])
        view = view_of(event(1, "@ada", tags=ADDRESSED))
        assert wake_refusal(self.ADA, view, addressing) == REFUSED_NOT_ADDRESSED
        assert wake_refusal(self.ADA, view_of(event(1, "x")), addressing) == REFUSED_WAKE_ON

    def test_the_header_is_not_the_body(self) -> None:
        """Names are read in the sender's text, never in the host's header (whose label may hold anything)."""
        addressing = addressing_of([connector()], [self.ADA, self.BOB])
        view = view_of(event(1, "no names here", tags=ADDRESSED), addressing)
        assert view.named == frozenset()


class TestSenderKey:
    def test_the_author_id_then_the_display_name(self) -> None:
        """Senders are counted by connector and id, else by name, kept apart; pushes and the console have none."""
        assert sender_key(view_of(event(1, author_id="u1"))) == "disc/id:u1"
        assert sender_key(view_of(event(1, participant="u1"))) == "disc/name:u1"
        assert sender_key(view_of(event(1, participant=None))) is None
        assert sender_key(view_of(event(1, lane="push/event", channel=None))) is None
        assert sender_key(view_of(event(1, surface=True, agent="scout"))) is None
