//! `POST /api/contact`: validate, rate limit, queue the email.

use std::time::{Duration, Instant};

use entity::{forms::contact::ContactMessage, Feature};
use poem::{web::Data, Request};
use poem_openapi::{Object, OpenApi};
use worker::{jobs::SendEmail, Job};

use crate::routes::{ApiTags, Success};
use crate::{
    middleware::RequestId,
    pattern::Matching,
    payload::{JsonBody, Mailbox},
    problem::{ApiError, RateInfo},
    state::AppState,
};

crate::string_pattern!(
    /// "Not only whitespace" (see [`ContactRequest`]), no NUL.
    pub NotBlank = r"^[^\u0000]*[^\t\n\v\f\r \u0000\u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000][^\u0000]*$"
);

/// A contact-form message. "Not only whitespace" is the pattern "a character
/// outside Unicode `White_Space`", spelled out so that JSON Schema (ECMAScript
/// `\s` lacks U+0085 and has U+FEFF), the server's regex and its trimming agree;
/// no text field may hold U+0000 (NUL).
#[derive(Debug, Clone, Object)]
#[oai(deny_unknown_fields, example)]
pub struct ContactRequest {
    /// Sender's name, 1–100 characters, not only whitespace (trimmed), no NUL.
    #[oai(validator(min_length = 1, max_length = 100))]
    pub name: Matching<NotBlank>,
    /// Sender's email address (≤ 254 characters); replies go there.
    #[oai(validator(max_length = 254))]
    pub email: Mailbox,
    /// The message, 1–5,000 characters, not only whitespace (trimmed), no NUL.
    #[oai(validator(min_length = 1, max_length = 5000))]
    pub message: Matching<NotBlank>,
}

impl poem_openapi::types::Example for ContactRequest {
    fn example() -> Self {
        ContactRequest {
            name: Matching::new("Ann Lee").expect("the example matches"),
            email: Mailbox("ann@example.com".into()),
            message: Matching::new("Do you offer annual billing?").expect("the example matches"),
        }
    }
}

crate::limited_ok!(
    /// Answers of `POST /api/contact`.
    ContactResponse, Success, "The message is queued for delivery: `{ \"success\": true }`."
);

crate::problem_responses!(
    /// Errors of `POST /api/contact`.
    ContactError {
        BadRequest = 400: "A field is missing or invalid (`field` names it), or the body is not the expected JSON.",
        PayloadTooLarge = 413: "The body exceeds 64 KiB.",
        InternalServerError = 500: "The message could not be queued.",
        ServiceUnavailable = 503: "Contact is switched off (`feature_disabled`), not configured (`not_configured`: no email transport or sender), or the queue is unreachable (`queue_unavailable`).",
    }
);

/// Contact form.
pub struct ContactApi;

#[OpenApi(prefix_path = "/api")]
impl ContactApi {
    /// Send a contact message
    ///
    /// Validates the message, then queues an email to the site's inbox
    /// (`CONTACT_EMAIL`, else `EMAIL_FROM`) with `Reply-To` set to the sender.
    /// The answer comes as soon as the email job is queued; the worker sends
    /// it (retrying transient failures). Limited to `RATE_LIMIT_PUBLIC_PER_HOUR`
    /// (default 5) requests per hour per client IP.
    #[oai(
        path = "/contact",
        method = "post",
        operation_id = "sendContactMessage",
        tag = "ApiTags::Public"
    )]
    async fn contact(
        &self,
        state: Data<&AppState>,
        req: &Request,
        body: JsonBody<ContactRequest>,
    ) -> Result<ContactResponse, ContactError> {
        let ip = state.client_ip(req);
        let request_id = req.extensions().get::<RequestId>().map(|r| r.0.clone());
        ContactResponse::from_result(contact_inner(&state, &ip, request_id, body.0).await)
    }
}

async fn contact_inner(
    state: &AppState,
    ip: &str,
    request_id: Option<String>,
    body: ContactRequest,
) -> Result<(Success, RateInfo), ApiError> {
    state.require(Feature::Contact)?;
    // One time budget for the whole request: the limiter and the push share it,
    // so an unreachable Redis costs at most DEPENDENCY_TIMEOUT_MS.
    let deadline = Instant::now() + state.settings.dependency_timeout;
    let rate = state.limit_public("contact", ip, deadline).await?;
    let message = ContactMessage::new(&body.name, &body.email.0, &body.message)?;
    let (Some(from), Some(inbox)) = (
        state.settings.email_from.as_deref(),
        state.settings.contact_inbox(),
    ) else {
        return Err(ApiError::internal("contact ready without EMAIL_FROM"));
    };
    let job = Job::SendEmail(SendEmail {
        email: message.to_email(from, inbox),
        request_id,
    });
    let budget = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(50));
    match state.queues.push_within(job, budget).await {
        Ok(job_id) => {
            tracing::info!(job_id, "contact message queued");
            Ok((Success::yes(), rate))
        }
        Err(e) => {
            tracing::error!(error = %e, "could not queue contact email");
            Err(ApiError::Unavailable {
                code: "queue_unavailable",
                detail: "the message could not be queued; try again shortly".into(),
            })
        }
    }
}
