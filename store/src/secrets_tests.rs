use super::*;

fn key() -> SecretsKey {
    SecretsKey::from_hex(&"ab".repeat(32)).unwrap()
}

const E: Uuid = Uuid::from_u128(0xE);
const F: Uuid = Uuid::from_u128(0xF);

fn headers() -> BTreeMap<String, String> {
    BTreeMap::from([("Authorization".to_owned(), "Bearer hunter2".to_owned())])
}

/// A value as the format before [`FORMAT_V2`] sealed it: under the
/// deployment's key itself, nonce then ciphertext, the owner (and server)
/// as associated data. Written out here as it was, not through the code
/// under test.
fn sealed_the_old_way(at: &Sealed<'_>, values: &BTreeMap<String, String>) -> Vec<u8> {
    let raw = [0xabu8; 32];
    let aad = match at.field {
        Field::Secrets => at.owner.as_bytes().to_vec(),
        Field::McpHeaders(server) => {
            [b"\0kiln-mcp-headers\0".as_slice(), at.owner.as_bytes(), b"\0", server.as_bytes()].concat()
        }
    };
    let nonce = XChaCha20Poly1305::generate_nonce(&mut OsRng);
    let plain = serde_json::to_vec(values).unwrap();
    let sealed = XChaCha20Poly1305::new((&raw).into()).encrypt(&nonce, Payload { msg: &plain, aad: &aad }).unwrap();
    [nonce.as_slice(), &sealed].concat()
}

#[test]
fn sealed_secrets_open_for_their_owner_only_and_hold_no_plaintext() {
    let secrets = BTreeMap::from([("TOKEN".to_owned(), "hunter2-hunter2".to_owned())]);
    let at = Sealed::secrets("alice", E);
    let sealed = key().seal(&at, &secrets).unwrap();
    assert_eq!(sealed[0], FORMAT_V2);
    assert!(!sealed.windows(7).any(|w| w == b"hunter2"));
    assert_eq!(key().open(&at, &sealed).unwrap(), secrets);
    assert!(key().open(&Sealed::secrets("mallory", E), &sealed).is_err());
    let other = SecretsKey::from_hex(&"cd".repeat(32)).unwrap();
    assert!(other.open(&at, &sealed).is_err());
    // Two sealings of the same map differ (fresh nonce).
    assert_ne!(sealed, key().seal(&at, &secrets).unwrap());
}

#[test]
fn a_value_sealed_for_one_environment_does_not_open_for_another_of_the_same_owner() {
    let secrets = BTreeMap::from([("TOKEN".to_owned(), "hunter2".to_owned())]);
    let sealed = key().seal(&Sealed::secrets("alice", E), &secrets).unwrap();
    assert!(key().open(&Sealed::secrets("alice", F), &sealed).is_err());
    let sealed = key().seal(&Sealed::mcp_headers("alice", E, "demo"), &headers()).unwrap();
    assert!(key().open(&Sealed::mcp_headers("alice", F, "demo"), &sealed).is_err());
    // The control: the right environment opens both.
    assert_eq!(key().open(&Sealed::mcp_headers("alice", E, "demo"), &sealed).unwrap(), headers());
}

#[test]
fn mcp_headers_open_for_their_owner_environment_and_server_only() {
    let at = Sealed::mcp_headers("alice", E, "demo");
    let sealed = key().seal(&at, &headers()).unwrap();
    assert!(!sealed.windows(7).any(|w| w == b"hunter2"));
    assert_eq!(key().open(&at, &sealed).unwrap(), headers());
    assert!(key().open(&Sealed::mcp_headers("alice", E, "other"), &sealed).is_err());
    assert!(key().open(&Sealed::mcp_headers("mallory", E, "demo"), &sealed).is_err());
    assert!(key().open(&Sealed::secrets("alice", E), &sealed).is_err());
}

#[test]
fn bindings_whose_parts_run_together_differ() {
    // Length-prefixed parts: "ab" + server "c" is not "a" + server "bc".
    let a = Sealed::mcp_headers("ab", E, "c").aad();
    let b = Sealed::mcp_headers("a", E, "bc").aad();
    assert_ne!(a, b);
    assert_ne!(Sealed::secrets("alice", E).aad(), Sealed::mcp_headers("alice", E, "secrets").aad());
}

#[test]
fn values_sealed_the_old_way_still_open_and_are_sealed_again_the_new_way() {
    for at in [Sealed::secrets("alice", E), Sealed::mcp_headers("alice", E, "demo")] {
        let old = sealed_the_old_way(&at, &headers());
        assert_eq!(key().open(&at, &old).unwrap(), headers(), "{at:?}");
        // Bound as before: another owner or server still does not open it.
        assert!(key().open(&Sealed { owner: "mallory", ..at }, &old).is_err());
        let new = key().reseal_if_old(&at, &old).unwrap().unwrap();
        assert_eq!(new[0], FORMAT_V2);
        assert!(key().reseal_if_old(&at, &new).unwrap().is_none(), "a current value is kept as it is");
        assert_eq!(key().open(&at, &new).unwrap(), headers());
        // Once sealed again, it is bound to its environment.
        assert!(key().open(&Sealed { environment: F, ..at }, &new).is_err());
    }
    // An old value whose nonce happens to start with the version byte
    // still opens (the new format is tried, then the old).
    let at = Sealed::secrets("alice", E);
    let old = std::iter::repeat_with(|| sealed_the_old_way(&at, &headers())).find(|s| s[0] == FORMAT_V2).unwrap();
    assert_eq!(key().open(&at, &old).unwrap(), headers());
}

#[test]
fn the_keys_are_derived_per_purpose_and_none_is_the_deployments_key() {
    let k = key();
    let [legacy, sealing, fingerprint] = [&k.legacy, &k.sealing, &k.fingerprint].map(|s| *s.expose_secret());
    assert_eq!(legacy, [0xab; 32]);
    assert_ne!(sealing, legacy);
    assert_ne!(fingerprint, legacy);
    assert_ne!(fingerprint, sealing);
    // The fingerprint is not the HMAC under the deployment's key (what it
    // was before) nor under the sealing key.
    let under = |key: &[u8]| {
        let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(key).unwrap();
        mac.update(b"kiln-environment-secret\0A\x001");
        hex::encode(mac.finalize().into_bytes())
    };
    assert_eq!(k.fingerprint("A", "1"), under(&fingerprint));
    assert_ne!(k.fingerprint("A", "1"), under(&legacy));
    assert_ne!(k.fingerprint("A", "1"), under(&sealing));
}

#[test]
fn keys_are_64_hex_digits_and_fingerprints_follow_the_value() {
    assert!(SecretsKey::from_hex("short").is_err());
    assert!(SecretsKey::from_hex(&"zz".repeat(32)).is_err());
    let k = key();
    assert_eq!(k.fingerprint("A", "1"), k.fingerprint("A", "1"));
    assert_ne!(k.fingerprint("A", "1"), k.fingerprint("A", "2"));
    assert_ne!(k.fingerprint("A", "1"), SecretsKey::from_hex(&"cd".repeat(32)).unwrap().fingerprint("A", "1"));
    assert!(!format!("{k:?}").contains("ab"));
}
