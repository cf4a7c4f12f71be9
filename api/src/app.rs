//! Route table, middleware and the server lifecycle.

use std::{sync::Arc, time::Duration};

use anyhow::Context as _;
use entity::{base::plans::Catalogue, Features, Settings};
use poem::{EndpointExt, IntoEndpoint, Route};
use poem_openapi::OpenApiService;
use tokio_util::sync::CancellationToken;

use crate::{
    middleware::{BodyDeadline, BodyLimit, CatchPanics, DrainBody, Observe, Provide},
    openapi::{openapi, Apis},
    rate_limit::RateLimiter,
    state::AppState,
};

/// Largest request body accepted on JSON routes, in bytes (64 KiB).
pub const BODY_LIMIT: usize = 64 * 1024;

/// An API reference page (`build`: Scalar's or Swagger UI's HTML) showing the
/// served document ([`crate::spec::document`], which poem-openapi's own pages
/// would not: they embed its unpatched spec). Built at its first view (the
/// pages embed 1.6–3.2 MB of JavaScript each, so a process whose pages are
/// never opened does not hold them) and then shared: every answer is a
/// clone of the same [`bytes::Bytes`], so a reader that stalls (an HTTP/2
/// stream behind a shut flow-control window) holds a reference, not a copy,
/// and a view costs no build.
fn reference_page(
    build: fn(&OpenApiService<Apis, ()>) -> String,
    document: Arc<str>,
) -> impl poem::Endpoint<Output = poem::Response> {
    let page = Arc::new(std::sync::OnceLock::<bytes::Bytes>::new());
    Route::new().at(
        "/",
        poem::endpoint::make_sync(move |_| {
            let html = page.get_or_init(|| {
                let service = openapi();
                build(&service)
                    .replacen(&service.spec(), &document, 1)
                    .into()
            });
            poem::Response::builder()
                .content_type("text/html; charset=utf-8")
                .body(html.clone())
        }),
    )
}

/// The whole HTTP application: `/api/*` (JSON routes), `/storage/v1/*` (avatar
/// uploads and files), `/api/openapi.json`, `/api/docs`, `/api/swagger`.
pub fn app(state: AppState) -> impl poem::Endpoint<Output = poem::Response> {
    let service = openapi();
    // The served document follows the catalogue in force (`PLANS_FILE`).
    let document: Arc<str> = crate::spec::document_for(&state.plans).into();
    let served = bytes::Bytes::from(document.as_bytes().to_vec());
    let spec = poem::endpoint::make_sync(move |_| {
        poem::Response::builder()
            .content_type("application/json")
            .body(served.clone())
    });
    let allowed = Arc::new(crate::spec::AllowedMethods::from_document(
        &serde_json::from_str(&document).expect("the document is JSON"),
    ));
    let docs = reference_page(|s| s.scalar_html(), document.clone());
    let swagger = reference_page(|s| s.swagger_ui_html(), document);
    let endpoint = Arc::new(service.into_endpoint());
    let cors = crate::cors::CorsLayer::new(&state.settings.cors_allowed_origins);
    let load = crate::shed::Load::from_settings(&state.settings);
    // The shedding gate stands behind the body buffer (`BodyLimit`): a slot
    // is taken once the body is in memory, so clients sending theirs slowly
    // hold none (crate::shed).
    let shed = || crate::shed::Shed(load.clone());
    let max_upload =
        entity::accounts::avatar::MAX_BYTES + crate::routes::accounts::storage::MULTIPART_OVERHEAD;
    let limit = || BodyLimit {
        max: BODY_LIMIT,
        load: load.clone(),
    };
    Route::new()
        // One service, two mounts: JSON routes under /api with the body
        // limit, the storage routes (uploads stream and bound their own size)
        // under /storage.
        .nest_no_strip("/api", endpoint.clone().with(shed()).with(limit()))
        // The identity provider (`/auth/v1`) and `/auth/confirm`: same service,
        // same body limit, the platform's error formats.
        .nest_no_strip(
            "/auth",
            endpoint
                .clone()
                .with(shed())
                .with(limit())
                .with(crate::identity::AuthVersion),
        )
        // An upload streams through its route: it holds an in-flight slot
        // while the route checks its grant, then counts in the upload pool
        // while its body arrives (crate::shed::UploadAdmission); a refused
        // one has its rest drained (at most a second of it).
        .nest_no_strip(
            "/storage",
            endpoint.with(shed()).with(DrainBody {
                max_bytes: max_upload,
                max_time: Duration::from_secs(1),
            }),
        )
        .at("/api/openapi.json", spec.with(shed()))
        .at("/metrics", crate::metrics::endpoint(load.clone()))
        .nest("/api/docs", docs.with(shed()))
        .nest("/api/swagger", swagger.with(shed()))
        .with(BodyDeadline::from_settings(&state.settings, max_upload))
        .with(Provide(state))
        .with(crate::spec::AllowHeader(allowed))
        .with(CatchPanics)
        // Outermost but for the request id and the metrics: a preflight
        // costs nothing and is never shed, and a shed 503 carries the CORS
        // headers a page needs to read its `Retry-After`.
        .with(cors)
        .with(crate::metrics::HttpMetrics)
        .with(Observe)
}

