-- Per-connector quotas (migrations/sqlite/0007_quotas.sql).
-- The runner wraps this file in one transaction; do not put BEGIN/COMMIT here.
CREATE TABLE quota_usage (
    server_id     TEXT NOT NULL,
    bucket_start  BIGINT NOT NULL,
    items         BIGINT NOT NULL,
    body_bytes    BIGINT NOT NULL,
    PRIMARY KEY (server_id, bucket_start)
);
