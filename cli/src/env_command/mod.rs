//! `kiln env`: the caller's environments (`/v1/environments`) — list, show,
//! create, update, delete, reset-cache. A definition comes from flags or a
//! TOML file like `.kiln/environment.toml`; secrets only from a file or
//! stdin, never from the command line (where `ps` and shell history would
//! show them).

mod definition;
mod show;

use std::process::ExitCode;

use clap::{Args, Subcommand};
use kiln_protocol::Environment;
use reqwest::Method;
use serde_json::Value;

use crate::client::KilnClient;
use crate::commands::Connection;
use crate::render::printable::escape_raw_controls;
pub use definition::DefinitionArgs;

#[derive(Debug, Clone, Args)]
pub struct EnvArgs {
    #[command(subcommand)]
    pub command: EnvCommand,
    #[command(flatten)]
    pub connection: Connection,
}

#[derive(Debug, Clone, Subcommand)]
pub enum EnvCommand {
    /// List your environments: name, image, secrets, cache generation.
    List {
        /// Print the API's environment objects, one JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// Show one environment: its scripts, variables, secret names (never
    /// their values), lock files and setup sandbox.
    Show {
        /// The environment's name.
        name: String,
        /// Print the API's environment object.
        #[arg(long)]
        json: bool,
    },
    /// Create an environment from flags or from a TOML file.
    Create {
        /// The environment's name: lower-case letters, digits, `.`, `_`, `-`.
        name: String,
        #[command(flatten)]
        definition: DefinitionArgs,
        /// Print the created environment as the API's JSON.
        #[arg(long)]
        json: bool,
    },
    /// Change an environment: a --file replaces its definition; flags
    /// change only what they name. Stored secrets stay unless --secrets
    /// gives new ones (then they replace them all).
    Update {
        /// The environment's name.
        name: String,
        #[command(flatten)]
        definition: DefinitionArgs,
        /// Print the updated environment as the API's JSON.
        #[arg(long)]
        json: bool,
    },
    /// Delete an environment (its prepared sandboxes age out of the cache).
    Delete {
        /// The environment's name.
        name: String,
        /// Print `{"deleted": NAME}` instead of a sentence.
        #[arg(long)]
        json: bool,
    },
    /// Make every prepared sandbox of the environment miss: the next run
    /// sets up afresh.
    ResetCache {
        /// The environment's name.
        name: String,
        /// Print the environment (with its new cache generation) as JSON.
        #[arg(long)]
        json: bool,
    },
}

pub async fn env(args: EnvArgs) -> anyhow::Result<ExitCode> {
    let client = args.connection.client()?;
    match args.command {
        EnvCommand::List { json } => list(&client, json).await,
        EnvCommand::Show { name, json } => {
            let env = client.call(Method::GET, &["environments", &name], None).await?;
            print(&env, json, show::details)
        }
        EnvCommand::Create { name, definition, json } => {
            let spec = definition.spec(&name, None)?;
            let env = client.call(Method::POST, &["environments"], Some(&serde_json::to_value(&spec)?)).await?;
            print(&env, json, |e| vec![format!("created environment {}", show::title(e))])
        }
        EnvCommand::Update { name, definition, json } => {
            let current: Environment =
                serde_json::from_value(client.call(Method::GET, &["environments", &name], None).await?)?;
            let spec = definition.spec(&name, Some(&current))?;
            let env = client.call(Method::PUT, &["environments", &name], Some(&serde_json::to_value(&spec)?)).await?;
            print(&env, json, |e| vec![format!("updated environment {}", show::title(e))])
        }
        EnvCommand::Delete { name, json } => {
            client.call(Method::DELETE, &["environments", &name], None).await?;
            if json {
                println!("{}", serde_json::json!({ "deleted": name }));
            } else {
                println!("deleted environment {name}");
            }
            Ok(ExitCode::SUCCESS)
        }
        EnvCommand::ResetCache { name, json } => {
            let env = client.call(Method::POST, &["environments", &name, "reset-cache"], None).await?;
            print(&env, json, |e| {
                vec![format!(
                    "environment {}: cache reset (generation {}); the next run sets up afresh",
                    e.name, e.cache_generation
                )]
            })
        }
    }
}

async fn list(client: &KilnClient, json: bool) -> anyhow::Result<ExitCode> {
    let answer = client.call(Method::GET, &["environments"], None).await?;
    let environments: Vec<Environment> = serde_json::from_value(answer["environments"].clone())?;
    if json {
        for env in &environments {
            println!("{}", escape_raw_controls(&serde_json::to_string(env)?));
        }
        return Ok(ExitCode::SUCCESS);
    }
    for line in show::table(&environments) {
        println!("{line}");
    }
    Ok(ExitCode::SUCCESS)
}

/// One environment as JSON or as the lines `words` makes of it.
fn print(answer: &Value, json: bool, words: impl Fn(&Environment) -> Vec<String>) -> anyhow::Result<ExitCode> {
    if json {
        println!("{}", escape_raw_controls(&serde_json::to_string(answer)?));
        return Ok(ExitCode::SUCCESS);
    }
    let env: Environment = serde_json::from_value(answer.clone())?;
    for line in words(&env) {
        println!("{line}");
    }
    Ok(ExitCode::SUCCESS)
}
