"""Tests for mcplhost/inbound/source.py: freeze_source."""

from __future__ import annotations

import pytest

from mcplhost.inbound.source import freeze_source


class TestFreezeSource:
    def test_channel_envelope_with_every_field(self) -> None:
        """Every supplied field appears under its wire name, in the documented order."""
        envelope = freeze_source(
            kind="channel", lane="channels/incoming", server_id="zulip", accepted_at=1_790_000_000_000,
            channel_id="zulip:stream:7", label="stream design", thread_id="topic-a", message_id="m1",
            event_id="e1", reply_to="z0", source_timestamp="2026-01-01T00:00:00Z",
        )
        assert list(envelope.items()) == [
            ("kind", "channel"), ("lane", "channels/incoming"), ("serverId", "zulip"),
            ("channelId", "zulip:stream:7"), ("label", "stream design"), ("threadId", "topic-a"),
            ("messageId", "m1"), ("eventId", "e1"), ("replyTo", "z0"), ("acceptedAt", 1_790_000_000_000),
            ("sourceTimestamp", "2026-01-01T00:00:00Z"),
        ]

    def test_absent_fields_are_left_out(self) -> None:
        """Optional fields not supplied are absent, never null or invented."""
        envelope = freeze_source(kind="channel", lane="channels/incoming", server_id="discord",
                                 channel_id="discord:g1:room", accepted_at=5)
        assert envelope == {"kind": "channel", "lane": "channels/incoming", "serverId": "discord",
                            "channelId": "discord:g1:room", "acceptedAt": 5}

    def test_empty_label_is_kept_as_given(self) -> None:
        """An empty label was supplied, so it is recorded; the header treats it as none."""
        envelope = freeze_source(kind="channel", lane="push/event", server_id="d", channel_id="c", label="",
                                 accepted_at=5)
        assert envelope["label"] == ""

    def test_source_timestamp_kept_verbatim(self) -> None:
        """The connector's own timestamp is kept as it came, whatever its type."""
        envelope = freeze_source(kind="unscoped", lane="push/event", server_id="hb", accepted_at=5,
                                 source_timestamp=1234.5)
        assert envelope["sourceTimestamp"] == 1234.5

    def test_unscoped_push(self) -> None:
        """A push naming no channel is unscoped and has no channelId."""
        envelope = freeze_source(kind="unscoped", lane="push/event", server_id="heartbeat", accepted_at=5)
        assert envelope == {"kind": "unscoped", "lane": "push/event", "serverId": "heartbeat", "acceptedAt": 5}

    def test_surface_uses_the_surface_lane(self) -> None:
        """Local console input is kind surface on the lane `surface`."""
        envelope = freeze_source(kind="surface", lane="surface", server_id="console", accepted_at=5)
        assert envelope["lane"] == "surface"

    @pytest.mark.parametrize(
        ("kwargs", "error"),
        [
            ({"kind": "dm", "lane": "push/event"}, "unknown source kind"),
            ({"kind": "channel", "lane": "surface", "channel_id": "c"}, "cannot arrive on lane"),
            ({"kind": "unscoped", "lane": "channels/incoming"}, "cannot arrive on lane"),
            ({"kind": "surface", "lane": "push/event"}, "cannot arrive on lane"),
            ({"kind": "channel", "lane": "channels/incoming"}, "needs its registered channel_id"),
            ({"kind": "unscoped", "lane": "push/event", "channel_id": "c"}, "names no channel"),
            ({"kind": "unscoped", "lane": "push/event", "server_id": ""}, "non-empty"),
        ],
    )
    def test_inconsistent_envelopes_are_refused(self, kwargs: dict, error: str) -> None:
        """A kind, lane and channel that do not agree raise ValueError (a host bug)."""
        arguments = {"server_id": "s", "accepted_at": 5, **kwargs}
        with pytest.raises(ValueError, match=error):
            freeze_source(**arguments)

    @pytest.mark.parametrize("accepted_at", [True, 1.5, "5"])
    def test_accepted_at_must_be_integer_milliseconds(self, accepted_at: object) -> None:
        """acceptedAt is host time in integer milliseconds; a bool, float or string raises TypeError."""
        with pytest.raises(TypeError):
            freeze_source(kind="unscoped", lane="push/event", server_id="s",
                          accepted_at=accepted_at)  # type: ignore[arg-type]
