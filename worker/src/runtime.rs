//! The worker runtime: one supervised apalis worker per served queue, the
//! promotion task (backlog guard), the maintenance loop (bounded vacuum and
//! dead-letter purge) and the job outbox's relay ([`crate::outbox`]). Used by
//! the `worker` binary and by `api --with-worker`.
//!
//! * A job attempt that fails transiently is acknowledged and retried later by
//!   our own schedule ([`crate::retry`]); a permanent failure, or a transient
//!   one once the retry horizon is spent, dead-letters it.
//!
//! * A worker that loses Redis or the database does not exit: its supervisor
//!   logs the error and starts a fresh worker (new unique name) after a backoff
//!   of 1 s doubling to 30 s.
//! * Every attempt is bounded by `JOB_TIMEOUT_SECS`: one still running then is
//!   abandoned and counts as a transient failure (retried by our schedule). A
//!   handler that panics dead-letters its job (the panic is caught here; the
//!   worker keeps running).
//! * On shutdown (the token is cancelled: SIGTERM/SIGINT) workers stop fetching
//!   and jobs in flight get `WORKER_SHUTDOWN_TIMEOUT_SECS` to finish and be
//!   acknowledged; what is left is returned to the queue at once
//!   ([`crate::drain`]), then `run` returns.

use std::{sync::Arc, time::Duration};

use anyhow::Context as _;
use apalis::prelude::{BackendExt, BoxDynError, Data, TaskId, WorkerBuilder, WorkerBuilderExt};
use entity::Settings;
use sea_orm::DatabaseConnection;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::{
    drain::{self, Drain},
    jobs::{
        self,
        context::{JobContext, JobError},
        Envelope, Job, QueueName,
    },
    mailer::Mailer,
    metrics::JobOutcome,
    queue::{Queues, PROMOTE_EVERY},
    retry::{random_jitter, RetryPolicy},
};

/// What the task function needs to bound attempts and schedule retries.
#[derive(Clone)]
struct Retrier {
    queues: Queues,
    policy: RetryPolicy,
    /// `JOB_TIMEOUT_SECS`.
    timeout: Duration,
    /// `WORKER_TEST_PANIC_MARKER` (tests only).
    test_panic_marker: Option<Arc<str>>,
}

/// Jobs in flight per apalis worker; `WORKER_CONCURRENCY` is split across
/// `ceil(WORKER_CONCURRENCY / PER_WORKER)` workers per queue.
pub const PER_WORKER: usize = 16;

/// How often an idle worker polls its queue for new jobs.
pub const POLL_EVERY: Duration = Duration::from_millis(50);

/// The queues this process serves (`WORKER_QUEUES`, default all).
pub fn served_queues(settings: &Settings) -> anyhow::Result<Vec<QueueName>> {
    match &settings.worker_queues {
        None => Ok(QueueName::ALL.to_vec()),
        Some(list) => list
            .iter()
            .map(|q| {
                q.parse::<QueueName>()
                    .map_err(|e| anyhow::anyhow!("WORKER_QUEUES: {e}"))
            })
            .collect(),
    }
}

/// Connects to the database (the request and job pool,
/// [`entity::base::db::connect`]), retrying with backoff until it answers or
/// `shutdown` is cancelled.
pub async fn connect_db(
    settings: &Settings,
    shutdown: &CancellationToken,
) -> anyhow::Result<DatabaseConnection> {
    retry_db(shutdown, || entity::base::db::connect(settings)).await
}

/// Like [`connect_db`], for the small startup pool that applies migrations
/// ([`entity::base::db::connect_for_startup`]).
pub async fn connect_db_for_startup(
    settings: &Settings,
    shutdown: &CancellationToken,
) -> anyhow::Result<DatabaseConnection> {
    retry_db(shutdown, || entity::base::db::connect_for_startup(settings)).await
}

async fn retry_db<F, Fut>(
    shutdown: &CancellationToken,
    open: F,
) -> anyhow::Result<DatabaseConnection>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<DatabaseConnection, sea_orm::DbErr>>,
{
    let mut delay = Duration::from_millis(500);
    loop {
        match open().await {
            Ok(db) => return Ok(db),
            Err(e) => {
                tracing::warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "database unavailable");
                tokio::select! {
                    _ = shutdown.cancelled() => anyhow::bail!("shut down while waiting for the database"),
                    _ = tokio::time::sleep(delay) => {}
                }
                delay = (delay * 2).min(Duration::from_secs(10));
            }
        }
    }
}

