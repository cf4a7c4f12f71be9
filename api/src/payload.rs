//! `JsonBody<T>`: poem-openapi's JSON request payload, but strict about JSON
//! types and with parse errors as problem details that name the field at fault.
//!
//! poem-openapi's own `Json<T>` accepts `{"name": 5}` for a string field (it
//! becomes `"5"`) and reports a bad field as "failed to parse "string" …
//! (occurred while parsing "WaitlistRequest")" without naming it. This
//! extractor first checks the JSON against `T`'s OpenAPI schema (properties,
//! required list, JSON types; computed once per type) and names the first bad
//! field: `required` (missing or null), `unknown_field`, `invalid_type`, or
//! `invalid_body` when the body is not a JSON object at all.

use std::{
    any::TypeId,
    collections::HashMap,
    ops::Deref,
    sync::{Arc, LazyLock, RwLock},
};

use poem::{http::StatusCode, FromRequest, Request, RequestBody, Result};
use poem_openapi::{
    payload::{ParsePayload, Payload},
    registry::{MetaSchema, MetaSchemaRef, Registry},
    types::{ParseFromJSON, Type},
};
use serde_json::Value;

use crate::{pattern, problem::Problem};

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

/// Why a body does not fit its schema ([`check_shape`]): a problem `code`,
/// a message, and the field at fault.
struct Rejection {
    code: &'static str,
    detail: String,
    field: Option<String>,
}

impl Rejection {
    fn new(code: &'static str, detail: String, field: Option<&str>) -> Self {
        Rejection {
            code,
            detail,
            field: field.map(str::to_string),
        }
    }

    /// As problem details ([`JsonBody`]).
    fn problem(self) -> poem::Error {
        reject(self.code, self.detail, self.field.as_deref())
    }
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

/// The top level of an object schema: each property's schema (references
/// resolved), whether it is required and its pattern compiled.
struct Shape {
    fields: Vec<Field>,
}

/// One property of a [`Shape`].
struct Field {
    name: &'static str,
    schema: MetaSchema,
    required: bool,
    /// `schema.pattern` compiled ([`crate::pattern::compiled`]); `None` when
    /// there is none or it does not compile (then nothing matches it).
    pattern: Option<&'static regex::Regex>,
}

/// Shapes by request type, computed once per type from its OpenAPI schema.
static SHAPES: LazyLock<RwLock<HashMap<TypeId, Option<Arc<Shape>>>>> =
    LazyLock::new(Default::default);

/// A property's schema with references resolved; a documented reference
/// (`allOf: [{$ref}, {description}]`, what a doc comment on an enum field
/// gives) is the referenced schema.
fn resolve(registry: &Registry, prop: &MetaSchemaRef) -> MetaSchema {
    match prop {
        MetaSchemaRef::Inline(s) if s.ty.is_empty() && !s.all_of.is_empty() => {
            resolve(registry, &s.all_of[0])
        }
        MetaSchemaRef::Inline(s) => (**s).clone(),
        MetaSchemaRef::Reference(r) => registry
            .schemas
            .get(r)
            .cloned()
            .unwrap_or_else(|| MetaSchema::new("object")),
    }
}

fn shape<T: Type + 'static>() -> Option<Arc<Shape>> {
    let id = TypeId::of::<T>();
    if let Some(s) = SHAPES.read().expect("shape cache poisoned").get(&id) {
        return s.clone();
    }
    let mut registry = Registry::new();
    T::register(&mut registry);
    let schema = match T::schema_ref() {
        MetaSchemaRef::Reference(name) => registry.schemas.get(&name).cloned(),
        MetaSchemaRef::Inline(s) => Some(*s),
    };
    let computed = schema.filter(|s| s.ty == "object").map(|schema| {
        let fields = schema
            .properties
            .iter()
            .map(|(name, prop)| {
                let schema_of = resolve(&registry, prop);
                Field {
                    name,
                    pattern: schema_of.pattern.as_deref().and_then(pattern::compiled),
                    schema: schema_of,
                    required: schema.required.contains(name),
                }
            })
            .collect();
        Arc::new(Shape { fields })
    });
    SHAPES
        .write()
        .expect("shape cache poisoned")
        .insert(id, computed.clone());
    computed
}

