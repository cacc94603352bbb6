-- Idempotent channel items, conversation and thread as columns, and the item
-- each push event stored.
-- The runner wraps this file in one transaction; do not put BEGIN/COMMIT here.

-- metadata.threadId, copied out so a correction finds its original's thread
-- (and agents read a conversation) without parsing JSON.
ALTER TABLE items ADD COLUMN thread_id TEXT NULL;

-- ingest.conversation_id(server, channel, thread): the id the connector was
-- answered with. Rows stored before this migration keep NULL here: the id is a
-- SHA-256 that SQL cannot compute, and whoever reads one computes it from
-- server_id, channel_id and thread_id instead.
ALTER TABLE items ADD COLUMN conversation_id TEXT NULL;

-- The redelivery key: metadata.sourceBodyDigest (the digest of the body as
-- delivered) for a channels/incoming item, NULL for every other row (pushes
-- dedup on their eventId in push_events; local input is never redelivered).
-- NULLs are distinct in a UNIQUE index, so only channel items are constrained.
ALTER TABLE items ADD COLUMN dedup_digest TEXT NULL;

UPDATE items SET thread_id = json_extract(metadata, '$.threadId')
 WHERE json_type(metadata, '$.threadId') = 'text';

-- Old databases may already hold redeliveries stored twice (byte-identical:
-- same connector, channel, message id and delivered body). The FIRST of each
-- such group gets its key and stays the original a new redelivery is answered
-- from; the later copies keep NULL, so they are outside the unique key. No row
-- is deleted: a migration never throws away what was stored.
UPDATE items SET dedup_digest = json_extract(metadata, '$.sourceBodyDigest')
 WHERE id IN (
    SELECT min(id) FROM items
     WHERE message_id IS NOT NULL AND channel_id IS NOT NULL AND server_id IS NOT NULL
       AND json_extract(metadata, '$.source.lane') = 'channels/incoming'
       AND json_type(metadata, '$.sourceBodyDigest') = 'text'
     GROUP BY channel_id, message_id, server_id, json_extract(metadata, '$.sourceBodyDigest')
 );

-- Replaces the plain (channel_id, message_id) index: the same prefix still
-- serves "the original of a correction", and the whole key makes a repeated
-- channel item a conflict (`INSERT ... ON CONFLICT DO NOTHING`).
DROP INDEX items_by_message;
CREATE UNIQUE INDEX items_by_message ON items (channel_id, message_id, server_id, dedup_digest)
 WHERE message_id IS NOT NULL;

-- The item a push event stored, so a repeat is answered with the original's id.
ALTER TABLE push_events ADD COLUMN item_id INTEGER NULL;

UPDATE push_events SET item_id = found.id
  FROM (SELECT server_id, json_extract(metadata, '$.eventId') AS event_id, min(id) AS id
          FROM items
         WHERE json_extract(metadata, '$.source.lane') = 'push/event'
         GROUP BY server_id, json_extract(metadata, '$.eventId')) AS found
 WHERE found.server_id = push_events.server_id AND found.event_id = push_events.event_id;
