-- Per-connector quotas (docs/operations.md#quotas): what each connector had
-- stored, per minute, so `max_items_per_hour` and `max_bytes_per_hour` count a
-- sliding hour (the last 60 minute buckets) that a restart does not reset.
-- The runner wraps this file in one transaction; do not put BEGIN/COMMIT here.

-- One row per (connector, minute) in which it stored anything: the items stored
-- (redeliveries, which store nothing, are not counted) and the bytes of their
-- stored content blocks (the `content` column's JSON). Written in the same
-- transaction as the items it counts; rows older than the hour are deleted by
-- the same writes. Read once per connector when the host first hears from it.
CREATE TABLE quota_usage (
    server_id     TEXT NOT NULL,
    bucket_start  INTEGER NOT NULL,   -- epoch ms of the minute's start (a multiple of 60000)
    items         INTEGER NOT NULL,
    body_bytes    INTEGER NOT NULL,
    PRIMARY KEY (server_id, bucket_start)
) WITHOUT ROWID;