/// Opens the queue backend, retrying with backoff (SQLite can fail on an
/// unwritable file, or on a busy one past [`Queues::connect`]'s own bounded
/// wait; Redis connects lazily and does not fail here).
pub async fn connect_queues(
    settings: &Settings,
    shutdown: &CancellationToken,
) -> anyhow::Result<Queues> {
    let mut delay = Duration::from_millis(500);
    loop {
        match Queues::connect(settings).await {
            Ok(q) => return Ok(q),
            Err(e) => {
                tracing::warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "queue unavailable");
                tokio::select! {
                    _ = shutdown.cancelled() => anyhow::bail!("shut down while waiting for the queue"),
                    _ = tokio::time::sleep(delay) => {}
                }
                delay = (delay * 2).min(Duration::from_secs(10));
            }
        }
    }
}

/// Runs the worker until `shutdown` is cancelled.
pub async fn run(settings: Arc<Settings>, shutdown: CancellationToken) -> anyhow::Result<()> {
    let served = served_queues(&settings)?;
    let mailer = Mailer::from_settings(&settings)
        .context("email transport")?
        .map(Arc::new);
    if mailer.is_none() {
        tracing::warn!(
            "no email transport configured: send_email jobs will be retried until one is"
        );
    }
    let metrics = match settings.metrics_token {
        Some(_) => Some(crate::metrics::install().map_err(anyhow::Error::msg)?),
        None => None,
    };
    let db = connect_db(&settings, &shutdown).await?;
    let queues = connect_queues(&settings, &shutdown).await?;
    let http = crate::http::serve(
        settings.clone(),
        db.clone(),
        queues.clone(),
        metrics,
        shutdown.clone(),
    )
    .await
    .context("WORKER_HTTP_PORT")?;
    let storage = crate::storage::Storage::open(&settings.storage_url)
        .context("object store (STORAGE_URL)")?;
    let providers = crate::providers::Providers::new(settings.clone())
        .context("payment providers' HTTP client")?;
    let billing = Arc::new(
        crate::mailer::billing::BillingTemplates::load(&settings)
            .context("billing mail templates")?,
    );
    let ctx = JobContext {
        billing,
        billing_terms: entity::billing::Terms::from_settings(&settings),
        renewal_policy: Arc::new(entity::billing::renewal::Policy::from_settings(&settings)),
        db,
        mailer,
        storage,
        providers,
    };
    let retrier = Retrier {
        queues: queues.clone(),
        policy: RetryPolicy::from_settings(&settings),
        timeout: settings.job_timeout,
        test_panic_marker: settings.worker_test_panic_marker.as_deref().map(Arc::from),
    };
    let drain = Drain {
        grace: settings.worker_shutdown_timeout,
        heartbeat: settings.worker_heartbeat,
    };

    // Guard the Redis backlog before the first fetch (see queue.rs).
    for q in &served {
        match queues.promote_due(*q).await {
            Ok(n) if n > 0 => tracing::info!(queue = %q, promoted = n, "promoted due jobs"),
            Ok(_) => {}
            Err(e) => tracing::warn!(queue = %q, error = %e, "could not promote due jobs yet"),
        }
    }

    tracing::info!(
        backend = queues.kind(),
        queues = ?served.iter().map(|q| queues.name(*q).to_string()).collect::<Vec<_>>(),
        concurrency = settings.worker_concurrency,
        "worker started"
    );

    let mut set = JoinSet::new();
    for q in served.iter().copied() {
        // One apalis worker runs its fetches, acknowledgements and heartbeats
        // one after another; several per queue keep Redis round trips from
        // capping throughput. Each takes up to PER_WORKER jobs in flight.
        let mut left = settings.worker_concurrency;
        while left > 0 {
            let n = left.min(PER_WORKER);
            left -= n;
            set.spawn(supervise(
                queues.clone(),
                q,
                ctx.clone(),
                retrier.clone(),
                n,
                drain,
                shutdown.clone(),
            ));
        }
    }
    set.spawn(promote(queues.clone(), served.clone(), shutdown.clone()));
    set.spawn(crate::scheduler::run(
        ctx.db.clone(),
        queues.clone(),
        settings.clone(),
        format!("worker-{}", ulid::Ulid::new()),
        shutdown.clone(),
    ));
    set.spawn(crate::outbox::run(
        ctx.db.clone(),
        queues.clone(),
        shutdown.clone(),
    ));
    set.spawn(maintain(
        queues.clone(),
        served.clone(),
        settings.clone(),
        shutdown.clone(),
    ));
    while let Some(res) = set.join_next().await {
        if let Err(e) = res {
            tracing::error!(error = %e, "worker task ended abnormally");
        }
    }
    shutdown.cancel();
    let _ = http.await;
    tracing::info!("worker stopped");
    Ok(())
}

