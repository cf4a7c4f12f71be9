//! Checkout: starting a payment with the configured provider for
//! `POST /api/payments`.
//!
//! Protocols (decisions.md, "Payments"):
//! * provider_a, the Snap protocol of Midtrans ("Snap API: create
//!   transaction"): `POST {PROVIDER_A_BASE_URL}/snap/v1/transactions` with
//!   `Authorization: Basic base64(server_key + ":")`, `Accept` and
//!   `Content-Type: application/json`, body `transaction_details{order_id,
//!   gross_amount}`, `item_details[{id, price, quantity, name}]`,
//!   `customer_details{email, first_name}`, `callbacks{finish}`, `expiry{start_time,
//!   unit, duration}` (the payment's own expiry: `start_time` its creation,
//!   `yyyy-MM-dd HH:mm:ss Z`, and the whole minutes of
//!   `PAYMENT_EXPIRE_AFTER_SECS`, so the provider stops taking the payment
//!   no later than we expire it); the documented
//!   answer is 201 `{token, redirect_url}`.
//! * provider_b, the Checkout protocol of DOKU ("Checkout: initiate payment"):
//!   `POST {PROVIDER_B_BASE_URL}/checkout/v1/payment` with the headers
//!   `Client-Id`, `Request-Id`, `Request-Timestamp`, `Signature` (HMAC over
//!   the components and the `Digest` of the exact bytes sent), body
//!   `order{amount, invoice_number, currency, callback_url}`,
//!   `payment{payment_due_date}` (minutes: the payment's expiry), `customer{name, email}`; the
//!   documented answer is 200 `{message: ["SUCCESS"], response: {order,
//!   payment: {url, token_id, expired_date, …}}}`, the page the user pays on
//!   being `response.payment.url`.
//!
//! Each call is sent through [`send_once_more_on_connect_error`] (one retry,
//! only when no connection could be made) and read with [`json_answer`]
//! (64 KiB at most, HTTP errors and non-JSON answers are errors). The
//! provider's answer body is logged in part by the caller, never returned to
//! a client.

use std::time::Duration;

use entity::base::settings::PaymentProvider;
use serde_json::{json, Value};

use super::{json_answer, send_once_more_on_connect_error, ProviderError, Providers};

/// Request target of provider_b's checkout call (also signed as `Request-Target`).
pub const PROVIDER_B_CHECKOUT_PATH: &str = "/checkout/v1/payment";
/// Path of provider_a's Snap transaction call.
pub const PROVIDER_A_CHECKOUT_PATH: &str = "/snap/v1/transactions";
/// Longest `payment.payment_due_date` sent to provider_b, in minutes (30 days).
pub const MAX_PAYMENT_DUE_MINUTES: u64 = 30 * 24 * 60;

/// One order to start a checkout for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckoutOrder {
    /// Our order id (`payments.order_id`), sent as provider_a's `order_id` and
    /// provider_b's `invoice_number`.
    pub order_id: String,
    /// Amount in whole units of `currency` (IDR), the plan's price.
    pub amount: i64,
    /// ISO 4217 currency code (`IDR`).
    pub currency: String,
    /// The plan id (`PRO`), sent as the item id.
    pub plan_id: String,
    /// The plan's display name (`Pro`), sent as the item name.
    pub plan_name: String,
    /// The buyer's email, when the session knows one.
    pub email: Option<String>,
    /// When the payment was created (`payments.created_at`, the database's
    /// clock): the start of its expiry.
    pub created_at: chrono::DateTime<chrono::Utc>,
}

/// A started checkout: what the client needs to pay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Checkout {
    /// provider_a: the Snap token the client-side widget opens, and the
    /// hosted page it would redirect to.
    ProviderA {
        /// Snap token (non-empty).
        token: String,
        /// Hosted payment page (may be empty when the provider sent none).
        redirect_url: String,
    },
    /// provider_b: the hosted page the user is redirected to pay on.
    ProviderB {
        /// `response.payment.url`, an absolute http(s) URL.
        payment_url: String,
    },
}

/// Where the provider sends the user back after paying:
/// `{APP_URL}/billing?order_id={order_id}` (the billing page shows the
/// payment's state; the webhook, not this redirect, settles it).
pub fn finish_url(app_url: &str, order_id: &str) -> String {
    format!(
        "{}/billing?order_id={}",
        app_url.trim_end_matches('/'),
        url::form_urlencoded::byte_serialize(order_id.as_bytes()).collect::<String>()
    )
}

