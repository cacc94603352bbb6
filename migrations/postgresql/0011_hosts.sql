-- The hosts sharing this database (migrations/sqlite/0011_hosts.sql): each
-- upserts its row at start and at every heartbeat, and deletes it at a clean stop.
-- The runner wraps this file in one transaction; do not put BEGIN/COMMIT here.
CREATE TABLE hosts (
    name          TEXT PRIMARY KEY,
    pid           BIGINT NOT NULL,
    version       TEXT NOT NULL,
    started_at    BIGINT NOT NULL,
    heartbeat_at  BIGINT NOT NULL,
    connectors    TEXT NOT NULL,
    agents        TEXT NOT NULL,
    session_pid   BIGINT NOT NULL
);
