-- An environment's MCP servers (issue 18): what the API shows of them
-- (url or command, args, env, cwd, timeout_s, the headers' NAMES) and,
-- per remote server, its header values sealed with the deployment's key
-- (KILN_SECRETS_KEY, XChaCha20-Poly1305 as secrets_sealed, the owner and
-- the server's name as associated data), hex-encoded: server name -> a
-- 24-byte nonce then the ciphertext of a JSON object. The plaintext is
-- never stored. Neither column is part of the cache key.
ALTER TABLE environments
    ADD COLUMN mcp_servers        jsonb NOT NULL DEFAULT '{}'::jsonb,
    ADD COLUMN mcp_headers_sealed jsonb NOT NULL DEFAULT '{}'::jsonb;
