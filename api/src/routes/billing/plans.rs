//! `GET /api/plans`: the public price list, with an `ETag`.

use poem::web::Data;
use poem_openapi::{param::Header, payload::Json, types::Example, ApiResponse, Object, OpenApi};
use sha2::{Digest as _, Sha256};

use crate::{routes::ApiTags, state::AppState};

/// `Cache-Control` of the public price list (revalidate with `If-None-Match`).
pub const PLANS_CACHE: &str = "public, max-age=60";

/// One plan of the catalogue.
#[derive(Debug, Clone, Object, serde::Serialize)]
pub struct PlanItem {
    /// Plan id (`FREE`, `BASIC`, `PRO`, `ULTIMATE`).
    pub id: String,
    /// Display name.
    pub name: String,
    /// Monthly price in whole units of `currency`; 0 for FREE.
    pub price: i64,
    /// Whether `POST /api/payments` sells it (FREE is not sold).
    pub purchasable: bool,
    /// AI requests allowed per 5-minute window.
    pub ai_requests_per_5min: u32,
    /// AI tokens (input + output) per calendar month (UTC); `null` = unlimited.
    #[oai(nullable)]
    pub ai_tokens_per_month: Option<u64>,
}

/// The price list.
#[derive(Debug, Clone, Object, serde::Serialize)]
#[oai(example)]
pub struct PlanList {
    /// ISO 4217 currency of every price (`IDR`).
    pub currency: String,
    /// Every plan, FREE first, in catalogue order.
    pub plans: Vec<PlanItem>,
}

impl Example for PlanList {
    fn example() -> Self {
        PlanList {
            currency: "IDR".into(),
            plans: vec![
                PlanItem {
                    id: "FREE".into(),
                    name: "Free".into(),
                    price: 0,
                    purchasable: false,
                    ai_requests_per_5min: 5,
                    ai_tokens_per_month: Some(20_000),
                },
                PlanItem {
                    id: "PRO".into(),
                    name: "Pro".into(),
                    price: 99_000,
                    purchasable: true,
                    ai_requests_per_5min: 60,
                    ai_tokens_per_month: Some(1_000_000),
                },
            ],
        }
    }
}

/// Answers of `GET /api/plans`.
#[derive(Debug, ApiResponse)]
pub enum PlansResponse {
    /// The price list.
    #[oai(status = 200)]
    Ok(
        Json<PlanList>,
        /// Entity tag of this list; send it back in `If-None-Match`.
        #[oai(header = "ETag")]
        String,
        /// `public, max-age=60`.
        #[oai(header = "Cache-Control")]
        String,
    ),
    /// `If-None-Match` named the current `ETag`: nothing changed.
    #[oai(status = 304)]
    NotModified(
        /// The current entity tag.
        #[oai(header = "ETag")]
        String,
        /// `public, max-age=60`.
        #[oai(header = "Cache-Control")]
        String,
    ),
}

/// The price list.
pub struct PlansApi;

#[OpenApi(prefix_path = "/api")]
impl PlansApi {
    /// The price list
    ///
    /// Public. The plan catalogue for a pricing page, with an `ETag`; a
    /// request with `If-None-Match` naming it gets 304 without a body.
    #[oai(
        path = "/plans",
        method = "get",
        operation_id = "listPlans",
        tag = "ApiTags::Public"
    )]
    async fn plans(
        &self,
        state: Data<&AppState>,
        /// An `ETag` of an earlier answer (or several, comma-separated).
        #[oai(name = "If-None-Match")]
        if_none_match: Header<Option<String>>,
    ) -> PlansResponse {
        let (list, etag) = plan_list(&state);
        if if_none_match
            .0
            .as_deref()
            .is_some_and(|h| etag_matches(h, &etag))
        {
            PlansResponse::NotModified(etag, PLANS_CACHE.into())
        } else {
            PlansResponse::Ok(Json(list), etag, PLANS_CACHE.into())
        }
    }
}

/// The price list and its entity tag (a hash of its JSON).
fn plan_list(state: &AppState) -> (PlanList, String) {
    let list = PlanList {
        currency: state.plans.currency.clone(),
        plans: state
            .plans
            .plans
            .iter()
            .map(|p| PlanItem {
                id: p.id.clone(),
                name: p.name.clone(),
                price: p.price,
                purchasable: p.purchasable,
                ai_requests_per_5min: p.ai_requests_per_5min,
                ai_tokens_per_month: p.ai_tokens_per_month,
            })
            .collect(),
    };
    let json = serde_json::to_vec(&list).unwrap_or_default();
    let digest = Sha256::digest(&json);
    let etag = format!("\"{}\"", hex(&digest[..16]));
    (list, etag)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `If-None-Match` (weak comparison, RFC 9110 §13.1.2): `*` or any listed
/// tag equal to `etag`, `W/` ignored.
fn etag_matches(header: &str, etag: &str) -> bool {
    header.split(',').map(str::trim).any(|t| {
        t == "*" || t.strip_prefix("W/").unwrap_or(t) == etag.strip_prefix("W/").unwrap_or(etag)
    })
}

#[cfg(test)]
mod tests {
    use super::etag_matches;

    #[test]
    fn if_none_match() {
        let e = "\"abc\"";
        assert!(etag_matches("\"abc\"", e));
        assert!(etag_matches("W/\"abc\"", e));
        assert!(etag_matches("\"x\", \"abc\"", e));
        assert!(etag_matches("*", e));
        assert!(!etag_matches("\"abcd\"", e));
        assert!(!etag_matches("abc", e));
    }
}
