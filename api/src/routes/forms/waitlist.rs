//! `POST /api/waitlist`: store a lead once per email.

use entity::{
    forms::waitlist::{self, Lead, WaitlistError},
    Feature,
};
use poem::{web::Data, Request};
use poem_openapi::{Object, OpenApi};

use crate::routes::{ApiTags, Success};
use crate::{
    pattern::{Matching, NoNul},
    payload::{JsonBody, Mailbox},
    problem::{ApiError, RateInfo},
    state::AppState,
};

/// A waitlist sign-up.
#[derive(Debug, Clone, Object)]
#[oai(deny_unknown_fields, example)]
pub struct WaitlistRequest {
    /// Email address (≤ 254 characters). Stored trimmed and lowercased; the
    /// same address in another case is a duplicate.
    #[oai(validator(max_length = 254))]
    pub email: Mailbox,
    /// Name, up to 100 characters, no NUL; optional.
    #[oai(validator(max_length = 100))]
    pub name: Option<Matching<NoNul>>,
}

impl poem_openapi::types::Example for WaitlistRequest {
    fn example() -> Self {
        WaitlistRequest {
            email: Mailbox("ann@example.com".into()),
            name: Matching::new("Ann Lee"),
        }
    }
}

crate::limited_ok!(
    /// Answers of `POST /api/waitlist`.
    WaitlistResponse, Success, "The lead is stored: `{ \"success\": true }`."
);

crate::problem_responses!(
    /// Errors of `POST /api/waitlist`.
    WaitlistErrorResponse {
        BadRequest = 400: "The email is missing or invalid (`field` = `email`), the name is too long, or the body is not the expected JSON.",
        Conflict = 409: "This email is already on the waitlist (`already_registered`).",
        PayloadTooLarge = 413: "The body exceeds 64 KiB.",
        InternalServerError = 500: "The lead could not be stored.",
        ServiceUnavailable = 503: "The waitlist is switched off (`feature_disabled`) or the database is unreachable (`database_unavailable`).",
    }
);

/// Waitlist.
pub struct WaitlistApi;

#[OpenApi(prefix_path = "/api")]
impl WaitlistApi {
    /// Join the waitlist
    ///
    /// Stores the lead in the `waitlist` table. Emails are unique
    /// case-insensitively: a second sign-up answers 409. Limited to
    /// `RATE_LIMIT_PUBLIC_PER_HOUR` (default 5) requests per hour per client IP.
    #[oai(
        path = "/waitlist",
        method = "post",
        operation_id = "joinWaitlist",
        tag = "ApiTags::Public"
    )]
    async fn waitlist(
        &self,
        state: Data<&AppState>,
        req: &Request,
        body: JsonBody<WaitlistRequest>,
    ) -> Result<WaitlistResponse, WaitlistErrorResponse> {
        let ip = state.client_ip(req);
        WaitlistResponse::from_result(waitlist_inner(&state, &ip, body.0).await)
    }
}

async fn waitlist_inner(
    state: &AppState,
    ip: &str,
    body: WaitlistRequest,
) -> Result<(Success, RateInfo), ApiError> {
    state.require(Feature::Waitlist)?;
    let deadline = std::time::Instant::now() + state.settings.dependency_timeout;
    let rate = state.limit_public("waitlist", ip, deadline).await?;
    let lead = Lead::new(&body.email.0, body.name.as_deref())?;
    match state.bounded(waitlist::join(&state.db, lead)).await? {
        Ok(()) => Ok((Success::yes(), rate)),
        Err(WaitlistError::AlreadyRegistered) => Err(ApiError::Conflict(
            "already_registered",
            "this email is already on the waitlist".into(),
        )),
        Err(WaitlistError::Invalid(f)) => Err(f.into()),
        Err(WaitlistError::Db(e)) => Err(crate::routes::db_error("storing the lead", e)),
    }
}