/// provider_b's `payment.payment_due_date` in minutes: the whole minutes of
/// `PAYMENT_EXPIRE_AFTER_SECS` (rounded down, so the provider's page expires
/// no later than our payment does), at least 1, at most
/// [`MAX_PAYMENT_DUE_MINUTES`].
pub fn payment_due_minutes(expire_after: Duration) -> u64 {
    (expire_after.as_secs() / 60).clamp(1, MAX_PAYMENT_DUE_MINUTES)
}

/// provider_a's Snap `expiry` object for `order`: `start_time` the
/// payment's creation (`yyyy-MM-dd HH:mm:ss +0000`), `unit` `minutes`,
/// `duration` [`payment_due_minutes`] of `expire_after`.
pub fn provider_a_expiry(order: &CheckoutOrder, expire_after: Duration) -> Value {
    json!({
        "start_time": order.created_at.format("%Y-%m-%d %H:%M:%S +0000").to_string(),
        "unit": "minutes",
        "duration": payment_due_minutes(expire_after),
    })
}

/// provider_a's request body for `order` (see the module docs).
pub fn provider_a_body(order: &CheckoutOrder, app_url: &str, expire_after: Duration) -> Value {
    let mut customer = json!({});
    if let Some(email) = &order.email {
        customer["email"] = json!(email);
    }
    json!({
        "transaction_details": {
            "order_id": order.order_id,
            "gross_amount": order.amount,
        },
        "item_details": [{
            "id": order.plan_id,
            "price": order.amount,
            "quantity": 1,
            "name": order.plan_name,
        }],
        "customer_details": customer,
        "callbacks": { "finish": finish_url(app_url, &order.order_id) },
        "expiry": provider_a_expiry(order, expire_after),
    })
}

/// provider_b's request body for `order` (see the module docs).
pub fn provider_b_body(order: &CheckoutOrder, app_url: &str, expire_after: Duration) -> Value {
    let mut customer = json!({});
    if let Some(email) = &order.email {
        customer["email"] = json!(email);
    }
    json!({
        "order": {
            "amount": order.amount,
            "invoice_number": order.order_id,
            "currency": order.currency,
            "callback_url": finish_url(app_url, &order.order_id),
        },
        "payment": { "payment_due_date": payment_due_minutes(expire_after) },
        "customer": customer,
    })
}

/// Reads provider_a's documented answer: a non-empty string `token` (and
/// `redirect_url` when present); anything else is
/// [`ProviderError::Undocumented`].
pub fn parse_provider_a(answer: &Value) -> Result<Checkout, ProviderError> {
    let token = answer["token"]
        .as_str()
        .filter(|t| !t.trim().is_empty())
        .ok_or_else(|| ProviderError::Undocumented("no `token` in the answer".into()))?;
    let redirect_url = answer["redirect_url"].as_str().unwrap_or_default();
    Ok(Checkout::ProviderA {
        token: token.to_string(),
        redirect_url: redirect_url.to_string(),
    })
}

/// Reads provider_b's documented answer: `response.payment.url`, which must
/// be an absolute http(s) URL; anything else is [`ProviderError::Undocumented`].
pub fn parse_provider_b(answer: &Value) -> Result<Checkout, ProviderError> {
    let raw = answer["response"]["payment"]["url"]
        .as_str()
        .ok_or_else(|| {
            ProviderError::Undocumented("no `response.payment.url` in the answer".into())
        })?;
    match url::Url::parse(raw) {
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.host_str().is_some() => {
            Ok(Checkout::ProviderB {
                payment_url: raw.to_string(),
            })
        }
        _ => Err(ProviderError::Undocumented(
            "`response.payment.url` is not an http(s) URL".into(),
        )),
    }
}

