-- The search index (docs/operations.md#searching): what `mcplhost search` and
-- `history_search` answer from instead of reading every row.
-- The runner wraps this file in one transaction; do not put BEGIN/COMMIT here.

-- The bodies as searched (the stored source header skipped; store/search_index.py
-- body_text), as trigrams: any substring of 3 or more characters is looked up
-- here, case folded. Contentless (the text is not stored twice), no positions
-- and no sizes (a search only asks which rows hold all of some trigrams, and
-- checks each candidate against its own row): near the bodies' size on disk.
-- rowid = items.id. Filled by the daemon's indexer, not here: a store with
-- items in it is indexed in the background after this migration, and serves
-- at once (store/search_index.py).
CREATE VIRTUAL TABLE items_search USING fts5(
    body,
    tokenize = 'trigram',
    content = '',
    detail = none,
    columnsize = 0
);

-- The indexer's high-water mark: every item with an id at or below
-- indexed_to is in items_search; a search reads the rows above it one by one.
CREATE TABLE search_index (
    id          INTEGER PRIMARY KEY CHECK (id = 1),
    indexed_to  INTEGER NOT NULL
);
INSERT INTO search_index (id, indexed_to) VALUES (1, 0);

-- FTS5 merges the index's segments in the transaction of the write that
-- adds one (automerge), a few hundred milliseconds at times on a large index:
-- that would hold up inbound commits. Off: the indexer merges in short
-- transactions of its own, a bounded number of pages each.
INSERT INTO items_search (items_search, rank) VALUES ('automerge', 0);

-- The filters of a search are conditions in its statements, answered from
-- indexes (store/search_reader.py): a `hears` entry naming a connector reads
-- that connector's rows newest first, and `--since` finds the lowest id
-- created at or after its time. Each costs inbound one small index entry.
CREATE INDEX items_by_server ON items (server_id, id);
CREATE INDEX items_by_time ON items (created_at);
