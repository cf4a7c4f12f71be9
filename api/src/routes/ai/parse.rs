//! The chat body as the AI SDK's `DefaultChatTransport` (or a simple client)
//! sends it, read by hand: the body is open (unknown keys are ignored).

use entity::ai::limits::{ChatMessage, Role};
use serde_json::Value;

use crate::problem::ApiError;

/// The parsed chat body: provider name (if any) and the messages. Every
/// documented field is checked for its type (a present field must have it;
/// `null` is not a string); unknown keys are ignored.
pub(super) fn parse_chat(bytes: &[u8]) -> Result<(Option<String>, Vec<ChatMessage>), ApiError> {
    use entity::base::validate::FieldError;
    let bad = |field: &'static str, code: &'static str, msg: String| -> ApiError {
        FieldError::new(field, code, msg).into()
    };
    let v: Value = serde_json::from_slice(bytes)
        .map_err(|e| ApiError::BadRequest(format!("the body is not valid JSON: {e}")))?;
    let Value::Object(map) = v else {
        return Err(ApiError::BadRequest(
            "the body must be a JSON object".into(),
        ));
    };
    for field in ["id", "trigger", "messageId"] {
        if map.get(field).is_some_and(|v| !v.is_string()) {
            let name = match field {
                "id" => "id",
                "trigger" => "trigger",
                _ => "messageId",
            };
            return Err(bad(
                name,
                "invalid_type",
                format!("{name} must be a string"),
            ));
        }
    }
    let provider = match map.get("provider") {
        None => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => {
            return Err(bad(
                "provider",
                "invalid_type",
                "provider must be a string".into(),
            ))
        }
    };
    let list = match map.get("messages") {
        None | Some(Value::Null) => {
            return Err(bad("messages", "required", "messages is required".into()))
        }
        Some(Value::Array(a)) if a.is_empty() => {
            return Err(bad(
                "messages",
                "empty",
                "messages must hold at least one message".into(),
            ))
        }
        Some(Value::Array(a)) => a,
        Some(_) => {
            return Err(bad(
                "messages",
                "invalid_type",
                "messages must be an array".into(),
            ))
        }
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let invalid = |what: &str| bad("messages", "invalid_type", format!("messages[{i}]{what}"));
        let Value::Object(m) = m else {
            return Err(invalid(" must be an object"));
        };
        let role = m
            .get("role")
            .and_then(Value::as_str)
            .and_then(Role::parse)
            .ok_or_else(|| {
                bad(
                    "messages",
                    "invalid_role",
                    format!("messages[{i}].role must be system, user or assistant"),
                )
            })?;
        if m.get("id").is_some_and(|v| !v.is_string()) {
            return Err(invalid(".id must be a string"));
        }
        let content = match m.get("content") {
            None => None,
            Some(Value::String(c)) => Some(c.clone()),
            Some(_) => return Err(invalid(".content must be a string")),
        };
        let parts = match m.get("parts") {
            None => None,
            Some(Value::Array(parts)) => {
                let mut text = String::new();
                for (j, p) in parts.iter().enumerate() {
                    let Value::Object(p) = p else {
                        return Err(invalid(&format!(".parts[{j}] must be an object")));
                    };
                    let Some(kind) = p.get("type").and_then(Value::as_str) else {
                        return Err(invalid(&format!(".parts[{j}].type must be a string")));
                    };
                    match p.get("text") {
                        None => {}
                        Some(Value::String(t)) if kind == "text" => text.push_str(t),
                        Some(Value::String(_)) => {}
                        Some(_) => {
                            return Err(invalid(&format!(".parts[{j}].text must be a string")))
                        }
                    }
                }
                Some(text)
            }
            Some(_) => return Err(invalid(".parts must be an array")),
        };
        let Some(content) = content.or(parts) else {
            return Err(bad(
                "messages",
                "required",
                format!("messages[{i}] needs content (a string) or parts (an array)"),
            ));
        };
        if !content.is_empty() {
            out.push(ChatMessage { role, content });
        }
    }
    if out.is_empty() {
        return Err(bad("messages", "empty", "no message holds any text".into()));
    }
    Ok((provider, out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ui_messages_and_simple_messages() {
        let body = br#"{"id":"c1","trigger":"submit-message","extra":1,
            "messages":[{"id":"m1","role":"system","parts":[{"type":"text","text":"Be brief."}]},
                        {"id":"m2","role":"user","parts":[{"type":"step-start"},{"type":"text","text":"Hi "},{"type":"text","text":"there"}]},
                        {"role":"assistant","content":"Hello"}]}"#;
        let (p, m) = parse_chat(body).unwrap();
        assert_eq!(p, None);
        assert_eq!(m.len(), 3);
        assert_eq!(m[1].content, "Hi there");
        assert_eq!(m[2].role, Role::Assistant);
    }

    #[test]
    fn refuses_missing_empty_and_bad_roles() {
        for body in [
            &br#"{}"#[..],
            br#"{"messages":[]}"#,
            br#"{"messages":[{"role":"tool","content":"x"}]}"#,
            br#"{"messages":[{"role":"user"}]}"#,
            br#"[1]"#,
            br#"{"messages":[{"role":"user","parts":["x"]}]}"#,
            br#"{"messages":[{"role":"user","content":"x"}],"messageId":null}"#,
            br#"{"messages":[{"role":"user","content":1}]}"#,
        ] {
            assert!(
                parse_chat(body).is_err(),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }
}
