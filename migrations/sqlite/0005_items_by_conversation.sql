-- The items of one conversation, newest first: what a turn reads for an agent
-- with context_scope = "conversation" (store/items.py context_rows). Without it
-- that read walks the table from its newest row until it has found its rows,
-- the whole table for a quiet conversation (152 ms over 1M rows; 8 ms with it).
-- It costs 10-14% of the single-message inbound rate (README.md#performance);
-- without it, that read's time grows with the table on every such turn.
-- Rows from before migration 0002 have no conversation id and are left out.
-- The runner wraps this file in one transaction; do not put BEGIN/COMMIT here.
CREATE INDEX items_by_conversation ON items (conversation_id, id) WHERE conversation_id IS NOT NULL;
