-- A worker holds a session-level advisory lock for as long as its process
-- lives (store/src/presence.rs); Postgres lets go of it the moment the
-- worker's connection closes, which is how the others learn within a second
-- that it died and hand its runs back without waiting for their leases.
--
-- The lock's key is not a hash of the worker's id: each worker process takes
-- a number from this sequence, unique among the processes alive at once, so
-- two workers can never share a key. Keys use the two-integer form
-- pg_advisory_lock(1263094862, key), whose space is apart from the
-- single-bigint locks Kiln (and most applications) take elsewhere.
CREATE SEQUENCE worker_lock_keys AS integer MINVALUE 1 MAXVALUE 2147483647 CYCLE;

-- lock_key: the key the worker holds (NULL: a worker from before this
-- migration, judged by its lease only). lock_epoch: the server's start time
-- when it took the lock; a lock taken before a restart or a failover was
-- lost with that server, not with its worker, so it says nothing until the
-- worker takes it again. lost_at: when another worker found the lock free
-- and handed the worker's runs back.
ALTER TABLE workers
    ADD COLUMN lock_key integer,
    ADD COLUMN lock_epoch timestamptz,
    ADD COLUMN lost_at timestamptz;
