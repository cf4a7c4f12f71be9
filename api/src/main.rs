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
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(Command::Openapi) = cli.command {
        println!("{}", api::app::openapi().spec());
        return ExitCode::SUCCESS;
    }
    let settings = match Settings::from_env() {
        Ok(s) => Arc::new(s),
        Err(e) => {
            eprintln!("api: {e}");
            return ExitCode::from(2);
        }
    };
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
