-- Compaction: a summary message stands in for the conversation before it,
-- except the `summary_keeps` messages just before it, which stay verbatim.
-- The summarised messages stay in the table (the full history is kept);
-- loading a conversation starts from its latest summary.
ALTER TABLE messages ADD COLUMN summary_keeps integer CHECK (summary_keeps >= 0);
