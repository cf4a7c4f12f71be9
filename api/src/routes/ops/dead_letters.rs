//! The dead-letter queue for admins: `GET /api/admin/dead-letters` lists a
//! queue's dead letters a page at a time, `POST
//! /api/admin/dead-letters/redrive` puts some or all back on their queue.
//! The same queue code as `worker dead-letters` ([`worker::Queues::dead_letters_after`],
//! [`worker::Queues::redrive`]); every redrive writes one `audit_logs` row
//! first. Secrets in payloads (the code and link token of an identity mail,
//! any credential) are redacted in the listing.

use entity::ops::dead_letters::Selection;
use poem::{web::Data, Request};
use poem_openapi::{param::Query, payload::Json, Enum, Object, OpenApi};
use serde_json::Value;
use worker::{queue::DeadLetter, QueueName};

use crate::routes::ApiTags;
use crate::{
    identity::bearer::BearerAuth, middleware::RequestId, pattern::Matching, payload::JsonBody,
    problem::ApiError, state::AppState,
};

/// Default page size of the listing.
pub const DEFAULT_LIMIT: u32 = 20;
/// Largest page size of the listing, and most ids per redrive.
pub const MAX_LIMIT: u32 = 100;

/// What redacted values read as.
pub const REDACTED: &str = "[redacted]";

/// Payload fields never shown: the identity mail's code, link token and
/// link, and any credential a payload could carry.
const SECRET_FIELDS: [&str; 10] = [
    "token",
    "token_hash",
    "confirmation_url",
    "password",
    "secret",
    "api_key",
    "access_token",
    "refresh_token",
    "code",
    "authorization",
];

/// A queue: `email`, `storage`, `settlement` or `ai_usage`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Enum)]
#[oai(rename_all = "snake_case")]
pub enum QueueParam {
    /// Outgoing email (contact messages, identity mails).
    Email,
    /// Avatar cleanup.
    Storage,
    /// Payment settlement and reconciliation.
    Settlement,
    /// AI usage records.
    AiUsage,
}

impl From<QueueParam> for QueueName {
    fn from(q: QueueParam) -> Self {
        match q {
            QueueParam::Email => QueueName::Email,
            QueueParam::Storage => QueueName::Storage,
            QueueParam::Settlement => QueueName::Settlement,
            QueueParam::AiUsage => QueueName::AiUsage,
        }
    }
}

/// One dead letter.
#[derive(Debug, Clone, Object)]
pub struct DeadLetterItem {
    /// The queue's job id (a ULID); what a redrive names.
    pub id: String,
    /// The queue (`email`, …).
    pub queue: String,
    /// The job type (`send_email`, `send_auth_email`, `settle_payment`, …).
    pub job_type: String,
    /// The job's payload, secrets replaced by `[redacted]`.
    pub payload: Value,
    /// Attempts made, as the queue recorded them.
    pub attempts: Option<u64>,
    /// The last error, as the queue recorded it.
    pub last_error: Option<String>,
    /// The key the job keeps on every retry and redrive (the email API's
    /// `Idempotency-Key`).
    pub idempotency_key: Option<String>,
}

/// A page of dead letters.
#[derive(Debug, Clone, Object)]
pub struct DeadLetterPage {
    /// In the order they were queued (ids are ULIDs).
    pub items: Vec<DeadLetterItem>,
    /// Pass as `cursor` for the next page; `null` on the last page.
    #[oai(nullable)]
    pub next_cursor: Option<String>,
}

crate::string_pattern!(
    /// A dead-letter cursor: a job id (a ULID in canonical upper-case
    /// Crockford base32), or empty for the first page.
    pub CursorPattern = r"^(?:[0-7][0-9A-HJKMNP-TV-Z]{25})?$"
);

