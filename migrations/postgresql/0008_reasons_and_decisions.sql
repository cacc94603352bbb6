-- Why a turn ended as it did, and the stateful wake decisions
-- (migrations/sqlite/0008_reasons_and_decisions.sql).
-- The runner wraps this file in one transaction; do not put BEGIN/COMMIT here.
ALTER TABLE turns ADD COLUMN reason TEXT NULL;

CREATE TABLE wake_decisions (
    item_id    BIGINT NOT NULL,
    agent      TEXT NOT NULL,
    reason     TEXT NOT NULL,
    decided_at BIGINT NOT NULL,
    PRIMARY KEY (item_id, agent)
);
