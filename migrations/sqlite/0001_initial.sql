-- The first schema: stored items and push-event dedup records.
-- The runner wraps this file in one transaction and records it in
-- schema_version; do not put BEGIN/COMMIT here.

-- One row per stored item (docs/provenance.md §6).
-- server_id, channel_id and message_id repeat metadata.serverId/.channelId/
-- .messageId so reads by channel or message use an index instead of parsing JSON.
CREATE TABLE items (
    id          INTEGER PRIMARY KEY,
    agent       TEXT NULL,          -- NULL: every agent may see it; else the agent it belongs to
    participant TEXT NULL,          -- who spoke, as the connector named them
    role        TEXT NOT NULL,
    content     TEXT NOT NULL,      -- JSON array of content blocks, source header first
    metadata    TEXT NOT NULL,      -- JSON object: source envelope, digests, adapter, ...
    server_id   TEXT NULL,
    channel_id  TEXT NULL,
    message_id  TEXT NULL,          -- metadata.messageId: the connector's id for the message
    created_at  INTEGER NOT NULL    -- epoch ms
);

-- Reading a channel in id order (`messages --channel`, context compilation).
-- Keyed (channel_id, id) rather than (server_id, channel_id, id) because the
-- CLI filters by channel id alone; a (server, channel) read walks the same
-- index range in id order and checks server_id on each row it fetches anyway.
CREATE INDEX items_by_channel ON items (channel_id, id);

-- Finding the original of a correction (same message id in the same channel).
CREATE INDEX items_by_message ON items (channel_id, message_id) WHERE message_id IS NOT NULL;

-- An agent's own rows (its speech, tool rows, notices, peer messages).
-- Partial: inbound items belong to no agent and are most rows; leaving them
-- out makes each inbound insert a third faster, and `agent = ?` still uses it.
CREATE INDEX items_by_agent ON items (agent, id) WHERE agent IS NOT NULL;

-- The original answer to each push/event, so a redelivered event gets the
-- same answer and is not stored twice.
CREATE TABLE push_events (
    server_id  TEXT NOT NULL,       -- the connector's configured name
    event_id   TEXT NOT NULL,       -- the connector's own id for the event
    result     TEXT NOT NULL,       -- JSON of the original answer
    created_at INTEGER NOT NULL,    -- epoch ms
    PRIMARY KEY (server_id, event_id)
) WITHOUT ROWID;

-- Pruning records older than the dedup window.
CREATE INDEX push_events_by_age ON push_events (created_at);
