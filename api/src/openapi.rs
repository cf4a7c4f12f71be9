//! The combined OpenAPI types: every API object of every domain in one set
//! ([`Apis`], grouped by domain), the service's description, and
//! [`MergePaths`], which lists a path served by two objects once.

use poem_openapi::{OpenApi, OpenApiService};

use crate::{
    identity::{confirm::ConfirmApi, oauth::AuthOAuthApi, routes::AuthApi},
    routes::{
        accounts::{
            admin::AdminApi, avatar::AvatarApi, me::MeApi, profile::ProfileApi,
            storage::StorageApi, users::AdminReadApi,
        },
        ai::AiApi,
        billing::{
            operator::OperatorApi, pay::PayApi, payments::PaymentApi, plans::PlansApi,
            reads::PaymentReadApi, subscription::SubscriptionApi, webhooks::WebhookApi,
        },
        forms::{contact::ContactApi, waitlist::WaitlistApi},
        ops::{dead_letters::DeadLetterApi, health::HealthApi},
    },
};

/// Declares the API set once: the `Apis` type and the value that builds it.
macro_rules! api_set {
    ($($api:tt),+ $(,)?) => {
        /// Every API operation (a path served by two API objects listed once).
        pub type Apis = MergePaths<($($api,)+)>;

        fn apis() -> Apis {
            MergePaths(($($api,)+))
        }
    };
}

api_set!(
    // identity
    (AuthApi, AuthOAuthApi, ConfirmApi),
    // accounts
    (
        MeApi,
        ProfileApi,
        AvatarApi,
        StorageApi,
        AdminApi,
        AdminReadApi
    ),
    // billing
    (
        PlansApi,
        PaymentApi,
        PaymentReadApi,
        PayApi,
        SubscriptionApi,
        OperatorApi,
        WebhookApi
    ),
    // ai
    AiApi,
    // forms
    (ContactApi, WaitlistApi),
    // ops
    (HealthApi, DeadLetterApi),
);

const DESCRIPTION: &str = "\
JSON API of the subscription backend. Every error is RFC 9457 problem details \
(`application/problem+json`) with a stable `code`, an `error` string equal to `detail`, \
and `field` naming the request field at fault. Every answer carries `x-request-id`: \
the server's own id of the request (a client's `x-request-id` is logged and audited beside it, \
never in its place). Request bodies under `/api` above 64 KiB \
get 413. Logged-in routes take `Authorization: Bearer <session JWT>`. Avatars: \
`POST /api/profile/avatar` grants a signed upload, the file goes to \
`PUT /storage/v1/object/upload/sign/avatars/{user_id}/avatar?token=…` (at most 2 MiB, \
JPEG, PNG, WebP or GIF) and is served by `GET /storage/v1/object/public/avatars/{user_id}/avatar`. \
Unknown JSON fields are rejected (400 `unknown_field`), except in the payment providers' \
notifications (`/api/webhooks/*`), which take extra fields and no session: they are verified by \
the provider's signature over the body as sent, and in the AI chat body (`/api/ai/chat`), which \
is what the AI SDK's `DefaultChatTransport` sends. A JSON body without \
`Content-Type: application/json` gets 415; a body that does not arrive within \
`HTTP_BODY_TIMEOUT_SECS`, or arrives slower than `HTTP_BODY_MIN_RATE` bytes per second \
once `HTTP_BODY_RATE_GRACE_SECS` have passed, gets 408 `body_timeout`; a method a path does not serve gets 405 \
with `Allow`. Rate-limited routes answer with \
`X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset` (Unix epoch seconds), \
and `Retry-After` (seconds) on 429. The limit is per client IP: the socket peer, or, behind \
`TRUST_PROXY_HOPS=N` proxies, the Nth `X-Forwarded-For` address from the right; IPv6 \
clients count per /64. It is shared across api processes in Redis; while Redis does not \
answer, each process limits on its own. A feature switched \
off by its `NEXT_PUBLIC_ENABLE_*` toggle, or lacking configuration, answers 503 \
(`feature_disabled` / `not_configured`), as `GET /api/health` reports. \
Overload is shed, not queued: past `HTTP_MAX_IN_FLIGHT` requests being handled by one server \
process (counted once a request's body is in memory), or past `HTTP_BODY_BUDGET_BYTES` of \
request bodies arriving at once, a request is answered at once with 503 `overloaded` and \
`Retry-After` (seconds); \
the health checks are never shed, and AI chats and generations are bounded by \
`AI_MAX_OPEN_STREAMS` open at once instead. An avatar upload counts toward \
`HTTP_MAX_IN_FLIGHT` only while its grant is checked; while its body arrives it counts in a \
pool of its own (`HTTP_MAX_UPLOADS` per server, `HTTP_MAX_UPLOADS_PER_USER` per user) and must \
average `UPLOAD_MIN_RATE` bytes per second. Pages on the origins listed in \
`CORS_ALLOWED_ORIGINS` may call `/api` (but the webhooks), `/auth/v1` and `/storage/v1` \
with `Authorization: Bearer` (CORS; any other origin gets no CORS headers). Lists answer \
`{items, next_cursor}` newest first (`limit` 1–100, default 20; `next_cursor` null on the \
last page; an empty `cursor` is the first page, one that does not match its `pattern` is 400 \
naming `cursor`); personal reads answer \
`Cache-Control: private, no-store`. New fields are snake_case. Prometheus metrics are served at `GET /metrics` (text format, \
`Authorization: Bearer $METRICS_TOKEN`; 404 while `METRICS_TOKEN` is unset).";

/// The OpenAPI service as poem-openapi builds it; [`crate::spec::document`]
/// is the document served and printed by `api openapi`.
pub fn openapi() -> OpenApiService<Apis, ()> {
    OpenApiService::new(
        apis(),
        "Subscription backend API",
        env!("CARGO_PKG_VERSION"),
    )
    .description(DESCRIPTION)
}

/// A set of APIs whose document lists each path once: poem-openapi writes
/// one `paths` entry per API object, so a path served by two objects
/// (`POST /api/payments` and `GET /api/payments`) would keep only the last
/// one's operations. The routes themselves are merged by poem-openapi.
pub struct MergePaths<T>(pub T);

impl<T: OpenApi> OpenApi for MergePaths<T> {
    fn meta() -> Vec<poem_openapi::registry::MetaApi> {
        let mut metas = T::meta();
        let mut first: std::collections::HashMap<String, (usize, usize)> = Default::default();
        let mut moved = Vec::new();
        for (a, api) in metas.iter_mut().enumerate() {
            let mut kept = Vec::new();
            for path in std::mem::take(&mut api.paths) {
                match first.get(&path.path) {
                    Some(&at) => moved.push((at, path.operations)),
                    None => {
                        first.insert(path.path.clone(), (a, kept.len()));
                        kept.push(path);
                    }
                }
            }
            api.paths = kept;
        }
        for ((a, p), operations) in moved {
            metas[a].paths[p].operations.extend(operations);
        }
        metas
    }

    fn register(registry: &mut poem_openapi::registry::Registry) {
        T::register(registry);
    }

    fn add_routes(
        self,
        route_table: &mut std::collections::HashMap<
            String,
            std::collections::HashMap<poem::http::Method, poem::endpoint::BoxEndpoint<'static>>,
        >,
    ) {
        self.0.add_routes(route_table);
    }
}
