//! Verification of payment-provider notifications: one [`WebhookVerifier`] per
//! provider, each turning the raw request into a verified [`Notification`] or
//! a [`WebhookError`] (401 for a signature that does not verify, 400 for a
//! payload that is not what the protocol defines).
//!
//! Order of checks, as the webhook routes answer them: the body must be a JSON
//! object (else 400); the signature is verified over the fields as received,
//! in constant time (else 401; a signed field that is missing or not a string
//! makes the notification unverifiable: 401); then the rest of the payload is
//! validated (400, naming the field).
//!
//! * provider_a (Midtrans Snap HTTP notification): `signature_key` =
//!   SHA-512(`order_id + status_code + gross_amount + server_key`).
//!   That signature does not cover `transaction_status`: a provider_a
//!   notification is only a hint, which the settlement job confirms with the
//!   provider's status API before anything changes.
//! * provider_b (DOKU Checkout notification): the `Signature` header is
//!   required (the request signature over `Client-Id`, `Request-Id`,
//!   `Request-Timestamp`, `Request-Target` (the webhook's path) and `Digest`,
//!   which covers the whole body), as DOKU documents it; a notice with only a
//!   `security.check_word` is refused. The `check_word` =
//!   SHA-1(`client_id + invoice_number + amount + status + secret_key`), the
//!   amount as the JSON number was written, must verify as well.

use serde_json::{value::RawValue, Value};

use crate::{
    billing::payment::{self, PaymentStatus, ProviderBRequest},
    entities::payments::{PROVIDER_A, PROVIDER_B},
};

/// Why a notification was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WebhookError {
    /// The signature is missing, malformed or does not verify (HTTP 401).
    #[error("invalid signature: {0}")]
    Signature(&'static str),
    /// The payload is not what the protocol defines (HTTP 400); `field` names
    /// the JSON path at fault.
    #[error("invalid payload: {field}: {detail}")]
    Payload {
        /// JSON path of the field, e.g. `order.amount`.
        field: &'static str,
        /// What is wrong.
        detail: &'static str,
    },
}

/// The headers a verifier may read (absent ones as `None`).
#[derive(Debug, Clone, Copy, Default)]
pub struct WebhookHeaders<'a> {
    /// `Client-Id`.
    pub client_id: Option<&'a str>,
    /// `Request-Id`.
    pub request_id: Option<&'a str>,
    /// `Request-Timestamp`.
    pub request_timestamp: Option<&'a str>,
    /// `Signature`.
    pub signature: Option<&'a str>,
}

/// A verified notification.
#[derive(Debug, Clone, PartialEq)]
pub struct Notification {
    /// `provider_a` or `provider_b`.
    pub provider: &'static str,
    /// Our order id (provider_b's `invoice_number`).
    pub order_id: String,
    /// The notified amount in whole currency units; `None` when it has a
    /// non-zero fraction (it can then match no stored amount).
    pub amount: Option<i64>,
    /// The status as the provider spelled it.
    pub provider_status: String,
    /// The payment status it reports.
    pub reported: PaymentStatus,
    /// The dedupe key of decisions.md for this provider.
    pub dedupe_key: String,
    /// The whole body, as JSON.
    pub payload: Value,
}

/// Verifies one provider's notifications.
pub trait WebhookVerifier: Send + Sync {
    /// The provider's wire name.
    fn provider(&self) -> &'static str;
    /// Verifies the raw body (and headers) of a notification.
    fn verify(
        &self,
        body: &[u8],
        headers: &WebhookHeaders<'_>,
    ) -> Result<Notification, WebhookError>;
}

/// provider_a's verifier.
#[derive(Debug, Clone)]
pub struct ProviderA {
    /// `PROVIDER_A_SERVER_KEY`.
    pub server_key: String,
}

impl ProviderA {
    /// The verifier when `PROVIDER_A_SERVER_KEY` is set.
    pub fn from_settings(s: &crate::Settings) -> Option<Self> {
        s.provider_a_server_key
            .clone()
            .map(|server_key| ProviderA { server_key })
    }
}

/// provider_b's verifier.
#[derive(Debug, Clone)]
pub struct ProviderB {
    /// `PROVIDER_B_CLIENT_ID`.
    pub client_id: String,
    /// `PROVIDER_B_SECRET_KEY`.
    pub secret_key: String,
    /// The path the notifications are posted to (`Request-Target`).
    pub path: String,
}

