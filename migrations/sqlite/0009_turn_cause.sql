-- The finer cause of a failed turn (docs/agents.md#turns), beside its `reason`:
-- the backend's (`missing_key`, `server_error`, `malformed`, ...) or the
-- exception's type name for `internal_error`. `mcplhost status` reads it for an
-- agent's `lastError` (docs/operations.md#the-status-fields), so a restart does
-- not forget why the newest turn failed. NULL for every other turn and for turns
-- recorded before this. The runner wraps this file in one transaction; do not
-- put BEGIN/COMMIT here.
ALTER TABLE turns ADD COLUMN cause TEXT NULL;
