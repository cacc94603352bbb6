-- The peer queue (docs/operations.md#the-peer-queue): messages between agents
-- of one tree, and how many turns in a row other agents have started for each.
-- The runner wraps this file in one transaction; do not put BEGIN/COMMIT here.

-- One row per admitted peer message (answered `accepted` or `queued`), written
-- before the sender is answered, so a message the host said yes to is
-- delivered exactly once, also after a crash: delivery is a conditional
-- UPDATE of state (queued -> delivered) in the same transaction as the peer
-- row it stores for the target. Refused sends are never written. Read by the
-- host at start (what is still queued, the throttles' recent sends) and by
-- each target's delivery at its tool boundary or turn end.
CREATE TABLE peer_messages (
    id            INTEGER PRIMARY KEY,
    sender        TEXT NOT NULL,
    target        TEXT NOT NULL,
    relationship  TEXT NOT NULL,   -- the sender's relation to the target: ancestor (guidance) | sibling | descendant
    dispatch      TEXT NOT NULL,   -- tool-end | turn-end
    text          TEXT NOT NULL,   -- the message as sent
    text_key      TEXT NOT NULL,   -- 64 hex: SHA-256 of the trimmed text, the duplicate window's key
    status        TEXT NOT NULL,   -- what the sender was answered: accepted | queued
    state         TEXT NOT NULL DEFAULT 'queued',   -- queued | delivered
    created_at    INTEGER NOT NULL,  -- epoch ms
    delivered_at  INTEGER NULL,
    item_id       INTEGER NULL       -- the peer row stored for the target when delivered
);

-- A target's queue in order, and the queue counts and queued targets at start.
-- Partial: delivered messages are most rows and never read by the queue.
CREATE INDEX peer_messages_queued ON peer_messages (target, id) WHERE state = 'queued';
-- The throttles' seed after a restart: the sends of the longest window before now.
CREATE INDEX peer_messages_by_time ON peer_messages (created_at);

-- Per agent, the turns in a row started by other agents since the last user or
-- parent input; kept so a restart does not reset the `needs_attention` guard.
-- Written by the host whenever a count changes, read once at start.
CREATE TABLE peer_wake_counts (
    agent        TEXT PRIMARY KEY,
    consecutive  INTEGER NOT NULL,
    updated_at   INTEGER NOT NULL    -- epoch ms
) WITHOUT ROWID;