/// What to redrive: `ids` or `all: true` (exactly one of them). The schema
/// states it as a `oneOf` of `{queue, all: true}` and `{queue, ids}`
/// ([`crate::spec`]); this type reads both and [`redrive_inner`] refuses
/// what neither shape admits.
#[derive(Debug, Clone, Object)]
#[oai(deny_unknown_fields, example)]
pub struct RedriveRequest {
    /// The queue.
    pub queue: QueueParam,
    /// Dead-letter ids of this queue (1–100).
    pub ids: Option<Vec<String>>,
    /// `true`: every dead letter of the queue.
    pub all: Option<bool>,
}

impl poem_openapi::types::Example for RedriveRequest {
    fn example() -> Self {
        RedriveRequest {
            queue: QueueParam::Email,
            ids: Some(vec!["01JD5X9Q6Z8K4M2N7P3R5T1V9W".into()]),
            all: None,
        }
    }
}

/// One job put back.
#[derive(Debug, Clone, Object)]
pub struct Redriven {
    /// The dead letter's id.
    pub id: String,
    /// The job's new id on the queue.
    pub new_id: String,
}

/// The jobs put back on their queue.
#[derive(Debug, Clone, Object)]
pub struct RedriveResult {
    /// One entry per job, with its new id.
    pub redriven: Vec<Redriven>,
}

crate::problem_responses!(
    /// Errors of `GET /api/admin/dead-letters`.
    ListErrorResponse {
        BadRequest = 400: "`queue` is missing or unknown, `limit` is not 1–100, or `cursor` is neither empty nor a job id (`field` names it).",
        Unauthorized = 401: "No valid session token (`missing_token`, `malformed`, `bad_signature`, `expired`, …), a session cookie on a write from another site (`cross_site_cookie`), or a token of the built-in provider whose session has ended: signed out, or ended by a password change (`session_not_found`).",
        Forbidden = 403: "Logged in, but not an admin (`forbidden`).",
        InternalServerError = 500: "The queue could not be read.",
        ServiceUnavailable = 503: "Auth or admin is switched off (`feature_disabled`) or not configured (`not_configured`), the session keys cannot be fetched, or the queue or database is unreachable (`queue_unavailable`, `database_unavailable`).",
    }
);

crate::problem_responses!(
    /// Errors of `POST /api/admin/dead-letters/redrive`.
    RedriveErrorResponse {
        BadRequest = 400: "Neither or both of `ids` and `all`, `all` not `true`, no ids or more than 100, or an unknown `queue` (`field` names it).",
        Unauthorized = 401: "No valid session token (`missing_token`, `malformed`, `bad_signature`, `expired`, …), a session cookie on a write from another site (`cross_site_cookie`), or a token of the built-in provider whose session has ended: signed out, or ended by a password change (`session_not_found`).",
        Forbidden = 403: "Logged in, but not an admin (`forbidden`).",
        NotFound = 404: "An id is not a dead letter of the queue (`unknown_dead_letter`); nothing was redriven.",
        PayloadTooLarge = 413: "The body exceeds 64 KiB.",
        InternalServerError = 500: "The redrive failed.",
        ServiceUnavailable = 503: "Auth or admin is switched off (`feature_disabled`) or not configured (`not_configured`), the session keys cannot be fetched, or the queue or database is unreachable (`queue_unavailable`, `database_unavailable`).",
    }
);

/// The dead-letter queue.
pub struct DeadLetterApi;

