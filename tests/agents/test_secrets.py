"""Secrets withheld from what would leave (docs/agents.md#secrets): the stream's hold-back, speech segments,
`channel_publish` and connector tool calls."""

from __future__ import annotations

import anyio
from hypothesis import given, settings
from hypothesis import strategies as st

from mcplhost.agents.tools.outcome import ToolOutcome, redacted_outcome
from mcplhost.secrets import Secrets
from mcplhost.speech.routing import Destination, Segment
from mcplhost.speech.streaming import COMPLETE, Streamer
from mcplhost.speech.withhold import SECRET, publish_refusal, secret_notice, withhold_secrets

from ..harness import record, scripted, wait_for
from ..properties import examples
from ..speech.test_streaming import MANIFEST, reference_end, split, stream, streaming_host

TOKEN = "tok-0123456789-abc"
SECRETS = Secrets({"DISCORD_TOKEN": TOKEN})
ROOM = Destination(server_id="disc", channel_id="room")


class TestStreamHoldBack:
    @settings(max_examples=examples(60), deadline=None)
    @given(before=st.text(max_size=30).filter(lambda t: ">" not in t), after=st.text(max_size=30),
           cuts=st.lists(st.integers(0, 200), max_size=8))
    def test_a_secret_split_anywhere_across_chunks_is_never_sent(self, before, after, cuts) -> None:
        """Wherever the chunks split it, no part of the secret's text that would make it whole is streamed:
        what went out (chunks and complete) never holds it, and nothing after it goes."""
        sent = anyio.run(stream, split(before + TOKEN + after, cuts), SECRETS)
        streamed = "".join(p.get("delta", "") for m, p in sent if m != COMPLETE)
        assert TOKEN not in streamed and TOKEN[:-1] not in streamed
        assert before.startswith(streamed)  # only text before the secret, never past its start
        assert all(TOKEN not in str(p) for _m, p in sent)

    @settings(max_examples=examples(30), deadline=None)
    @given(text=st.text(max_size=60).filter(lambda t: ">" not in t), cuts=st.lists(st.integers(0, 200), max_size=8))
    def test_without_a_secret_everything_is_streamed_by_the_end(self, text, cuts) -> None:
        """The held-back tail goes out when the inference ends: the preview is whole (the text up to where the
        pin rule stops a preview, as without secrets; a blank text previews nothing)."""
        sent = anyio.run(stream, split(text, cuts), SECRETS)
        assert "".join(p.get("delta", "") for m, p in sent if m != COMPLETE) == text[: reference_end(text)[0]]

    async def test_a_real_connector_never_receives_a_secret_split_over_two_chunks(self, tmp_path) -> None:
        spec = scripted("disc", {"manifest": MANIFEST, "steps": []}, tmp_path,
                        grant=["channels.register", "channels.streaming"])
        async with streaming_host(tmp_path, spec) as host:
            async with Streamer(host.connectors, "inf-s", secrets=SECRETS) as streamer:
                streamer.open([ROOM])
                streamer.chunk("the token is " + TOKEN[:7])
                streamer.chunk(TOKEN[7:] + " and more")
            await wait_for(lambda: any(m.get("method") == COMPLETE for m in record(tmp_path, "disc").received))
        sent = [m for m in record(tmp_path, "disc").received if str(m.get("method", "")).startswith("channels/out")]
        assert "tok-" not in str(sent)
        (complete,) = sent[-1]["params"]["content"]  # what went before the held-back tail, which held the secret
        assert sent[-1]["method"] == COMPLETE and complete["text"] and "the token is ".startswith(complete["text"])


class TestWithheldSpeech:
    def test_a_routed_segment_holding_a_secret_becomes_a_redacted_draft_and_the_notice_names_the_variable(
            self) -> None:
        segments = [Segment(text="hello", destination=ROOM), Segment(text=f"key {TOKEN}", destination=ROOM),
                    Segment(text=f"{TOKEN} drafted anyway", destination=None, reason="undecided")]
        kept, names = withhold_secrets(segments, SECRETS)
        assert kept[0] == segments[0] and kept[2] == segments[2]
        assert kept[1] == Segment(text="key [redacted:DISCORD_TOKEN]", destination=None, reason=SECRET, target=ROOM)
        assert names == ["DISCORD_TOKEN"]
        assert "DISCORD_TOKEN" in secret_notice(names) and TOKEN not in secret_notice(names)
        assert withhold_secrets(segments, Secrets()) == (segments, [])

    def test_the_refusals_name_the_variable_never_the_value(self) -> None:
        assert publish_refusal("DISCORD_TOKEN")["reason"] == "secret"
        assert publish_refusal("DISCORD_TOKEN")["status"] == "refused"
        outcome = ToolOutcome(blocks=[{"type": "text", "text": f"vault: {TOKEN}"}])
        assert redacted_outcome(outcome, SECRETS).blocks == [{"type": "text", "text": "vault: [redacted:DISCORD_TOKEN]"}]
        assert redacted_outcome(outcome, Secrets()) is outcome