impl Providers {
    /// Starts a checkout for `order` with the provider `PAYMENT_PROVIDER`
    /// selects (see the module docs for both protocols). Bounded by
    /// `PROVIDER_CONNECT_TIMEOUT_MS` / `PROVIDER_TIMEOUT_MS`; retried once
    /// only when no connection could be made.
    ///
    /// Errors: [`ProviderError::NotConfigured`] without credentials,
    /// `Connect`/`Timeout`/`Transport` for the transport, `Status` for an HTTP
    /// error answer, `Undocumented` for an answer that is not the documented
    /// shape.
    pub async fn checkout(&self, order: &CheckoutOrder) -> Result<Checkout, ProviderError> {
        let s = self.settings();
        match s.payment_provider {
            PaymentProvider::ProviderA => {
                let auth = self.provider_a_auth()?;
                let url = format!(
                    "{}{PROVIDER_A_CHECKOUT_PATH}",
                    s.provider_a_base_url.trim_end_matches('/')
                );
                let body =
                    serde_json::to_vec(&provider_a_body(order, &s.app_url, s.payment_expire_after))
                        .map_err(|e| ProviderError::Transport(e.to_string()))?;
                let resp = send_once_more_on_connect_error(|| {
                    self.http()
                        .post(&url)
                        .header("Authorization", &auth)
                        .header("Accept", "application/json")
                        .header("Content-Type", "application/json")
                        .body(body.clone())
                })
                .await?;
                let (_, answer) = json_answer(resp).await?;
                parse_provider_a(&answer)
            }
            PaymentProvider::ProviderB => {
                let url = format!(
                    "{}{PROVIDER_B_CHECKOUT_PATH}",
                    s.provider_b_base_url.trim_end_matches('/')
                );
                let body =
                    serde_json::to_vec(&provider_b_body(order, &s.app_url, s.payment_expire_after))
                        .map_err(|e| ProviderError::Transport(e.to_string()))?;
                // Signed once: a retry after a failed connection sends the
                // same Request-Id (nothing reached the provider the first time).
                let headers = self.provider_b_headers(PROVIDER_B_CHECKOUT_PATH, Some(&body))?;
                let resp = send_once_more_on_connect_error(|| {
                    headers.apply(
                        self.http()
                            .post(&url)
                            .header("Accept", "application/json")
                            .header("Content-Type", "application/json")
                            .body(body.clone()),
                    )
                })
                .await?;
                let (_, answer) = json_answer(resp).await?;
                parse_provider_b(&answer)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order() -> CheckoutOrder {
        CheckoutOrder {
            order_id: "ORD-1700000000000-ABCDEFGH".into(),
            amount: 99000,
            currency: "IDR".into(),
            plan_id: "PRO".into(),
            plan_name: "Pro".into(),
            email: Some("ann@example.com".into()),
            created_at: "2026-11-23T03:04:05Z".parse().unwrap(),
        }
    }

    #[test]
    fn bodies_follow_the_protocols() {
        let a = provider_a_body(
            &order(),
            "https://app.example.com/",
            Duration::from_secs(3600),
        );
        assert_eq!(
            a["expiry"],
            json!({"start_time": "2026-11-23 03:04:05 +0000", "unit": "minutes", "duration": 60})
        );
        assert_eq!(a["transaction_details"]["gross_amount"], 99000);
        assert_eq!(a["item_details"][0]["quantity"], 1);
        assert_eq!(
            a["callbacks"]["finish"],
            "https://app.example.com/billing?order_id=ORD-1700000000000-ABCDEFGH"
        );
        let b = provider_b_body(
            &order(),
            "https://app.example.com",
            Duration::from_secs(86400),
        );
        assert_eq!(b["order"]["invoice_number"], "ORD-1700000000000-ABCDEFGH");
        assert_eq!(b["payment"]["payment_due_date"], 1440);
        assert_eq!(b["customer"]["email"], "ann@example.com");
    }

    #[test]
    fn due_minutes_are_bounded() {
        assert_eq!(payment_due_minutes(Duration::from_secs(5)), 1);
        assert_eq!(payment_due_minutes(Duration::from_secs(119)), 1);
        assert_eq!(
            payment_due_minutes(Duration::from_secs(365 * 86400)),
            MAX_PAYMENT_DUE_MINUTES
        );
    }

    #[test]
    fn answers_must_be_documented() {
        assert!(parse_provider_a(&json!({"token": "t", "redirect_url": "https://x"})).is_ok());
        assert!(parse_provider_a(&json!({"token": ""})).is_err());
        assert!(parse_provider_a(&json!({})).is_err());
        let ok = json!({"message": ["SUCCESS"], "response": {"payment": {"url": "https://pay.example/p/1"}}});
        assert_eq!(
            parse_provider_b(&ok).unwrap(),
            Checkout::ProviderB {
                payment_url: "https://pay.example/p/1".into()
            }
        );
        assert!(parse_provider_b(
            &json!({"response": {"payment": {"url": "javascript:alert(1)"}}})
        )
        .is_err());
        assert!(parse_provider_b(&json!({"response": {}})).is_err());
    }
}
