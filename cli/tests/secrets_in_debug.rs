//! No settings or configuration struct prints a secret with `{:?}`: every
//! key, token, secret and database password is parsed as the binary parses
//! it, carried into the API's and the worker's configuration, and each of
//! those is formatted and searched for the secrets.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use clap::Parser;
use kiln_cli::commands::Connection;
use kiln_cli::up::UpArgs;

const DB_PASSWORD: &str = "pw-db-4c1d";
const JWT_SECRET: &str = "jwt-secret-4c1d-0123456789abcdef0123456789";
const WEBHOOK_SECRET: &str = "webhook-secret-4c1d";
const OPENAI_KEY: &str = "sk-openai-4c1d";
const ANTHROPIC_KEY: &str = "sk-ant-4c1d";
const GITHUB_TOKEN: &str = "ghp-token-4c1d";
const CALLBACK_SECRET: &str = "callback-secret-4c1d";
const KILN_TOKEN: &str = "kiln-token-4c1d";
const METRICS_TOKEN: &str = "metrics-token-4c1d";
const STREAM_TOKEN_SECRET: &str = "stream-token-secret-4c1d-0123456789abcdef";

const SECRETS: [&str; 10] = [
    DB_PASSWORD,
    JWT_SECRET,
    WEBHOOK_SECRET,
    OPENAI_KEY,
    ANTHROPIC_KEY,
    GITHUB_TOKEN,
    CALLBACK_SECRET,
    KILN_TOKEN,
    METRICS_TOKEN,
    STREAM_TOKEN_SECRET,
];

/// `kiln up`'s arguments hold every server-side setting (the database, the
/// API's and the worker's options, callbacks); `kiln run`'s the client's.
#[derive(Parser)]
struct Everything {
    #[command(flatten)]
    up: UpArgs,
    #[command(flatten)]
    connection: Connection,
}

fn parse() -> Everything {
    let url = format!("postgres://kiln:{DB_PASSWORD}@127.0.0.1:5432/kiln");
    Everything::try_parse_from([
        "kiln",
        "--database-url",
        &url,
        "--jwt-secret",
        JWT_SECRET,
        "--github-webhook-secret",
        WEBHOOK_SECRET,
        "--openai-api-key",
        OPENAI_KEY,
        "--anthropic-api-key",
        ANTHROPIC_KEY,
        "--github-token",
        GITHUB_TOKEN,
        "--callback-secret",
        CALLBACK_SECRET,
        "--token",
        KILN_TOKEN,
        "--metrics-token",
        METRICS_TOKEN,
        "--stream-token-secret",
        STREAM_TOKEN_SECRET,
    ])
    .expect("the arguments parse")
}

fn assert_no_secret(what: &str, debug: String) {
    for secret in SECRETS {
        assert!(!debug.contains(secret), "{what} prints {secret:?}: {debug}");
    }
}

#[test]
fn no_settings_or_config_struct_prints_a_secret() {
    // The GitHub and model clients are built with reqwest, which needs a TLS provider installed.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let Everything { up, connection } = parse();
    assert_no_secret("UpArgs", format!("{up:?}"));
    assert_no_secret("Connection", format!("{connection:?}"));
    for (what, debug) in [
        ("DbArgs", format!("{:?}", up.db)),
        ("AuthArgs", format!("{:?}", up.api.auth)),
        ("ApiArgs", format!("{:?}", up.api.api)),
        ("GithubArgs", format!("{:?}", up.api.github)),
        ("ModelArgs", format!("{:?}", up.worker.model)),
        ("WorkerArgs", format!("{:?}", up.worker.worker)),
        ("GithubDeliveryArgs", format!("{:?}", up.worker.delivery)),
        ("CallbackArgs", format!("{:?}", up.callbacks)),
    ] {
        assert_no_secret(what, debug);
    }

    let api = up.api.parts(&up.callbacks, &up.repos).expect("the API's settings are valid");
    assert!(api.github.is_some() && api.settings.callback_secret.is_some());
    assert_no_secret("ApiSettings", format!("{:?}", api.settings));
    assert_no_secret("GithubWebhookConfig", format!("{:?}", api.github));
    let auth = kiln_api::AuthConfig::Hs256 { secret: JWT_SECRET.as_bytes().to_vec().into() };
    assert_no_secret("AuthConfig", format!("{auth:?}"));

    let worker = up.worker.parts(&up.callbacks, &up.repos).expect("the worker's settings are valid");
    assert!(worker.config.github.is_some() && worker.config.callbacks.is_some());
    assert!(worker.endpoints.openai_api_key.is_some() && worker.endpoints.anthropic_api_key.is_some());
    assert_no_secret("WorkerParts", format!("{worker:?}"));
    assert_no_secret("WorkerConfig", format!("{:?}", worker.config));
    assert_no_secret("Github", format!("{:?}", worker.config.github));
    assert_no_secret("CallbackSettings", format!("{:?}", worker.config.callbacks));
    assert_no_secret("ProviderEndpoints", format!("{:?}", worker.endpoints));
}

#[test]
fn the_secrets_still_reach_what_uses_them() {
    use secrecy::ExposeSecret;
    let Everything { up, connection } = parse();
    let url = up.db.url().unwrap().expose_secret().to_owned();
    assert_eq!(url, format!("postgres://kiln:{DB_PASSWORD}@127.0.0.1:5432/kiln"));
    assert_eq!(connection.token.as_ref().expect("token parsed").expose_secret(), KILN_TOKEN);
    let endpoints = up.worker.model.endpoints().unwrap();
    assert_eq!(endpoints.openai_api_key.unwrap().expose_secret(), OPENAI_KEY);
    assert_eq!(endpoints.anthropic_api_key.unwrap().expose_secret(), ANTHROPIC_KEY);
    let token = kiln_api::auth::mint_hs256(JWT_SECRET.as_bytes(), "someone", std::time::Duration::from_secs(60));
    let auth = up.api.auth.authenticator().unwrap();
    assert_eq!(auth.verify(&token.unwrap()).unwrap(), "someone");
}