/// The apalis task function: decode → [`jobs::handle`] → on a transient
/// failure, schedule the retry and acknowledge this attempt.
async fn run_job(
    env: Envelope,
    ctx: Data<JobContext>,
    retrier: Data<Retrier>,
    id: TaskId,
) -> Result<(), BoxDynError> {
    let task_id = id.to_string();
    let state = env.state(&task_id);
    let key = state.idempotency_key.clone();
    let n = state.attempt;
    let kind = env.job.kind();
    let started = std::time::Instant::now();
    let res = attempt(&env.job, &key, n, &ctx, &retrier).await;
    tracing::debug!(%task_id, idempotency_key = %key, kind, attempt = n, ok = res.is_ok(), elapsed_ms = started.elapsed().as_millis() as u64, "job attempt finished");
    let outcome = |o| crate::metrics::record_job(kind, o, started.elapsed());
    let reason = match res {
        Ok(()) => {
            outcome(JobOutcome::Done);
            return Ok(());
        }
        Err(JobError::Permanent(m)) => {
            outcome(JobOutcome::DeadLettered);
            return Err(JobError::Permanent(m).into_apalis());
        }
        Err(JobError::Retry(m)) => m,
    };
    let Some(delay) = retrier
        .policy
        .next_delay(n, state.delayed(), random_jitter())
    else {
        tracing::error!(%task_id, idempotency_key = %key, kind, attempts = n, error = %reason, "retry horizon spent; dead-lettered");
        outcome(JobOutcome::DeadLettered);
        return Err(JobError::Permanent(format!(
            "retry horizon spent after {n} attempts; last error: {reason}"
        ))
        .into_apalis());
    };
    outcome(JobOutcome::Retried);
    match retrier
        .queues
        .schedule_retry(env.job, state.next(delay), delay)
        .await
    {
        Ok(retry_id) => {
            tracing::info!(%task_id, idempotency_key = %key, kind, attempt = n, retry_task_id = %retry_id, retry_in_ms = delay.as_millis() as u64, error = %reason, "job failed; retry scheduled");
            Ok(())
        }
        Err(e) => {
            // The queue's own retry takes over (apalis-redis: a few seconds later).
            tracing::warn!(%task_id, kind, error = %e, "could not schedule the retry; failing the attempt");
            Err(
                JobError::Retry(format!("{reason}; scheduling the retry failed: {e}"))
                    .into_apalis(),
            )
        }
    }
}

/// One attempt of `job`: [`jobs::handle`] bounded by `JOB_TIMEOUT_SECS` (an
/// attempt cut off there is [`JobError::Retry`]), its panic caught and turned
/// into [`JobError::Permanent`] (a dead letter, not a dead worker).
async fn attempt(
    job: &Job,
    key: &str,
    n: u32,
    ctx: &JobContext,
    retrier: &Retrier,
) -> Result<(), JobError> {
    use futures::FutureExt as _;
    let run = async {
        if let (Some(marker), Job::SendEmail(mail)) = (&retrier.test_panic_marker, job) {
            if mail.email.subject.contains(&**marker) {
                panic!("WORKER_TEST_PANIC_MARKER found in the subject");
            }
        }
        jobs::handle(job.clone(), key, n as usize, ctx).await
    };
    match tokio::time::timeout(
        retrier.timeout,
        std::panic::AssertUnwindSafe(run).catch_unwind(),
    )
    .await
    {
        Ok(Ok(res)) => res,
        Ok(Err(panic)) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a non-text panic".into());
            tracing::error!(idempotency_key = %key, kind = job.kind(), attempt = n, panic = %what, "job handler panicked; dead-lettered");
            Err(JobError::Permanent(format!("handler panicked: {what}")))
        }
        Err(_) => {
            let secs = retrier.timeout.as_secs();
            tracing::warn!(idempotency_key = %key, kind = job.kind(), attempt = n, timeout_s = secs, "job attempt timed out");
            Err(JobError::Retry(format!(
                "attempt timed out after {secs} s (JOB_TIMEOUT_SECS)"
            )))
        }
    }
}

