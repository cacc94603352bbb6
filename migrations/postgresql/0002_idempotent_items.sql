-- Idempotent channel items, conversation and thread as columns, and the item
-- each push event stored (migrations/sqlite/0002_idempotent_items.sql). No
-- PostgreSQL store predates this step, so SQLite's backfills are left out.
-- The runner wraps this file in one transaction; do not put BEGIN/COMMIT here.
ALTER TABLE items ADD COLUMN thread_id TEXT NULL;
ALTER TABLE items ADD COLUMN conversation_id TEXT NULL;
ALTER TABLE items ADD COLUMN dedup_digest TEXT NULL;

DROP INDEX items_by_message;
CREATE UNIQUE INDEX items_by_message ON items (channel_id, message_id, server_id, dedup_digest)
 WHERE message_id IS NOT NULL;

ALTER TABLE push_events ADD COLUMN item_id BIGINT NULL;