/// Builds the state: database (migrated when `MIGRATE_ON_START`), queue
/// producer, rate limiter, plans, features.
pub async fn build_state(
    settings: Arc<Settings>,
    shutdown: &CancellationToken,
) -> anyhow::Result<AppState> {
    let plans =
        Catalogue::load_or_built_in(settings.plans_file.as_deref()).context("PLANS_FILE")?;
    let features = Features::compute(&settings);
    if settings.migrate_on_start {
        // Under the migration lock: replicas starting together all come up.
        // On a pool of its own, bounded for startup rather than for requests.
        let startup = worker::runtime::connect_db_for_startup(&settings, shutdown).await?;
        let applied = migration::up_locked(&startup, None).await;
        let _ = startup.close().await;
        applied.context("applying migrations")?;
    }
    let db = worker::runtime::connect_db(&settings, shutdown).await?;
    match entity::base::db::clock_offset(&db).await {
        Ok(offset) if !offset.is_zero() => tracing::warn!(
            offset_us = offset.num_microseconds(),
            "the application's clock is moved (table app_clock): a test database?"
        ),
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "could not read the application's clock offset"),
    }
    let queues = worker::runtime::connect_queues(&settings, shutdown).await?;
    let storage = worker::storage::Storage::open(&settings.storage_url)?;
    let limiter = RateLimiter::new(queues.redis(), &settings.queue_prefix);
    let providers =
        worker::providers::Providers::new(settings.clone()).context("payment provider client")?;
    let settings_for_ai = settings.clone();
    let oauth =
        worker::oauth::OAuthClients::new(&settings.oauth).context("OAuth provider client")?;
    let accounts = crate::identity::account_cache::AccountCache::start(&db, shutdown);
    let idp = if settings.auth_provider == entity::base::settings::AuthProvider::Builtin
        && settings.toggles.auth
    {
        Some(Arc::new(
            crate::identity::Idp::new(
                settings.clone(),
                db.clone(),
                queues.clone(),
                accounts.clone(),
            )
            .context("the built-in identity provider")?,
        ))
    } else {
        None
    };
    Ok(AppState::new(crate::state::Shared {
        accounts,
        idp,
        oauth,
        providers,
        sessions: crate::identity::session::SessionVerifier::from_settings(&settings),
        settings,
        features: Arc::new(features),
        plans: Arc::new(plans),
        db,
        queues,
        limiter,
        probes: Default::default(),
        storage,
        ai: worker::ai::AiClients::new(settings_for_ai)?,
    }))
}

/// Serves HTTP until SIGTERM/SIGINT; with `with_worker` also runs the worker
/// loop in this process. On shutdown, stops accepting, lets requests in flight
/// finish (up to 10 s), and lets jobs in flight finish.
pub async fn serve(settings: Arc<Settings>, with_worker: bool) -> anyhow::Result<()> {
    let shutdown = CancellationToken::new();
    worker::runtime::cancel_on_signal(shutdown.clone());
    crate::metrics::install(&settings)?;
    let state = build_state(settings.clone(), &shutdown).await?;
    for (feature, status) in state.features.iter() {
        tracing::info!(feature = feature.key(), enabled = status.enabled, message = %status.message, "feature");
    }

    if state.sessions.jwks_url().is_some() {
        // Fetch the auth platform's keys now, so the first RS256/ES256 request does not wait.
        let sessions = state.sessions.clone();
        tokio::spawn(async move {
            if let Err(e) = sessions.refresh_keys().await {
                tracing::warn!(error = %e, "could not fetch the JWKS yet; will retry on demand");
            }
        });
    }

    let worker_task = with_worker.then(|| {
        let (s, t) = (settings.clone(), shutdown.clone());
        tokio::spawn(async move { worker::runtime::run(s, t).await })
    });

    let listener = worker::server::bind(&settings.host, settings.port)
        .await
        .with_context(|| format!("cannot listen on {}:{}", settings.host, settings.port))?;
    let addr = listener.local_addr().context("no local address")?;
    tracing::info!(%addr, with_worker, queue = state.queues.kind(), "api listening");
    // A plain line on stdout for scripts and tests that start the server on port 0.
    println!("api listening on http://{addr}");

    worker::server::run(
        listener,
        app(state),
        worker::server::Limits::from_settings(&settings),
        shutdown.clone(),
        Duration::from_secs(10),
    )
    .await?;
    shutdown.cancel();
    if let Some(t) = worker_task {
        t.await.context("worker task")??;
    }
    tracing::info!("api stopped");
    Ok(())
}
