-- Environments: how a subject's runs get their sandbox prepared (image,
-- setup and maintenance scripts, variables, secrets, the lock files that
-- key the cache). Runs name one by `name` (kept in runs.policy).
CREATE TABLE environments (
    id                  uuid PRIMARY KEY,
    owner               text NOT NULL,
    name                text NOT NULL,
    image               text,
    setup_script        text NOT NULL DEFAULT '',
    maintenance_script  text,
    variables           jsonb NOT NULL DEFAULT '{}'::jsonb,
    -- The secrets' names in clear (what the API shows) and their values
    -- sealed with the deployment's key (KILN_SECRETS_KEY): a 24-byte
    -- XChaCha20-Poly1305 nonce, then the ciphertext of a JSON object.
    -- NULL: no secrets. The plaintext is never stored.
    secret_names        text[] NOT NULL DEFAULT '{}',
    secrets_sealed      bytea,
    lock_files          jsonb NOT NULL,
    setup_sandbox       jsonb NOT NULL DEFAULT '{}'::jsonb,
    -- Part of the cache key: raising it (reset cache) makes every prepared
    -- sandbox of this environment miss.
    cache_generation    bigint NOT NULL DEFAULT 0,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    UNIQUE (owner, name)
);