/// Runs apalis workers on `q` one after another (a failed one is replaced by
/// a fresh one after a backoff) until `shutdown`; each one's leftovers are
/// returned to the queue when it ends ([`crate::drain`]).
async fn supervise(
    queues: Queues,
    q: QueueName,
    ctx: JobContext,
    retrier: Retrier,
    concurrency: usize,
    drain: Drain,
    shutdown: CancellationToken,
) {
    let mut delay = Duration::from_secs(1);
    while !shutdown.is_cancelled() {
        let name = format!("{}-{}", queues.name(q), ulid::Ulid::new());
        let stop = {
            let t = shutdown.clone();
            async move {
                t.cancelled().await;
                Ok::<(), std::io::Error>(())
            }
        };
        let started = std::time::Instant::now();
        let result = if let Some(storage) = queues.redis_storage(q) {
            let worker = WorkerBuilder::new(name.clone())
                .backend(storage.poll_with_interval(POLL_EVERY))
                .data(ctx.clone())
                .data(retrier.clone())
                .concurrency(concurrency)
                .build(run_job)
                .run_until(stop);
            drain::run_draining(worker, &queues, q, &name, &shutdown, drain).await
        } else if let Some(storage) = queues.sqlite_storage(q) {
            let worker = WorkerBuilder::new(name.clone())
                .backend(storage.poll_with_interval(POLL_EVERY))
                .data(ctx.clone())
                .data(retrier.clone())
                .concurrency(concurrency)
                .build(run_job)
                .run_until(stop);
            drain::run_draining(worker, &queues, q, &name, &shutdown, drain).await
        } else {
            unreachable!("every queue has a storage")
        };
        if result.is_none() {
            tracing::warn!(worker = %name, grace_s = drain.grace.as_secs(), "jobs in flight did not finish within WORKER_SHUTDOWN_TIMEOUT_SECS; abandoning them");
        }
        // The worker is gone (ended, failed or abandoned): whatever it still
        // holds unacknowledged goes back to the queue now.
        match drain::release(&queues, q, &name).await {
            Ok(0) => {}
            Ok(n) => {
                tracing::info!(worker = %name, queue = %q, returned = n, "returned unfinished jobs to the queue")
            }
            Err(e) => {
                tracing::warn!(worker = %name, queue = %q, error = %e, "could not return unfinished jobs; they come back after the missed-heartbeat threshold")
            }
        }
        if shutdown.is_cancelled() {
            break;
        }
        match result {
            Some(Ok(())) | None => {
                tracing::warn!(worker = %name, "worker stopped unexpectedly; restarting")
            }
            Some(Err(e)) => {
                tracing::error!(worker = %name, error = %e, retry_in_s = delay.as_secs(), "worker failed; restarting")
            }
        }
        if started.elapsed() > Duration::from_secs(60) {
            delay = Duration::from_secs(1);
        }
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(delay) => {}
        }
        delay = (delay * 2).min(Duration::from_secs(30));
    }
}

/// The backlog guard: promotes due jobs every [`PROMOTE_EVERY`], in its own
/// task so that a slow vacuum never delays it.
async fn promote(queues: Queues, served: Vec<QueueName>, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(PROMOTE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {
                for q in &served {
                    if let Err(e) = queues.promote_due(*q).await {
                        tracing::warn!(queue = %q, error = %e, "promote failed");
                    }
                }
            }
        }
    }
}

/// Every `VACUUM_INTERVAL_SECS`, one bounded step per queue of the vacuum of
/// finished jobs and of the purge of dead letters older than
/// `DEAD_LETTER_RETENTION_SECS`; each keeps its scan cursor between ticks.
async fn maintain(
    queues: Queues,
    served: Vec<QueueName>,
    settings: Arc<Settings>,
    shutdown: CancellationToken,
) {
    let mut tick = tokio::time::interval(settings.vacuum_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut vacuum_cursor: std::collections::HashMap<QueueName, u64> = Default::default();
    let mut purge_cursor: std::collections::HashMap<QueueName, u64> = Default::default();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {
                for q in &served {
                    let cursor = vacuum_cursor.entry(*q).or_default();
                    match queues.vacuum_step(*q, settings.job_retention, *cursor).await {
                        Ok((next, n)) => {
                            *cursor = next;
                            if n > 0 {
                                tracing::info!(queue = %q, removed = n, "vacuumed finished jobs");
                            }
                        }
                        Err(e) => tracing::warn!(queue = %q, error = %e, "vacuum failed"),
                    }
                    let cursor = purge_cursor.entry(*q).or_default();
                    match queues.purge_dead_letters_step(*q, settings.dead_letter_retention, *cursor).await {
                        Ok((next, n)) => {
                            *cursor = next;
                            if n > 0 {
                                tracing::info!(queue = %q, removed = n, "purged expired dead letters");
                            }
                        }
                        Err(e) => tracing::warn!(queue = %q, error = %e, "dead-letter purge failed"),
                    }
                }
            }
        }
    }
}

