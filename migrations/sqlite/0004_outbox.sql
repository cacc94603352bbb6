-- The publish outbox (docs/agents.md#outbox): one row per publish, written in the
-- same transaction as the speech row that caused it, before anything is sent.
-- The runner wraps this file in one transaction; do not put BEGIN/COMMIT here.
CREATE TABLE outbox (
    id               INTEGER PRIMARY KEY,
    agent            TEXT NOT NULL,
    turn_id          INTEGER NULL,
    server_id        TEXT NOT NULL,
    channel_id       TEXT NOT NULL,
    thread_id        TEXT NULL,
    conversation_id  TEXT NOT NULL,      -- ingest.conversation_id of (server, channel, thread)
    text             TEXT NOT NULL,
    state            TEXT NOT NULL DEFAULT 'pending',   -- pending | delivered | failed
    attempts         INTEGER NOT NULL DEFAULT 0,
    message_id       TEXT NULL,          -- the connector's id of the delivered message (echo suppression)
    last_error       TEXT NULL,
    created_at       INTEGER NOT NULL,   -- epoch ms
    delivered_at     INTEGER NULL,       -- epoch ms; also when a row failed
    first_attempt_at INTEGER NULL,       -- epoch ms; the retry window counts from here
    next_attempt_at  INTEGER NOT NULL DEFAULT 0   -- epoch ms; a retried row waits until then
);

-- A sender's queue: its connector's pending rows in order.
CREATE INDEX outbox_pending ON outbox (server_id, id) WHERE state = 'pending';
-- Echo suppression: a delivered publish by (connector, channel, messageId).
CREATE INDEX outbox_by_message ON outbox (server_id, channel_id, message_id) WHERE message_id IS NOT NULL;
