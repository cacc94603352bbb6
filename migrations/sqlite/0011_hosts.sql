-- The hosts sharing one store (docs/operations.md#several-hosts-on-one-store).
-- Read and written only on PostgreSQL, where several hosts share a database;
-- an SQLite file has one daemon and keeps this table empty (both engines list
-- the same steps and columns).
-- The runner wraps this file in one transaction; do not put BEGIN/COMMIT here.
CREATE TABLE hosts (
    name          TEXT PRIMARY KEY,   -- its [host] name
    pid           INTEGER NOT NULL,   -- that daemon's pid, on its machine
    version       TEXT NOT NULL,
    started_at    INTEGER NOT NULL,   -- epoch ms
    heartbeat_at  INTEGER NOT NULL,   -- epoch ms, the database's clock; older than the live bound: not live
    connectors    TEXT NOT NULL,      -- JSON array of the connector names it owns
    agents        TEXT NOT NULL,      -- JSON array of the agent names it runs
    session_pid   INTEGER NOT NULL    -- the server process of its session: gone with the session, so is the host
);