/// Installs the tracing subscriber: `LOG_FORMAT` json (default) or pretty,
/// filter from `RUST_LOG` (default `info`).
pub fn init_tracing(settings: &Settings) {
    use tracing_subscriber::{fmt, EnvFilter};
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let _ = match settings.log_format {
        entity::base::settings::LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .try_init(),
        entity::base::settings::LogFormat::Pretty => builder.try_init(),
    };
}

/// Cancels `token` on SIGTERM or SIGINT.
pub fn cancel_on_signal(token: CancellationToken) {
    tokio::spawn(async move {
        let ctrl_c = tokio::signal::ctrl_c();
        #[cfg(unix)]
        {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    .expect("SIGTERM handler");
            tokio::select! {
                _ = ctrl_c => {}
                _ = term.recv() => {}
            }
        }
        #[cfg(not(unix))]
        let _ = ctrl_c.await;
        tracing::info!("shutdown signal received; finishing jobs in flight");
        token.cancel();
    });
}

/// `worker dead-letters [QUEUE] [--limit N]`: one JSON object per line.
/// `worker dead-letters redrive <ID>…|--all [QUEUE]`: puts dead letters back
/// on their queue (see [`Queues::redrive`]); prints one
/// `{"id","queue","new_id"}` line per job.
pub async fn print_dead_letters(settings: &Settings, args: &[String]) -> anyhow::Result<()> {
    if args.first().map(String::as_str) == Some("redrive") {
        return redrive(settings, &args[1..]).await;
    }
    let mut limit = 100usize;
    let mut queues = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--limit" {
            limit = it
                .next()
                .context("--limit needs a number")?
                .parse()
                .context("--limit")?;
        } else {
            queues.push(a.parse::<QueueName>().map_err(|e| anyhow::anyhow!(e))?);
        }
    }
    if queues.is_empty() {
        queues = QueueName::ALL.to_vec();
    }
    let q = Queues::connect(settings).await?;
    for name in queues {
        for dl in q.dead_letters(name, limit).await? {
            println!("{}", serde_json::to_string(&dl)?);
        }
    }
    Ok(())
}

async fn redrive(settings: &Settings, args: &[String]) -> anyhow::Result<()> {
    let mut all = false;
    let mut ids = Vec::new();
    let mut queues = Vec::new();
    for a in args {
        if a == "--all" {
            all = true;
        } else if let Ok(q) = a.parse::<QueueName>() {
            queues.push(q);
        } else if a.starts_with('-') {
            anyhow::bail!(
                "unknown option {a:?}; use `worker dead-letters redrive <ID>…|--all [QUEUE]`"
            );
        } else {
            ids.push(a.clone());
        }
    }
    if all != ids.is_empty() {
        anyhow::bail!("give dead-letter ids or --all (not both): `worker dead-letters redrive <ID>…|--all [QUEUE]`");
    }
    if queues.is_empty() {
        queues = QueueName::ALL.to_vec();
    }
    let q = Queues::connect(settings).await?;
    let mut left: Vec<String> = ids.clone();
    for name in queues {
        let moved = if all {
            q.redrive(name, None).await?
        } else {
            // Only the ids that are dead letters of this queue.
            let mut mine = Vec::new();
            for id in &left {
                if q.dead_letters_contains(name, id).await? {
                    mine.push(id.clone());
                }
            }
            q.redrive(name, Some(&mine)).await?
        };
        for (id, new_id) in moved {
            left.retain(|l| *l != id);
            println!(
                "{}",
                serde_json::json!({"id": id, "queue": q.name(name), "new_id": new_id})
            );
        }
    }
    if !all && !left.is_empty() {
        anyhow::bail!("not dead letters: {}", left.join(", "));
    }
    Ok(())
}
