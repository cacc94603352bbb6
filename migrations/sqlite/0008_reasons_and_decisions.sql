-- Why a turn ended as it did, and the stateful wake decisions `mcplhost explain`
-- reports (docs/agents.md#explain). The runner wraps this file in one
-- transaction; do not put BEGIN/COMMIT here.

-- Why a turn ended other than `completed` (stopped, backend_error, shutdown,
-- token_budget, ...); NULL for a completed turn and for turns recorded before this.
ALTER TABLE turns ADD COLUMN reason TEXT NULL;

-- Decisions that depend on state the config cannot give back later: an item
-- held by the sender cap, the turn cap or the token budget, or dropped when a
-- stop command cleared the agent's pending wakes. Only those are written (the
-- decisions recomputable from the config and the ledgers are not), so an item
-- that simply does not wake costs the inbound path nothing.
CREATE TABLE wake_decisions (
    item_id    INTEGER NOT NULL,
    agent      TEXT NOT NULL,
    reason     TEXT NOT NULL,      -- sender_cap | turn_cap | token_budget | dropped_by_stop
    decided_at INTEGER NOT NULL,   -- epoch ms
    PRIMARY KEY (item_id, agent)
) WITHOUT ROWID;
