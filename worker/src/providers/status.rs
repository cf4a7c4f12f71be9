//! Status checks of reconciliation: what the provider says about an order
//! whose notification never came ([`Providers::status`]).
//!
//! * provider_a (Midtrans Core API, "Get Transaction Status"):
//!   `GET {PROVIDER_A_API_BASE_URL}/v2/{order_id}/status` with
//!   `Authorization: Basic base64(server_key + ":")`. The answer carries the
//!   fields of a notification (`order_id`, `status_code`, `gross_amount`,
//!   `signature_key`, `transaction_status`, `fraud_status`, `payment_type`,
//!   `transaction_id`); its `signature_key` is verified exactly like a
//!   notification's (lowercase hex SHA-512 of `order_id + status_code +
//!   gross_amount + server_key`, compared in constant time). An unknown order
//!   is HTTP 404, or a body whose `status_code` is `"404"`.
//! * provider_b (DOKU Checkout, "Check Status API"):
//!   `GET {PROVIDER_B_BASE_URL}/orders/v1/status/{invoice_number}` with
//!   `Client-Id`, `Request-Id`, `Request-Timestamp` and `Signature`, the
//!   Request-Target being that path and no `Digest` (no body). The answer is
//!   `{order{invoice_number, amount}, transaction{status, date,
//!   original_request_id}, service{id}, acquirer{id}, channel{id}}`. An
//!   unknown order is HTTP 404.
//!
//! The call is bounded by the shared client's timeouts and retried once only
//! when no connection could be made (a GET changes nothing at the provider).

use entity::{
    billing::payment,
    entities::payments::{PaymentStatus, PROVIDER_A, PROVIDER_B},
};
use serde_json::Value;

use super::{
    json_answer, provider_a_error_in_body, send_once_more_on_connect_error, ProviderError,
    Providers,
};

/// What the provider reported about an order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusReport {
    /// The payment status the provider's status maps to (decisions.md,
    /// "Payments"; provider_a's partial refunds and chargebacks are REFUNDED
    /// when they cover the whole amount, [`payment::provider_a_report`]).
    pub reported: PaymentStatus,
    /// The amount the provider holds, in whole units of the currency; `None`
    /// when it has a non-zero fraction (never equal to a stored amount).
    /// provider_a writes it as text (`"99000.00"`), provider_b as a number.
    pub amount: Option<i64>,
    /// The provider's own status text (`settlement`, `SUCCESS`, …), for logs.
    pub provider_status: String,
    /// What went back so far by provider_a's `partial_refund` or
    /// `partial_chargeback` answer, whole units rounded up
    /// ([`payment::provider_a_partial_refund`]); `None` otherwise.
    pub refunded: Option<i64>,
}

/// Whole units of a non-negative decimal text (`99000`, `99000.00`):
/// `Ok(None)` for a non-zero fraction, `Err` when it is not such a text.
fn whole_units(text: &str) -> Result<Option<i64>, ProviderError> {
    let bad = || ProviderError::Undocumented(format!("amount {text:?} is not a decimal amount"));
    let (int, frac) = text.split_once('.').unwrap_or((text, ""));
    if int.is_empty()
        || !int.bytes().all(|b| b.is_ascii_digit())
        || !frac.bytes().all(|b| b.is_ascii_digit())
        || (text.contains('.') && frac.is_empty())
    {
        return Err(bad());
    }
    let n: i64 = int.parse().map_err(|_| bad())?;
    Ok(frac.bytes().all(|b| b == b'0').then_some(n))
}

/// A string field of an answer, or [`ProviderError::Undocumented`] naming it.
fn str_at<'v>(v: &'v Value, pointer: &str) -> Result<&'v str, ProviderError> {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .ok_or_else(|| ProviderError::Undocumented(format!("{pointer} is missing or not a string")))
}

impl Providers {
    /// Asks `provider` (`provider_a` or `provider_b`) for the status of
    /// `order_id` (see the module docs for both protocols). `Ok(None)`: the
    /// provider does not know the order. Errors: [`ProviderError::NotConfigured`]
    /// without credentials; `Connect`, `Timeout`, `Transport` and `Status`
    /// (any HTTP error but 404) for transport failures; `Undocumented` for an
    /// answer that is not the documented shape, names another order, reports
    /// a status the protocol does not define, or (provider_a) whose
    /// `signature_key` does not verify.
    pub async fn status(
        &self,
        provider: &str,
        order_id: &str,
    ) -> Result<Option<StatusReport>, ProviderError> {
        match provider {
            PROVIDER_A => self.provider_a_status(order_id).await,
            PROVIDER_B => self.provider_b_status(order_id).await,
            other => Err(ProviderError::Undocumented(format!(
                "unknown provider {other:?}"
            ))),
        }
    }

