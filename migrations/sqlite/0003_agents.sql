-- Agents' ledger: one row per turn, and each agent's durable cursor.
-- The runner wraps this file in one transaction; do not put BEGIN/COMMIT here.

-- One row per agent turn (docs/agents.md#turns), exported by `mcplhost turns`.
-- A turn is written when it begins, so a host killed mid-turn leaves a row
-- with ended_at and outcome NULL (the host closes such rows as aborted).
CREATE TABLE turns (
    id             INTEGER PRIMARY KEY,
    agent          TEXT NOT NULL,
    wake_item_ids  TEXT NOT NULL,       -- JSON array of the item ids that woke it (empty: no wake)
    started_at     INTEGER NOT NULL,    -- epoch ms
    ended_at       INTEGER NULL,        -- epoch ms; NULL while the turn runs
    outcome        TEXT NULL,           -- completed | failed | aborted | held; NULL while the turn runs
    model          TEXT NULL,           -- the model the backend reported (or was asked for)
    usage          TEXT NULL,           -- JSON object: inputTokens, outputTokens, cachedTokens
    request_digest TEXT NULL,           -- SHA-256 (64 lowercase hex) of the first compiled request
    injections     TEXT NULL,           -- JSON: the hook injections compiled in, so the digest can be reproduced
    tokens         INTEGER NOT NULL DEFAULT 0   -- inputTokens + outputTokens, summed for max_tokens_per_day
);

-- An agent's turns in time order: its export, its hourly turn count and its daily token spend.
CREATE INDEX turns_by_agent ON turns (agent, started_at);

-- Each agent's last fully handled item id; catch-up starts after it.
CREATE TABLE agent_cursors (
    agent      TEXT PRIMARY KEY,
    item_id    INTEGER NOT NULL,
    updated_at INTEGER NOT NULL         -- epoch ms
) WITHOUT ROWID;