/// Checks `value` against `T`'s top-level schema strictly (poem-openapi itself
/// turns `5` or `true` into `"5"`/`"true"` for a string field): the first
/// unknown field (unless `open`), missing or null required field, or field of
/// the wrong JSON type is a 400 naming it.
fn check_shape<T: Type + 'static>(value: &Value, open: bool) -> Result<(), Rejection> {
    let Value::Object(map) = value else {
        return Err(Rejection::new(
            "invalid_body",
            format!("the body must be a JSON object, got {}", json_type(value)),
            None,
        ));
    };
    let Some(shape) = shape::<T>() else {
        return Ok(());
    };
    for key in map.keys() {
        if !open && !shape.fields.iter().any(|f| f.name == key) {
            return Err(Rejection::new(
                "unknown_field",
                format!("{key} is not a known field"),
                Some(key),
            ));
        }
    }
    for field in &shape.fields {
        let (name, schema) = (field.name, &field.schema);
        match map.get(name) {
            None | Some(Value::Null) if field.required => {
                return Err(Rejection::new(
                    "required",
                    format!("{name} is required"),
                    Some(name),
                ));
            }
            None => {}
            Some(Value::Null) if schema.nullable => {}
            Some(Value::Null) => {
                return Err(Rejection::new(
                    "invalid_type",
                    format!(
                        "{name} must be a {}, got null (leave it out instead)",
                        schema.ty
                    ),
                    Some(name),
                ));
            }
            Some(v) => check_value(name, schema, field.pattern, v)?,
        }
    }
    Ok(())
}

/// Checks one field's value against the rules its schema states (JSON type,
/// `enum`, `minLength`/`maxLength` in characters, `minimum`/`maximum`,
/// `pattern`, given `compiled`, `format: uuid`), so that the schema and the
/// server enforce the same rules and a violation is a 400 naming the field.
/// A schema without a type (any JSON value) admits every type.
fn check_value(
    name: &str,
    schema: &MetaSchema,
    compiled: Option<&regex::Regex>,
    v: &Value,
) -> Result<(), Rejection> {
    let bad = |code: &'static str, detail: String| Err(Rejection::new(code, detail, Some(name)));
    let (expected, actual) = (schema.ty, json_type(v));
    // Enums carry no `type` of their own: their values say it.
    let expected = match (expected, schema.enum_items.first()) {
        ("", Some(first)) => json_type(first),
        (t, _) => t,
    };
    let any = expected.is_empty();
    if !(any || expected == actual || (expected == "number" && actual == "integer")) {
        return bad(
            "invalid_type",
            format!("{name} must be a {expected}, got {actual}"),
        );
    }
    if !schema.enum_items.is_empty() && !schema.enum_items.contains(v) {
        let allowed: Vec<String> = schema.enum_items.iter().map(Value::to_string).collect();
        return bad(
            "invalid_value",
            format!("{name} must be one of {}", allowed.join(", ")),
        );
    }
    if let Value::String(s) = v {
        let chars = s.chars().count();
        if schema.min_length.is_some_and(|min| chars < min) {
            return bad(
                "too_short",
                format!(
                    "{name} must have at least {} characters",
                    schema.min_length.unwrap_or_default()
                ),
            );
        }
        if schema.max_length.is_some_and(|max| chars > max) {
            return bad(
                "too_long",
                format!(
                    "{name} must have at most {} characters",
                    schema.max_length.unwrap_or_default()
                ),
            );
        }
        if let Some(pattern) = &schema.pattern {
            if !compiled.is_some_and(|re| re.is_match(s)) {
                return bad(
                    "invalid_format",
                    format!("{name} does not match the pattern {pattern}"),
                );
            }
        }
        if schema.format == Some("email") && !entity::base::validate::is_mailbox(s.trim()) {
            return bad(
                "invalid_email",
                format!("{name} is not a valid email address"),
            );
        }
        if schema.format == Some("uuid") && (s.len() != 36 || uuid::Uuid::parse_str(s).is_err()) {
            return bad("invalid_uuid", format!("{name} must be a UUID"));
        }
    }
    if let Some(n) = v.as_f64() {
        let below = schema.minimum.is_some_and(|min| n < min);
        let above = schema.maximum.is_some_and(|max| n > max);
        if below || above {
            return bad(
                "out_of_range",
                format!(
                    "{name} must be between {} and {}",
                    schema.minimum.map_or("-inf".into(), |m| m.to_string()),
                    schema.maximum.map_or("inf".into(), |m| m.to_string())
                ),
            );
        }
    }
    Ok(())
}

impl<T: ParseFromJSON + 'static> ParsePayload for JsonBody<T> {
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
        check_shape::<T>(&value, false).map_err(Rejection::problem)?;
        T::parse_from_json(Some(value))
            .map(JsonBody)
            .map_err(|e| reject("invalid_body", e.into_message(), None))
    }
}

