-- The items of one conversation, newest first (migrations/sqlite/0005_items_by_conversation.sql).
-- The runner wraps this file in one transaction; do not put BEGIN/COMMIT here.
CREATE INDEX items_by_conversation ON items (conversation_id, id) WHERE conversation_id IS NOT NULL;
