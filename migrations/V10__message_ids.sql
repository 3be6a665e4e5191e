-- Idempotent message appends, as V9 made event appends: the worker picks
-- the id before its first attempt and keeps it across retries, so an insert
-- whose commit succeeded but whose answer was lost is not stored twice.
ALTER TABLE messages ADD COLUMN message_id uuid;
CREATE UNIQUE INDEX messages_message_id ON messages (message_id) WHERE message_id IS NOT NULL;