impl ProviderB {
    /// The verifier when `PROVIDER_B_CLIENT_ID` and `PROVIDER_B_SECRET_KEY`
    /// are set; `path` is the webhook's path (the signed `Request-Target`).
    pub fn from_settings(s: &crate::Settings, path: &str) -> Option<Self> {
        Some(ProviderB {
            client_id: s.provider_b_client_id.clone()?,
            secret_key: s.provider_b_secret_key.clone()?,
            path: path.to_string(),
        })
    }
}

fn object(body: &[u8]) -> Result<Value, WebhookError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(v @ Value::Object(_)) => Ok(v),
        _ => Err(WebhookError::Payload {
            field: "body",
            detail: "not a JSON object",
        }),
    }
}

fn signed_str<'v>(v: &'v Value, pointer: &str) -> Result<&'v str, WebhookError> {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .ok_or(WebhookError::Signature(
            "a signed field is missing or not a string",
        ))
}

/// Whole units from a decimal text (`99000`, `99000.00`); `None` for a
/// non-zero fraction. `Err` for text that is not a non-negative decimal.
fn whole_units(text: &str) -> Result<Option<i64>, ()> {
    let (int, frac) = text.split_once('.').unwrap_or((text, ""));
    if int.is_empty()
        || !int.bytes().all(|b| b.is_ascii_digit())
        || !frac.bytes().all(|b| b.is_ascii_digit())
        || (text.contains('.') && frac.is_empty())
    {
        return Err(());
    }
    let n: i64 = int.parse().map_err(|_| ())?;
    Ok(frac.bytes().all(|b| b == b'0').then_some(n))
}

impl WebhookVerifier for ProviderA {
    fn provider(&self) -> &'static str {
        PROVIDER_A
    }

    fn verify(&self, body: &[u8], _: &WebhookHeaders<'_>) -> Result<Notification, WebhookError> {
        let v = object(body)?;
        let order_id = signed_str(&v, "/order_id")?;
        let status_code = signed_str(&v, "/status_code")?;
        let gross_amount = signed_str(&v, "/gross_amount")?;
        let given = signed_str(&v, "/signature_key")?;
        let expected =
            payment::provider_a_signature(order_id, status_code, gross_amount, &self.server_key);
        if !payment::signatures_match(&expected, given) {
            return Err(WebhookError::Signature("signature_key does not verify"));
        }
        let bad = |field, detail| WebhookError::Payload { field, detail };
        let status = v["transaction_status"]
            .as_str()
            .ok_or(bad("transaction_status", "required, a string"))?;
        let fraud = match &v["fraud_status"] {
            Value::Null => None,
            Value::String(s) => Some(s.as_str()),
            _ => return Err(bad("fraud_status", "must be a string")),
        };
        let payment_type = match &v["payment_type"] {
            Value::Null => None,
            Value::String(s) => Some(s.as_str()),
            _ => return Err(bad("payment_type", "must be a string")),
        };
        let reported = payment::provider_a_report(status, fraud, &v)
            .ok_or(bad("transaction_status", "not a status of this protocol"))?;
        let amount = whole_units(gross_amount)
            .map_err(|_| bad("gross_amount", "must be a decimal amount"))?;
        Ok(Notification {
            provider: PROVIDER_A,
            order_id: order_id.to_string(),
            amount,
            provider_status: status.to_string(),
            reported,
            dedupe_key: {
                let key = payment::provider_a_dedupe_key(
                    order_id,
                    status,
                    status_code,
                    payment_type,
                    fraud,
                );
                // Each refund or chargeback of a series is its own event:
                // the total gone back so far (in hundredths, however the
                // notice states it: `refund_amount`, `chargeback_amount` or
                // `refunds[]`) tells them apart.
                match payment::refunded_hundredths(&v) {
                    0 => key,
                    back => format!("{key}:{back}"),
                }
            },
            payload: v.clone(),
        })
    }
}

/// The signed fields of provider_b's notification, with the amount's JSON
/// text kept as written.
#[derive(serde::Deserialize)]
struct ProviderBSigned<'a> {
    #[serde(borrow)]
    order: Option<ProviderBOrder<'a>>,
}

#[derive(serde::Deserialize)]
struct ProviderBOrder<'a> {
    #[serde(borrow)]
    amount: Option<&'a RawValue>,
}

