-- The finer cause of a failed turn (migrations/sqlite/0009_turn_cause.sql).
-- The runner wraps this file in one transaction; do not put BEGIN/COMMIT here.
ALTER TABLE turns ADD COLUMN cause TEXT NULL;
