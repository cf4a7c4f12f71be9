//! `JsonBody<T>`: poem-openapi's JSON request payload, but its parse errors are
//! problem details that name the field at fault.
//!
//! poem-openapi's own `Json<T>` reports `{"email": 5}` as "failed to parse
//! "string" … (occurred while parsing "WaitlistRequest")" without the field. On
//! a failed parse this extractor re-checks the JSON against `T`'s OpenAPI
//! schema (properties, required list, JSON types) to name the first bad field:
//! `required` (missing or null), `unknown_field`, `invalid_type`, or
//! `invalid_body` when the body is not a JSON object at all.

use std::ops::Deref;

use poem::{http::StatusCode, FromRequest, Request, RequestBody, Result};
use poem_openapi::{
    payload::{ParsePayload, Payload},
    registry::{MetaSchemaRef, Registry},
    types::{ParseFromJSON, Type},
};
use serde_json::Value;

use crate::problem::Problem;

/// A JSON request body of type `T` (content type `application/json`).
#[derive(Debug, Clone)]
pub struct JsonBody<T>(pub T);

impl<T> Deref for JsonBody<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T: Type> Payload for JsonBody<T> {
    const CONTENT_TYPE: &'static str = "application/json";

    fn check_content_type(content_type: &str) -> bool {
        matches!(content_type.parse::<mime::Mime>(), Ok(m) if m.type_() == "application"
            && (m.subtype() == "json" || m.suffix().is_some_and(|s| s == "json")))
    }

    fn schema_ref() -> MetaSchemaRef {
        T::schema_ref()
    }

    fn register(registry: &mut Registry) {
        T::register(registry);
    }
}

fn reject(code: &str, detail: String, field: Option<&str>) -> poem::Error {
    poem::Error::from_response(
        Problem::new(StatusCode::BAD_REQUEST, code, detail, field).into_response(),
    )
}

/// JSON type names as OpenAPI writes them.
fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Names the first field of `value` that breaks `T`'s schema.
fn diagnose<T: Type>(value: &Value, parser_message: &str) -> poem::Error {
    let Value::Object(map) = value else {
        return reject(
            "invalid_body",
            format!("the body must be a JSON object, got {}", json_type(value)),
            None,
        );
    };
    let mut registry = Registry::new();
    T::register(&mut registry);
    let schema = match T::schema_ref() {
        MetaSchemaRef::Reference(name) => registry.schemas.get(&name).cloned(),
        MetaSchemaRef::Inline(s) => Some(*s),
    };
    let Some(schema) = schema else {
        return reject("invalid_body", parser_message.to_string(), None);
    };
    for key in map.keys() {
        if !schema.properties.iter().any(|(name, _)| name == key) {
            return reject(
                "unknown_field",
                format!("{key} is not a known field"),
                Some(key),
            );
        }
    }
    for (name, prop) in &schema.properties {
        let required = schema.required.contains(name);
        match map.get(*name) {
            None | Some(Value::Null) if required => {
                return reject("required", format!("{name} is required"), Some(name));
            }
            None | Some(Value::Null) => {}
            Some(v) => {
                let expected = match prop {
                    MetaSchemaRef::Inline(s) => s.ty,
                    MetaSchemaRef::Reference(r) => {
                        registry.schemas.get(r).map(|s| s.ty).unwrap_or("object")
                    }
                };
                let actual = json_type(v);
                let compatible =
                    expected == actual || (expected == "number" && actual == "integer");
                if !compatible {
                    return reject(
                        "invalid_type",
                        format!("{name} must be a {expected}, got {actual}"),
                        Some(name),
                    );
                }
            }
        }
    }
    reject("invalid_body", parser_message.to_string(), None)
}

impl<T: ParseFromJSON> ParsePayload for JsonBody<T> {
    const IS_REQUIRED: bool = true;

    async fn from_request(request: &Request, body: &mut RequestBody) -> Result<Self> {
        let data = Vec::<u8>::from_request(request, body).await?;
        if data.iter().all(u8::is_ascii_whitespace) {
            return Err(reject(
                "invalid_body",
                "a JSON body is required".into(),
                None,
            ));
        }
        let value: Value = serde_json::from_slice(&data).map_err(|e| {
            reject(
                "invalid_json",
                format!("the body is not valid JSON: {e}"),
                None,
            )
        })?;
        match T::parse_from_json(Some(value.clone())) {
            Ok(v) => Ok(JsonBody(v)),
            Err(e) => Err(diagnose::<T>(&value, &e.into_message())),
        }
    }
}

poem_openapi::impl_apirequest_for_payload!(JsonBody<T>, T: ParseFromJSON);