poem_openapi::impl_apirequest_for_payload!(JsonBody<T>, T: ParseFromJSON + 'static);

/// A JSON request body checked like [`JsonBody`] (JSON types, `null` only
/// where the schema allows it, patterns and formats), but open to fields the
/// schema does not name, and failing with a plain 400 whose message the route
/// renders in its own error format. For the built-in identity provider: its
/// clients send extra fields (`gotrue_meta_security`) and read the
/// platform's error bodies.
#[derive(Debug, Clone)]
pub struct OpenJsonBody<T>(pub T);

impl<T> Deref for OpenJsonBody<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T: Type> Payload for OpenJsonBody<T> {
    const CONTENT_TYPE: &'static str = "application/json";

    fn check_content_type(content_type: &str) -> bool {
        <JsonBody<T> as Payload>::check_content_type(content_type)
    }

    fn schema_ref() -> MetaSchemaRef {
        T::schema_ref()
    }

    fn register(registry: &mut Registry) {
        T::register(registry);
    }
}

impl<T: ParseFromJSON + 'static> ParsePayload for OpenJsonBody<T> {
    const IS_REQUIRED: bool = true;

    async fn from_request(request: &Request, body: &mut RequestBody) -> Result<Self> {
        let bad = |m: String| poem::Error::from_string(m, StatusCode::BAD_REQUEST);
        let data = Vec::<u8>::from_request(request, body).await?;
        let value: Value = serde_json::from_slice(&data)
            .map_err(|e| bad(format!("the body is not valid JSON: {e}")))?;
        check_shape::<T>(&value, true).map_err(|r| bad(r.detail))?;
        T::parse_from_json(Some(value))
            .map(OpenJsonBody)
            .map_err(|e| bad(e.into_message()))
    }
}

poem_openapi::impl_apirequest_for_payload!(OpenJsonBody<T>, T: ParseFromJSON + 'static);

/// An email address field (`type: string, format: email`). The value is
/// kept as sent; [`JsonBody`] and [`OpenJsonBody`] check it, trimmed, with the same rule as the
/// model ([`entity::base::validate::is_mailbox`]), so surrounding whitespace is
/// tolerated as the model trims it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mailbox(pub String);

impl Deref for Mailbox {
    type Target = String;
    fn deref(&self) -> &String {
        &self.0
    }
}

impl AsRef<str> for Mailbox {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl Type for Mailbox {
    const IS_REQUIRED: bool = true;
    type RawValueType = Self;
    type RawElementValueType = Self;

    fn name() -> std::borrow::Cow<'static, str> {
        "string_email".into()
    }

    fn schema_ref() -> MetaSchemaRef {
        MetaSchemaRef::Inline(Box::new(MetaSchema::new_with_format("string", "email")))
    }

    fn as_raw_value(&self) -> Option<&Self> {
        Some(self)
    }

    fn raw_element_iter<'a>(&'a self) -> Box<dyn Iterator<Item = &'a Self> + 'a> {
        Box::new(self.as_raw_value().into_iter())
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl ParseFromJSON for Mailbox {
    fn parse_from_json(value: Option<Value>) -> poem_openapi::types::ParseResult<Self> {
        match value.unwrap_or_default() {
            Value::String(s) => Ok(Mailbox(s)),
            other => Err(poem_openapi::types::ParseError::expected_type(other)),
        }
    }
}

impl poem_openapi::types::ToJSON for Mailbox {
    fn to_json(&self) -> Option<Value> {
        Some(Value::String(self.0.clone()))
    }
}

/// A JSON request body kept as the exact bytes received (content type
/// `application/json`), documented with `T`'s schema. For bodies whose
/// signature covers the bytes as sent (provider webhooks): nothing is parsed
/// here; the verifier reads the bytes. Extra fields are allowed (the OpenAPI
/// document leaves such schemas open).
#[derive(Debug, Clone)]
pub struct RawJson<T> {
    /// The body as received (at most the `/api` body limit).
    pub bytes: bytes::Bytes,
    _schema: std::marker::PhantomData<fn() -> T>,
}

impl<T: Type> Payload for RawJson<T> {
    const CONTENT_TYPE: &'static str = "application/json";

    fn check_content_type(content_type: &str) -> bool {
        <JsonBody<T> as Payload>::check_content_type(content_type)
    }

    fn schema_ref() -> MetaSchemaRef {
        T::schema_ref()
    }

    fn register(registry: &mut Registry) {
        T::register(registry);
    }
}

impl<T: Type> ParsePayload for RawJson<T> {
    const IS_REQUIRED: bool = true;

    async fn from_request(request: &Request, body: &mut RequestBody) -> Result<Self> {
        Ok(RawJson {
            bytes: bytes::Bytes::from_request(request, body).await?,
            _schema: std::marker::PhantomData,
        })
    }
}
poem_openapi::impl_apirequest_for_payload!(RawJson<T>, T: Type + 'static);
