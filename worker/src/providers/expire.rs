//! Ending a checkout at its provider ([`Providers::expire`]), for a renewal
//! that no longer renews (voided) while its checkout is still open.
//!
//! * provider_a (Midtrans, "Expire Transaction", for Snap and Core API
//!   alike): `POST {PROVIDER_A_API_BASE_URL}/v2/{order_id}/expire` with
//!   `Authorization: Basic base64(server_key + ":")` and no body. The answer's
//!   `status_code` (also inside an HTTP 200) is `"407"` when the transaction
//!   expired, `"412"` when the merchant may not change its status (paid or
//!   ended already), `"404"` (or HTTP 404) when Midtrans has no transaction
//!   of that order (a Snap page on which the customer has not chosen a
//!   payment method yet).
//! * provider_b (DOKU Checkout) documents no call that ends a checkout: it
//!   expires there after its `payment.payment_due_date`.
//!
//! Retried once only when no connection could be made (nothing reached the
//! provider).

use entity::entities::payments::PROVIDER_A;
use serde_json::Value;

use super::{json_answer, provider_a_error_in_body, ProviderError, Providers};

/// What the provider said to the request to end a checkout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpireAnswer {
    /// The checkout is expired now (provider_a `407`).
    Expired,
    /// Its status can no longer change (provider_a `412`: paid or ended).
    Final,
    /// The provider knows no transaction of the order (provider_a `404`).
    Unknown,
    /// The provider has no such call (provider_b).
    Unsupported,
}

impl Providers {
    /// Asks `provider` to end the checkout of `order_id` (see the module
    /// docs). Errors: [`ProviderError::NotConfigured`] without credentials;
    /// `Connect`, `Timeout`, `Transport` and `Status` (any other HTTP error)
    /// for transport failures; `Undocumented` for an answer without a
    /// `status_code` or with one the call does not document.
    pub async fn expire(
        &self,
        provider: &str,
        order_id: &str,
    ) -> Result<ExpireAnswer, ProviderError> {
        if provider != PROVIDER_A {
            return Ok(ExpireAnswer::Unsupported);
        }
        let resp = self
            .provider_a_core(reqwest::Method::POST, order_id, "expire")
            .await?;
        let v = match json_answer(resp).await {
            Ok((_, v)) => v,
            Err(ProviderError::Status { status: 404, .. }) => return Ok(ExpireAnswer::Unknown),
            Err(ProviderError::Status { status: 412, .. }) => return Ok(ExpireAnswer::Final),
            Err(e) => return Err(e),
        };
        match v.get("status_code").and_then(Value::as_str) {
            Some("407" | "200") => Ok(ExpireAnswer::Expired),
            Some("412") => Ok(ExpireAnswer::Final),
            Some("404") => Ok(ExpireAnswer::Unknown),
            Some(code) => Err(provider_a_error_in_body(code, &v).unwrap_or_else(|| {
                ProviderError::Undocumented(format!("expire answered status_code {code:?}"))
            })),
            None => Err(ProviderError::Undocumented(
                "/status_code is missing or not a string".into(),
            )),
        }
    }
}
