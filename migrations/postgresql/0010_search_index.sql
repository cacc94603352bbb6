-- The search index (migrations/sqlite/0010_search_index.sql), on pg_trgm: the
-- bodies as searched (store/search_index.py body_text, computed by the indexer:
-- PostgreSQL cannot call it) in a table of their own, and a trigram GIN index
-- over them that answers LIKE/ILIKE of any substring of 3 or more characters.
-- pg_trgm is a trusted extension (PostgreSQL 13+): the database's owner may create it.
-- The runner wraps this file in one transaction; do not put BEGIN/COMMIT here.
CREATE EXTENSION IF NOT EXISTS pg_trgm;

CREATE TABLE items_search (
    item_id  BIGINT PRIMARY KEY,   -- items.id
    body     TEXT NOT NULL
);
CREATE INDEX items_search_trigrams ON items_search USING gin (body gin_trgm_ops);

-- The indexer's high-water mark: every item with an id at or below indexed_to is in items_search.
CREATE TABLE search_index (
    id          BIGINT PRIMARY KEY CHECK (id = 1),
    indexed_to  BIGINT NOT NULL
);
INSERT INTO search_index (id, indexed_to) VALUES (1, 0);

CREATE INDEX items_by_server ON items (server_id, id);
CREATE INDEX items_by_time ON items (created_at);