impl WebhookVerifier for ProviderB {
    fn provider(&self) -> &'static str {
        PROVIDER_B
    }

    fn verify(
        &self,
        body: &[u8],
        headers: &WebhookHeaders<'_>,
    ) -> Result<Notification, WebhookError> {
        let v = object(body)?;
        let invoice = signed_str(&v, "/order/invoice_number")?;
        let status = signed_str(&v, "/transaction/status")?;
        let given = signed_str(&v, "/security/check_word")?;
        let raw: ProviderBSigned<'_> = serde_json::from_slice(body)
            .map_err(|_| WebhookError::Signature("a signed field is missing or not a string"))?;
        let amount_text = raw
            .order
            .and_then(|o| o.amount)
            .map(|a| a.get().trim())
            .filter(|t| t.bytes().all(|b| b.is_ascii_digit() || b == b'.'))
            .ok_or(WebhookError::Signature(
                "order.amount is missing or not a number",
            ))?;
        let expected = payment::provider_b_check_word(
            &self.client_id,
            invoice,
            amount_text,
            status,
            &self.secret_key,
        );
        if !payment::signatures_match(&expected, given) {
            return Err(WebhookError::Signature("check_word does not verify"));
        }
        let Some(sig) = headers.signature else {
            return Err(WebhookError::Signature(
                "the Signature header is required (check_word alone does not sign the body)",
            ));
        };
        {
            let (Some(client_id), Some(request_id), Some(ts)) = (
                headers.client_id,
                headers.request_id,
                headers.request_timestamp,
            ) else {
                return Err(WebhookError::Signature(
                    "Signature needs Client-Id, Request-Id and Request-Timestamp",
                ));
            };
            if !payment::signatures_match(&self.client_id, client_id) {
                return Err(WebhookError::Signature("Client-Id is not ours"));
            }
            let expected = payment::provider_b_signature(
                &self.secret_key,
                &ProviderBRequest {
                    client_id,
                    request_id,
                    timestamp: ts,
                    target: &self.path,
                    body: Some(body),
                },
            );
            if !payment::signatures_match(&expected, sig.trim()) {
                return Err(WebhookError::Signature(
                    "the Signature header does not verify",
                ));
            }
        }
        let bad = |field, detail| WebhookError::Payload { field, detail };
        let original_request_id = v
            .pointer("/transaction/original_request_id")
            .and_then(Value::as_str)
            .ok_or(bad("transaction.original_request_id", "required, a string"))?;
        let channel = match v.pointer("/channel/id") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.as_str()),
            Some(_) => return Err(bad("channel.id", "must be a string")),
        };
        let amount =
            whole_units(amount_text).map_err(|_| bad("order.amount", "must be an amount"))?;
        Ok(Notification {
            provider: PROVIDER_B,
            order_id: invoice.to_string(),
            amount,
            provider_status: status.to_string(),
            reported: payment::provider_b_status(status),
            dedupe_key: payment::provider_b_dedupe_key(
                invoice,
                original_request_id,
                status,
                channel,
            ),
            payload: v.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const KEY: &str = "SB-Mid-server-test";

    fn a() -> ProviderA {
        ProviderA {
            server_key: KEY.into(),
        }
    }

    fn a_body(status: &str, fraud: Option<&str>, amount: &str) -> Value {
        let mut v = json!({
            "transaction_time": "2026-11-23 10:00:00",
            "transaction_status": status,
            "transaction_id": "b7d1c7a0-0000-4000-8000-000000000001",
            "status_message": "midtrans payment notification",
            "status_code": "200",
            "signature_key": payment::provider_a_signature("ORD-1-ABCDEFGH", "200", amount, KEY),
            "payment_type": "bank_transfer",
            "order_id": "ORD-1-ABCDEFGH",
            "merchant_id": "G000000000",
            "gross_amount": amount,
            "currency": "IDR",
        });
        if let Some(f) = fraud {
            v["fraud_status"] = json!(f);
        }
        v
    }

    fn bytes(v: &Value) -> Vec<u8> {
        serde_json::to_vec(v).unwrap()
    }

    #[test]
    fn provider_a_accepts_a_signed_settlement() {
        let n = a()
            .verify(
                &bytes(&a_body("settlement", None, "99000.00")),
                &Default::default(),
            )
            .unwrap();
        assert_eq!(n.order_id, "ORD-1-ABCDEFGH");
        assert_eq!(n.amount, Some(99_000));
        assert_eq!(n.reported, PaymentStatus::Paid);
        assert_eq!(n.dedupe_key, "ORD-1-ABCDEFGH:settlement:200:bank_transfer:");
    }

    #[test]
    fn provider_a_keys_each_refund_of_a_series_by_the_total_however_stated() {
        let key = |extra: Value| {
            let mut v = a_body("partial_chargeback", None, "99000.00");
            v.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            a().verify(&bytes(&v), &Default::default())
                .unwrap()
                .dedupe_key
        };
        let base = "ORD-1-ABCDEFGH:partial_chargeback:200:bank_transfer:";
        assert_eq!(
            key(json!({"chargeback_amount": "20000.00"})),
            format!("{base}:2000000")
        );
        assert_eq!(
            key(json!({"refund_amount": "20000.00"})),
            format!("{base}:2000000")
        );
        assert_eq!(
            key(json!({"refunds": [{"refund_amount": "10000.00"}, {"refund_amount": "89000.00"}]})),
            format!("{base}:9900000")
        );
        assert_eq!(key(json!({})), base);
    }

    #[test]
    fn provider_a_refuses_what_does_not_verify() {
        let h = WebhookHeaders::default();
        let mut v = a_body("settlement", None, "99000.00");
        v["gross_amount"] = json!("1.00");
        assert!(matches!(
            a().verify(&bytes(&v), &h),
            Err(WebhookError::Signature(_))
        ));
        let mut v = a_body("settlement", None, "99000.00");
        v["signature_key"] = json!("00");
        assert!(matches!(
            a().verify(&bytes(&v), &h),
            Err(WebhookError::Signature(_))
        ));
        let mut v = a_body("settlement", None, "99000.00");
        v.as_object_mut().unwrap().remove("signature_key");
        assert!(matches!(
            a().verify(&bytes(&v), &h),
            Err(WebhookError::Signature(_))
        ));
        let other = ProviderA {
            server_key: "another".into(),
        };
        let v = a_body("settlement", None, "99000.00");
        assert!(matches!(
            other.verify(&bytes(&v), &h),
            Err(WebhookError::Signature(_))
        ));
        assert!(matches!(
            a().verify(b"not json", &h),
            Err(WebhookError::Payload { field: "body", .. })
        ));
        assert!(matches!(
            a().verify(b"[1,2]", &h),
            Err(WebhookError::Payload { field: "body", .. })
        ));
    }

    #[test]
    fn provider_a_validates_after_verifying() {
        let h = WebhookHeaders::default();
        let v = a_body("teleported", None, "99000.00");
        assert_eq!(
            a().verify(&bytes(&v), &h).unwrap_err(),
            WebhookError::Payload {
                field: "transaction_status",
                detail: "not a status of this protocol"
            }
        );
        let n = a()
            .verify(
                &bytes(&a_body("capture", Some("challenge"), "99000.00")),
                &h,
            )
            .unwrap();
        assert_eq!(n.reported, PaymentStatus::Pending);
        assert!(n.dedupe_key.ends_with(":challenge"));
        let v = a_body("settlement", None, "99000.50");
        assert_eq!(a().verify(&bytes(&v), &h).unwrap().amount, None);
        let v = a_body("settlement", None, "lots");
        assert!(matches!(
            a().verify(&bytes(&v), &h),
            Err(WebhookError::Payload {
                field: "gross_amount",
                ..
            })
        ));
    }

    fn b() -> ProviderB {
        ProviderB {
            client_id: "BRN-0001".into(),
            secret_key: "SK-secret".into(),
            path: "/api/webhooks/provider_b".into(),
        }
    }

    fn b_body(status: &str, amount_text: &str) -> String {
        let word =
            payment::provider_b_check_word("BRN-0001", "ORD-2", amount_text, status, "SK-secret");
        format!(
            r#"{{"order":{{"invoice_number":"ORD-2","amount":{amount_text}}},"transaction":{{"status":"{status}","date":"2026-11-23T10:00:00Z","original_request_id":"req-9"}},"channel":{{"id":"VIRTUAL_ACCOUNT_BCA"}},"security":{{"check_word":"{word}"}},"service":{{"id":"VIRTUAL_ACCOUNT"}}}}"#
        )
    }

    /// `body` verified with a correct `Signature` header.
    fn b_verify(body: &str) -> Result<Notification, WebhookError> {
        let sig = payment::provider_b_signature(
            "SK-secret",
            &ProviderBRequest {
                client_id: "BRN-0001",
                request_id: "notif-1",
                timestamp: "2026-11-23T10:00:01Z",
                target: "/api/webhooks/provider_b",
                body: Some(body.as_bytes()),
            },
        );
        b().verify(
            body.as_bytes(),
            &WebhookHeaders {
                client_id: Some("BRN-0001"),
                request_id: Some("notif-1"),
                request_timestamp: Some("2026-11-23T10:00:01Z"),
                signature: Some(&sig),
            },
        )
    }

    #[test]
    fn provider_b_needs_the_signature_header() {
        let body = b_body("SUCCESS", "99000");
        assert!(matches!(
            b().verify(body.as_bytes(), &Default::default()),
            Err(WebhookError::Signature(_))
        ));
        assert!(b_verify(&body).is_ok());
    }

    #[test]
    fn provider_b_accepts_a_valid_check_word_with_the_amount_as_written() {
        let n = b_verify(&b_body("SUCCESS", "99000")).unwrap();
        assert_eq!(n.order_id, "ORD-2");
        assert_eq!(n.amount, Some(99_000));
        assert_eq!(n.reported, PaymentStatus::Paid);
        assert_eq!(n.dedupe_key, "ORD-2:req-9:SUCCESS:VIRTUAL_ACCOUNT_BCA");
        // Signed with "99000.0" but sent as 99000.0: the text as written counts.
        let n = b_verify(&b_body("SUCCESS", "99000.0")).unwrap();
        assert_eq!(n.amount, Some(99_000));
    }

    #[test]
    fn provider_b_refuses_tampering() {
        let h = WebhookHeaders::default();
        let tampered = b_body("SUCCESS", "99000").replace("99000", "1");
        assert!(matches!(
            b().verify(tampered.as_bytes(), &h),
            Err(WebhookError::Signature(_))
        ));
        let tampered = b_body("FAILED", "99000").replace("FAILED", "SUCCESS");
        assert!(matches!(
            b().verify(tampered.as_bytes(), &h),
            Err(WebhookError::Signature(_))
        ));
        let truncated = {
            let s = b_body("SUCCESS", "99000");
            let i = s.find("check_word").unwrap();
            let word_start = i + "check_word\":\"".len();
            format!("{}{}", &s[..word_start + 10], "\"}}")
        };
        assert!(b().verify(truncated.as_bytes(), &h).is_err());
        let quoted = b_body("SUCCESS", "99000").replace(":99000", ":\"99000\"");
        assert!(matches!(
            b().verify(quoted.as_bytes(), &h),
            Err(WebhookError::Signature(_))
        ));
    }

    #[test]
    fn provider_b_checks_the_signature_header_when_present() {
        let body = b_body("SUCCESS", "99000");
        let sign = |secret: &str, target: &str, body: &[u8]| {
            payment::provider_b_signature(
                secret,
                &ProviderBRequest {
                    client_id: "BRN-0001",
                    request_id: "notif-1",
                    timestamp: "2026-11-23T10:00:01Z",
                    target,
                    body: Some(body),
                },
            )
        };
        let headers = |sig: &str| -> (String, ()) { (sig.to_string(), ()) };
        let good = headers(&sign(
            "SK-secret",
            "/api/webhooks/provider_b",
            body.as_bytes(),
        ))
        .0;
        let h = WebhookHeaders {
            client_id: Some("BRN-0001"),
            request_id: Some("notif-1"),
            request_timestamp: Some("2026-11-23T10:00:01Z"),
            signature: Some(&good),
        };
        assert!(b().verify(body.as_bytes(), &h).is_ok());
        let wrong_path = sign("SK-secret", "/elsewhere", body.as_bytes());
        let h2 = WebhookHeaders {
            signature: Some(&wrong_path),
            ..h
        };
        assert!(matches!(
            b().verify(body.as_bytes(), &h2),
            Err(WebhookError::Signature(_))
        ));
        let h3 = WebhookHeaders {
            request_id: None,
            ..h
        };
        assert!(matches!(
            b().verify(body.as_bytes(), &h3),
            Err(WebhookError::Signature(_))
        ));
        let h4 = WebhookHeaders {
            client_id: Some("BRN-9999"),
            ..h
        };
        assert!(matches!(
            b().verify(body.as_bytes(), &h4),
            Err(WebhookError::Signature(_))
        ));
    }

    #[test]
    fn provider_b_validates_after_verifying() {
        let body = b_body("SUCCESS", "99000").replace(",\"original_request_id\":\"req-9\"", "");
        assert_eq!(
            b_verify(&body).unwrap_err(),
            WebhookError::Payload {
                field: "transaction.original_request_id",
                detail: "required, a string"
            }
        );
    }

    #[test]
    fn whole_units_of_decimal_texts() {
        assert_eq!(whole_units("99000"), Ok(Some(99_000)));
        assert_eq!(whole_units("99000.00"), Ok(Some(99_000)));
        assert_eq!(whole_units("99000.5"), Ok(None));
        assert!(whole_units("").is_err());
        assert!(whole_units("-1").is_err());
        assert!(whole_units("1.").is_err());
        assert!(whole_units(".5").is_err());
        assert!(whole_units("1e5").is_err());
    }
}
