-- Which Docker engine each worker drives (Docker's `info` ID), so a worker
-- that stops for good can tell whether another live worker still looks
-- after the idle session containers on its engine; if none does, it
-- removes them itself rather than strand them.
ALTER TABLE workers ADD COLUMN IF NOT EXISTS engine text;
