//! `api`: the HTTP server. Thin: parse the command, load settings, hand over to [`api::app`].

use std::{process::ExitCode, sync::Arc};

use clap::{Parser, Subcommand};
use entity::Settings;

/// Subscription backend HTTP API.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Also run the job worker in this process (development, single-box installs).
    #[arg(long, global = true)]
    with_worker: bool,
}

#[derive(Subcommand)]
enum Command {
    /// Serve HTTP (the default).
    Serve,
    /// Print the OpenAPI document (what `openapi/openapi.json` holds).
    Openapi,
    /// Mint an HS256 session token with `BACKEND_JWT_SECRET` (local use and tests).
    Token {
        /// The user id (`sub`, a UUID).
        #[arg(long)]
        sub: uuid::Uuid,
        /// The `email` claim.
        #[arg(long)]
        email: Option<String>,
        /// Lifetime in seconds.
        #[arg(long, default_value_t = 3600)]
        ttl_secs: u64,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    worker::redis_client::install_crypto_provider();
    let cli = Cli::parse();
    if let Some(Command::Openapi) = cli.command {
        println!("{}", api::spec::document());
        return ExitCode::SUCCESS;
    }
    let settings = match Settings::from_env() {
        Ok(s) => Arc::new(s),
        Err(e) => {
            eprintln!("api: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(Command::Token {
        sub,
        email,
        ttl_secs,
    }) = &cli.command
    {
        let Some(secret) = settings.backend_jwt_secret.as_deref() else {
            eprintln!("api: BACKEND_JWT_SECRET is not set");
            return ExitCode::from(2);
        };
        let ttl = std::time::Duration::from_secs(*ttl_secs);
        println!(
            "{}",
            api::identity::session::mint_hs256(secret, *sub, email.as_deref(), ttl)
        );
        return ExitCode::SUCCESS;
    }
    worker::runtime::init_tracing(&settings);
    match api::app::serve(settings, cli.with_worker).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %format!("{e:#}"), "api exiting");
            eprintln!("api: {e:#}");
            ExitCode::FAILURE
        }
    }
}