    async fn provider_a_status(
        &self,
        order_id: &str,
    ) -> Result<Option<StatusReport>, ProviderError> {
        let key = self
            .settings()
            .provider_a_server_key
            .clone()
            .ok_or(ProviderError::NotConfigured("PROVIDER_A_SERVER_KEY"))?;
        let resp = self
            .provider_a_core(reqwest::Method::GET, order_id, "status")
            .await?;
        let v = match json_answer(resp).await {
            Ok((_, v)) => v,
            Err(ProviderError::Status { status: 404, .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        let status_code = str_at(&v, "/status_code")?;
        if status_code == "404" {
            return Ok(None);
        }
        // An error the API answers inside an HTTP 200 (`status_code` 4xx or
        // 5xx, no signature): the same as that HTTP status.
        if v.get("signature_key").is_none() {
            if let Some(e) = provider_a_error_in_body(status_code, &v) {
                return Err(e);
            }
        }
        let answered_order = str_at(&v, "/order_id")?;
        let gross_amount = str_at(&v, "/gross_amount")?;
        let given = str_at(&v, "/signature_key")?;
        let expected =
            payment::provider_a_signature(answered_order, status_code, gross_amount, &key);
        if !payment::signatures_match(&expected, given) {
            return Err(ProviderError::Undocumented(
                "signature_key does not verify (forged, or another server key)".into(),
            ));
        }
        if answered_order != order_id {
            return Err(ProviderError::Undocumented(format!(
                "asked about {order_id}, the answer is about {answered_order}"
            )));
        }
        let transaction_status = str_at(&v, "/transaction_status")?;
        let fraud = v.get("fraud_status").and_then(Value::as_str);
        let reported =
            payment::provider_a_report(transaction_status, fraud, &v).ok_or_else(|| {
                ProviderError::Undocumented(format!(
                    "transaction_status {transaction_status:?} is not a status of the protocol"
                ))
            })?;
        Ok(Some(StatusReport {
            reported,
            amount: whole_units(gross_amount)?,
            provider_status: transaction_status.to_string(),
            refunded: payment::provider_a_partial_refund(transaction_status, &v),
        }))
    }

    async fn provider_b_status(
        &self,
        order_id: &str,
    ) -> Result<Option<StatusReport>, ProviderError> {
        let target = format!("/orders/v1/status/{order_id}");
        let url = format!(
            "{}{target}",
            self.settings().provider_b_base_url.trim_end_matches('/')
        );
        // A second attempt is only made when the first never connected, so
        // the provider has not seen this Request-Id: it may be used again.
        let headers = self.provider_b_headers(&target, None)?;
        let resp = send_once_more_on_connect_error(|| {
            headers.apply(self.http().get(&url).header("Accept", "application/json"))
        })
        .await?;
        let v = match json_answer(resp).await {
            Ok((_, v)) => v,
            Err(ProviderError::Status { status: 404, .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        let invoice = str_at(&v, "/order/invoice_number")?;
        if invoice != order_id {
            return Err(ProviderError::Undocumented(format!(
                "asked about {order_id}, the answer is about {invoice}"
            )));
        }
        let status = str_at(&v, "/transaction/status")?;
        let amount = match v.pointer("/order/amount") {
            Some(Value::Number(n)) => whole_units(&n.to_string())?,
            Some(Value::String(s)) => whole_units(s)?,
            _ => {
                return Err(ProviderError::Undocumented(
                    "/order/amount is missing or not a number".into(),
                ))
            }
        };
        Ok(Some(StatusReport {
            reported: payment::provider_b_status(status),
            amount,
            provider_status: status.to_string(),
            refunded: None,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_units_of_decimal_texts() {
        assert_eq!(whole_units("99000").unwrap(), Some(99000));
        assert_eq!(whole_units("99000.00").unwrap(), Some(99000));
        assert_eq!(whole_units("99000.50").unwrap(), None);
        assert!(whole_units("").is_err());
        assert!(whole_units("99000.").is_err());
        assert!(whole_units("-1").is_err());
        assert!(whole_units("1e5").is_err());
    }
}