#[OpenApi(prefix_path = "/api")]
impl DeadLetterApi {
    /// List dead letters
    ///
    /// Admins only. A queue's dead letters, `limit` (default 20, at most 100)
    /// at a time in the order they were queued; `next_cursor` continues.
    /// Payload secrets (an identity mail's code, link token and link; any
    /// credential) read `[redacted]`.
    #[oai(
        path = "/admin/dead-letters",
        method = "get",
        operation_id = "listDeadLetters",
        tag = "ApiTags::Admin"
    )]
    async fn list(
        &self,
        state: Data<&AppState>,
        auth: BearerAuth,
        /// The queue: `email`, `storage`, `settlement` or `ai_usage`.
        queue: Query<QueueParam>,
        /// `next_cursor` of the previous page; absent or empty: the first
        /// page.
        cursor: Query<Option<Matching<CursorPattern>>>,
        /// Page size, 1–100 (default 20).
        #[oai(validator(minimum(value = "1"), maximum(value = "100")))]
        limit: Query<Option<u32>>,
    ) -> Result<Json<DeadLetterPage>, ListErrorResponse> {
        let limit = limit.0.unwrap_or(DEFAULT_LIMIT);
        let cursor = cursor
            .0
            .map(Matching::into_string)
            .filter(|c| !c.is_empty());
        Ok(Json(
            list_inner(&state, &auth, queue.0.into(), cursor, limit).await?,
        ))
    }

    /// Redrive dead letters
    ///
    /// Admins only. Puts the named dead letters (`ids`), or all of the
    /// queue's (`all: true`), back on their queue with a fresh retry budget
    /// and their original idempotency key, as `worker dead-letters redrive`
    /// does. One `audit_logs` row (`dead_letter.redrive`) is written first.
    /// An id that is not a dead letter of the queue fails the whole request
    /// before anything moves.
    #[oai(
        path = "/admin/dead-letters/redrive",
        method = "post",
        operation_id = "redriveDeadLetters",
        tag = "ApiTags::Admin"
    )]
    async fn redrive(
        &self,
        state: Data<&AppState>,
        req: &Request,
        auth: BearerAuth,
        body: JsonBody<RedriveRequest>,
    ) -> Result<Json<RedriveResult>, RedriveErrorResponse> {
        Ok(Json(
            redrive_inner(&state, &auth, body.0, RequestId::of(req)).await?,
        ))
    }
}

async fn admin(
    state: &AppState,
    auth: &BearerAuth,
) -> Result<entity::accounts::users::UserContext, ApiError> {
    state.admin_session(auth).await
}

fn queue_error(e: worker::queue::QueueError) -> ApiError {
    tracing::error!(error = %e, "dead-letter queue");
    ApiError::Unavailable {
        code: "queue_unavailable",
        detail: "the queue is unreachable; try again shortly".into(),
    }
}

async fn list_inner(
    state: &AppState,
    auth: &BearerAuth,
    queue: QueueName,
    cursor: Option<String>,
    limit: u32,
) -> Result<DeadLetterPage, ApiError> {
    admin(state, auth).await?;
    let limit = limit.clamp(1, MAX_LIMIT) as usize;
    let mut page = state
        .bounded(
            state
                .queues
                .dead_letters_after(queue, cursor.as_deref(), limit + 1),
        )
        .await?
        .map_err(queue_error)?;
    let next_cursor = (page.len() > limit).then(|| {
        page.truncate(limit);
        page.last().map(|d| d.id.clone())
    });
    Ok(DeadLetterPage {
        items: page.into_iter().map(|d| item(queue, d)).collect(),
        next_cursor: next_cursor.flatten(),
    })
}

fn item(queue: QueueName, d: DeadLetter) -> DeadLetterItem {
    let mut payload = d.job;
    if let Some(o) = payload.as_object_mut() {
        o.remove("retry");
    }
    let job_type = payload["type"].as_str().unwrap_or("unknown").to_string();
    redact(&mut payload);
    DeadLetterItem {
        id: d.id,
        queue: queue.as_str().to_string(),
        job_type,
        payload,
        attempts: d.attempts,
        last_error: d.last_error,
        idempotency_key: d.idempotency_key,
    }
}

