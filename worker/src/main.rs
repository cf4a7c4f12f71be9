//! `worker`: processes the job queues. Thin: settings → logging → [`worker::runtime::run`].
//!
//! `worker` runs until SIGTERM/SIGINT; `worker dead-letters [QUEUE] [--limit N]`
//! prints the dead-letter queue as JSON lines; `worker dead-letters redrive
//! <ID>…|--all [QUEUE]` puts dead letters back on their queue.

use std::sync::Arc;

use entity::Settings;
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    worker::redis_client::install_crypto_provider();
    let settings = match Settings::from_env() {
        Ok(s) => Arc::new(s),
        Err(e) => {
            eprintln!("worker: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    worker::runtime::init_tracing(&settings);
    let args: Vec<String> = std::env::args().skip(1).collect();
    let res = match args.first().map(String::as_str) {
        None | Some("run") => {
            let shutdown = CancellationToken::new();
            worker::runtime::cancel_on_signal(shutdown.clone());
            worker::runtime::run(settings, shutdown).await
        }
        Some("dead-letters") => worker::runtime::print_dead_letters(&settings, &args[1..]).await,
        Some(other) => Err(anyhow::anyhow!(
            "unknown command {other:?}; use `worker`, `worker dead-letters [QUEUE] [--limit N]` \
             or `worker dead-letters redrive <ID>…|--all [QUEUE]`"
        )),
    };
    match res {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %format!("{e:#}"), "worker exiting");
            eprintln!("worker: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