/// Replaces the value of every [`SECRET_FIELDS`] key (at any depth) by
/// [`REDACTED`].
pub fn redact(v: &mut Value) {
    match v {
        Value::Object(o) => {
            for (k, v) in o.iter_mut() {
                if SECRET_FIELDS.contains(&k.to_ascii_lowercase().as_str()) {
                    *v = Value::String(REDACTED.into());
                } else {
                    redact(v);
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(redact),
        _ => {}
    }
}

async fn redrive_inner(
    state: &AppState,
    auth: &BearerAuth,
    body: RedriveRequest,
    (request_id, client_request_id): (Option<String>, Option<String>),
) -> Result<RedriveResult, ApiError> {
    use entity::base::validate::FieldError;
    let selection = match (body.ids, body.all) {
        (Some(_), Some(_)) => {
            return Err(FieldError::new(
                "all",
                "conflict",
                "give `ids` or `all: true`, not both".to_string(),
            )
            .into())
        }
        (None, Some(false)) => {
            return Err(FieldError::new(
                "all",
                "invalid_value",
                "all must be `true` (or give `ids`)".to_string(),
            )
            .into())
        }
        (None, Some(true)) => Selection::All,
        (Some(ids), None) if ids.is_empty() => {
            return Err(FieldError::new("ids", "required", "ids is empty".to_string()).into())
        }
        (Some(ids), None) if ids.len() > MAX_LIMIT as usize => {
            return Err(FieldError::new(
                "ids",
                "too_many",
                format!("at most {MAX_LIMIT} ids per redrive"),
            )
            .into())
        }
        (Some(ids), None) => Selection::Ids(ids),
        (None, None) => {
            return Err(
                FieldError::new("ids", "required", "give `ids` or `all: true`".to_string()).into(),
            )
        }
    };
    let actor = admin(state, auth).await?;
    let queue = QueueName::from(body.queue);
    if let Selection::Ids(ids) = &selection {
        let mut unknown = Vec::new();
        for id in ids {
            let known = state
                .bounded(state.queues.dead_letters_contains(queue, id))
                .await?
                .map_err(queue_error)?;
            if !known {
                unknown.push(id.as_str());
            }
        }
        if !unknown.is_empty() {
            return Err(ApiError::NotFound(
                "unknown_dead_letter",
                format!(
                    "not dead letters of queue {}: {}",
                    queue.as_str(),
                    unknown.join(", ")
                ),
            ));
        }
    }
    state
        .bounded_db(
            "recording the redrive",
            entity::ops::dead_letters::record_redrive(
                &state.db,
                &actor,
                queue.as_str(),
                &selection,
                request_id,
                client_request_id,
            ),
        )
        .await?;
    let ids = match &selection {
        Selection::Ids(ids) => Some(ids.as_slice()),
        Selection::All => None,
    };
    let moved = state
        .queues
        .redrive(queue, ids)
        .await
        .map_err(|e| match e {
            worker::queue::QueueError::NotFound { id, .. } => ApiError::NotFound(
                "unknown_dead_letter",
                format!("{id} is no longer a dead letter (redriven or purged meanwhile)"),
            ),
            e => queue_error(e),
        })?;
    tracing::info!(actor = %actor.user_id, queue = queue.as_str(), count = moved.len(), "dead letters redriven");
    Ok(RedriveResult {
        redriven: moved
            .into_iter()
            .map(|(id, new_id)| Redriven { id, new_id })
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_identity_mail_secrets_at_any_depth() {
        let mut v = serde_json::json!({
            "type": "send_auth_email", "to": "a@example.org", "token": "123456",
            "token_hash": "pkce_abc", "confirmation_url": "https://x/verify?token=pkce_abc",
            "nested": [{"Password": "hunter2", "ok": 1}],
        });
        redact(&mut v);
        assert_eq!(v["token"], REDACTED);
        assert_eq!(v["token_hash"], REDACTED);
        assert_eq!(v["confirmation_url"], REDACTED);
        assert_eq!(v["nested"][0]["Password"], REDACTED);
        assert_eq!(v["nested"][0]["ok"], 1);
        assert_eq!(v["to"], "a@example.org");
        assert!(!v.to_string().contains("123456"));
        assert!(!v.to_string().contains("pkce_abc"));
    }
}
