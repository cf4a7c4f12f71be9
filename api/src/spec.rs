//! The OpenAPI document as served at `/api/openapi.json` and committed as
//! `openapi/openapi.json`: poem-openapi's output plus the rules it cannot
//! state itself, applied in one place so no route can forget them:
//!
//! * every JSON request body refuses unknown fields ([`crate::payload::JsonBody`]
//!   does): its schema gets `additionalProperties: false`, except the provider
//!   notifications (tag `Webhooks`), the AI chat (`aiChat`) and the built-in
//!   identity provider (tag `Auth`, [`crate::payload::OpenJsonBody`]), whose
//!   senders add fields at will;
//! * every operation with a JSON body documents 415 (missing or wrong
//!   `Content-Type`) and 408 (body deadline) with their problem body, but
//!   the identity provider's (tag `Auth`) answer a wrong `Content-Type` with
//!   their own 400 `validation_failed`: they document only the 408;
//! * every operation but the health checks documents the load-shedding 503
//!   (`overloaded`, with `Retry-After`; [`crate::shed`]);
//! * bodies whose shapes poem-openapi cannot state: the dead-letter redrive
//!   is a `oneOf` of `{queue, all: true}` and `{queue, ids}` (1–100 ids),
//!   the subscription move a `oneOf` of `{action: cancel|resume}` and
//!   `{action: change, plan}`,
//!   and the chat needs a message that holds text (`content` of at least one
//!   character, or no `content` and a `text` part with text), as
//!   [`crate::routes::ops::dead_letters`] and the chat's parser refuse the rest;
//! * `plan` of `POST /api/payments` is the enum of the purchasable plans of
//!   the catalogue in force (of an operator grant, of its paid plans): the committed document ([`document`]) has the
//!   compiled-in catalogue's, the served one ([`document_for`]) the
//!   `PLANS_FILE` one's.
//!
//! The same document gives the methods of each path, which the
//! [`AllowHeader`] middleware puts in the `Allow` header of every 405
//! (RFC 9110 §15.5.6).

use std::{
    future::Future,
    sync::{Arc, LazyLock},
};

use futures::FutureExt as _;

use poem::{
    http::{header, HeaderValue, StatusCode},
    Endpoint, IntoResponse, Middleware, Request, Response, Result,
};
use serde_json::{json, Value};

/// The finished document as pretty JSON (built once), with the plans of the
/// compiled-in catalogue: the committed `openapi/openapi.json`.
pub fn document() -> &'static str {
    static DOC: LazyLock<String> = LazyLock::new(|| {
        let plans = entity::base::plans::Catalogue::parse(entity::base::plans::BUILT_IN)
            .expect("the compiled-in catalogue is valid");
        build(&plans)
    });
    &DOC
}

/// The document as served with the catalogue in force (`PLANS_FILE`, or the
/// compiled-in one: then it is [`document`]).
pub fn document_for(plans: &entity::base::plans::Catalogue) -> std::borrow::Cow<'static, str> {
    match entity::base::plans::Catalogue::parse(entity::base::plans::BUILT_IN) {
        Ok(built_in) if built_in == *plans => document().into(),
        _ => build(plans).into(),
    }
}

fn build(plans: &entity::base::plans::Catalogue) -> String {
    let mut doc: Value =
        serde_json::from_str(&crate::openapi::openapi().spec()).expect("poem-openapi writes JSON");
    patch(&mut doc);
    document_plans(&mut doc, plans);
    serde_json::to_string_pretty(&doc).expect("JSON")
}

/// Makes `plan` of the payment request the enum of `plans`' purchasable ids.
fn document_plans(doc: &mut Value, plans: &entity::base::plans::Catalogue) {
    let ids: Vec<Value> = plans
        .plans
        .iter()
        .filter(|p| p.purchasable)
        .map(|p| Value::String(p.id.clone()))
        .collect();
    if let Some(plan) = doc.pointer_mut("/components/schemas/PaymentRequest/properties/plan") {
        plan["enum"] = Value::Array(ids.clone());
    }
    if let Some(plan) =
        doc.pointer_mut("/components/schemas/SubscriptionRequest/oneOf/1/properties/plan")
    {
        plan["enum"] = Value::Array(ids);
    }
    // An operator may give any paid plan of the catalogue, sold or not.
    let paid: Vec<Value> = plans
        .plans
        .iter()
        .filter(|p| p.id != entity::base::plans::FREE)
        .map(|p| Value::String(p.id.clone()))
        .collect();
    if let Some(plan) = doc.pointer_mut("/components/schemas/GrantRequest/properties/plan") {
        plan["enum"] = Value::Array(paid);
    }
}

fn problem_response(description: &str) -> Value {
    json!({
        "description": description,
        "content": {
            "application/problem+json": {
                "schema": { "$ref": "#/components/schemas/Problem" }
            }
        }
    })
}

/// Operations whose JSON body takes extra fields: the provider notifications
/// (tag `Webhooks`), the AI chat, whose body is what the AI SDK's
/// `DefaultChatTransport` sends (`id`, `messages`, `trigger`, `messageId` and
/// whatever the app adds), and the built-in identity provider (tag `Auth`),
/// whose clients send the platform's extra fields (`gotrue_meta_security`).
fn open_body(op: &Value) -> bool {
    has_tag(op, "Webhooks") || has_tag(op, "Auth") || op["operationId"] == "aiChat"
}

/// Whether `op` carries `tag`.
fn has_tag(op: &Value, tag: &str) -> bool {
    op["tags"]
        .as_array()
        .is_some_and(|t| t.iter().any(|t| t == tag))
}

/// What the load-shedding 503 adds to an operation's 503 answer.
const OVERLOADED: &str = "The server is handling as many requests as it can \
    (`overloaded`; `HTTP_MAX_IN_FLIGHT`, or for the AI routes `AI_MAX_OPEN_STREAMS`), or \
    receiving as many request bodies as it can hold (`HTTP_BODY_BUDGET_BYTES`): retry after \
    `Retry-After` seconds.";

/// Documents the load-shedding 503 on `op` (appended to a 503 it already has).
fn document_shedding(op: &mut Value) {
    let Some(responses) = op["responses"].as_object_mut() else {
        return;
    };
    let answer = responses
        .entry("503")
        .or_insert_with(|| problem_response(OVERLOADED));
    let description = answer["description"].as_str().unwrap_or_default();
    if !description.contains("`overloaded`") {
        answer["description"] = Value::String(format!("{description} Or: {OVERLOADED}"));
    }
    answer["headers"]["RETRY-AFTER"] = json!({
        "description": "Seconds to wait before retrying (on `overloaded`).",
        "required": false,
        "deprecated": false,
        "schema": {"type": "integer", "format": "uint64"}
    });
}

/// Applies the rules listed in the module documentation to `doc`.
pub fn patch(doc: &mut Value) {
    let mut strict = Vec::new();
    if let Some(paths) = doc["paths"].as_object_mut() {
        for (path, ops) in paths.iter_mut() {
            let Some(ops) = ops.as_object_mut() else {
                continue;
            };
            let shed = !crate::shed::NEVER_SHED.contains(&path.as_str());
            for op in ops.values_mut() {
                if shed {
                    document_shedding(op);
                }
                let body = &op["requestBody"]["content"]["application/json"]["schema"];
                if body.is_null() {
                    continue;
                }
                let open = open_body(op);
                let identity = has_tag(op, "Auth");
                if let Some(name) = body["$ref"]
                    .as_str()
                    .and_then(|r| r.strip_prefix("#/components/schemas/"))
                    .filter(|_| !open)
                {
                    strict.push(name.to_string());
                }
                if let Some(responses) = op["responses"].as_object_mut() {
                    responses.entry("408").or_insert_with(|| {
                        problem_response(
                            "The body did not arrive in full within `HTTP_BODY_TIMEOUT_SECS`, \
                             or arrived slower than `HTTP_BODY_MIN_RATE` bytes per second \
                             (`body_timeout`); the connection is closed.",
                        )
                    });
                    if !identity {
                        responses.entry("415").or_insert_with(|| {
                            problem_response(
                                "The body is not JSON: `Content-Type` is missing or not \
                                 `application/json` (`unsupported_media_type`).",
                            )
                        });
                    }
                    let mut sorted: Vec<_> = std::mem::take(responses).into_iter().collect();
                    sorted.sort_by(|a, b| a.0.cmp(&b.0));
                    responses.extend(sorted);
                }
            }
        }
    }
    // The chat stream: each server-sent event's `data` is one chunk's JSON,
    // or `[DONE]` after the last chunk (poem-openapi can only say "an array
    // of chunks", which no SSE reader validates an event against).
    if let Some(content) =
        doc.pointer_mut("/paths/~1api~1ai~1chat/post/responses/200/content/text~1event-stream")
    {
        content["schema"] = json!({
            "type": "object",
            "description": "One server-sent event of the AI SDK UI message stream v1: `data` \
                is the JSON of a `UiChunk`, or `[DONE]` after the last chunk.",
            "required": ["data"],
            "properties": {
                "data": {
                    "anyOf": [
                        {"type": "string", "enum": ["[DONE]"]},
                        {
                            "type": "string",
                            "contentMediaType": "application/json",
                            "contentSchema": {"$ref": "#/components/schemas/UiChunk"}
                        }
                    ]
                }
            }
        });
    }
    for name in strict {
        if let Some(schema) = doc["components"]["schemas"][&name].as_object_mut() {
            schema.insert("additionalProperties".into(), Value::Bool(false));
        }
    }
    document_redrive(doc);
    document_subscription(doc);
    document_chat_text(doc);
}

/// `SubscriptionRequest` as the `oneOf` it is: `{action: "cancel" |
/// "resume"}` or `{action: "change", plan}`, each closed (poem-openapi can
/// only say "`plan` optional"). `plan` with another action, or `change`
/// without it, is a 400 naming `plan`.
fn document_subscription(doc: &mut Value) {
    let Some(schema) = doc.pointer_mut("/components/schemas/SubscriptionRequest") else {
        return;
    };
    let plan = schema["properties"]["plan"].clone();
    *schema = json!({
        "title": "SubscriptionRequest",
        "description": "What to do with the subscription: `{action: \"cancel\"}` (stop at the end of \
            the paid period), `{action: \"resume\"}` (undo a cancel) or `{action: \"change\", plan}` \
            (the next renewal bills `plan`).",
        "example": {"action": "cancel"},
        "oneOf": [
            {
                "title": "SubscriptionCancelOrResume",
                "type": "object",
                "additionalProperties": false,
                "required": ["action"],
                "properties": {"action": {"type": "string", "enum": ["cancel", "resume"]}},
            },
            {
                "title": "SubscriptionChange",
                "type": "object",
                "additionalProperties": false,
                "required": ["action", "plan"],
                "properties": {"action": {"type": "string", "enum": ["change"]}, "plan": plan},
            },
        ],
    });
}

/// `RedriveRequest` as the `oneOf` it is: `{queue, all: true}` or `{queue,
/// ids}` with 1–100 ids, each closed (poem-openapi can only say "both
/// optional"). Anything else is a 400 naming `ids` or `all`.
fn document_redrive(doc: &mut Value) {
    let Some(schema) = doc.pointer_mut("/components/schemas/RedriveRequest") else {
        return;
    };
    let queue = schema["properties"]["queue"].clone();
    let ids = schema["properties"]["ids"].clone();
    let mut ids = ids;
    ids["minItems"] = json!(1);
    ids["maxItems"] = json!(crate::routes::ops::dead_letters::MAX_LIMIT);
    let mut all = schema["properties"]["all"].clone();
    all["enum"] = json!([true]);
    *schema = json!({
        "title": "RedriveRequest",
        "description": "What to redrive: `{queue, all: true}` (every dead letter of the queue) or \
            `{queue, ids}` (1–100 dead-letter ids of the queue); exactly one of `all` and `ids`.",
        "example": {"queue": "email", "ids": ["01JD5X9Q6Z8K4M2N7P3R5T1V9W"]},
        "oneOf": [
            {
                "title": "RedriveAll",
                "type": "object",
                "additionalProperties": false,
                "required": ["queue", "all"],
                "properties": {"queue": queue, "all": all},
            },
            {
                "title": "RedriveIds",
                "type": "object",
                "additionalProperties": false,
                "required": ["queue", "ids"],
                "properties": {"queue": queue, "ids": ids},
            },
        ],
    });
}

/// The chat's rule that some message holds text, in the schema: `messages`
/// must not consist only of messages without text (`not` + `items`, the
/// OpenAPI 3.0 spelling of `contains`). A message holds text when its
/// `content` has at least one character, or it has no `content` and one of
/// its `parts` is a `text` part with text (`content` wins over `parts`).
fn document_chat_text(doc: &mut Value) {
    let Some(schemas) = doc["components"]["schemas"].as_object_mut() else {
        return;
    };
    if !schemas.contains_key("ChatRequest") {
        return;
    }
    schemas.insert(
        "ChatTextPart".into(),
        json!({
            "title": "ChatTextPart",
            "description": "A `text` part with text.",
            "type": "object",
            "required": ["type", "text"],
            "properties": {
                "type": {"type": "string", "enum": ["text"]},
                "text": {"type": "string", "minLength": 1},
            },
        }),
    );
    schemas.insert(
        "ChatMessageWithText".into(),
        json!({
            "title": "ChatMessageWithText",
            "description": "A message that holds text: `content` of at least one character, or \
                no `content` and a `text` part with text.",
            "anyOf": [
                {
                    "type": "object",
                    "required": ["content"],
                    "properties": {"content": {"type": "string", "minLength": 1}},
                },
                {
                    "type": "object",
                    "required": ["parts"],
                    "not": {"required": ["content"]},
                    "properties": {
                        "parts": {
                            "type": "array",
                            "not": {"items": {"not": {"$ref": "#/components/schemas/ChatTextPart"}}},
                        },
                    },
                },
            ],
        }),
    );
    if let Some(messages) = doc.pointer_mut("/components/schemas/ChatRequest/properties/messages") {
        messages["description"] = json!(
            "The conversation, oldest first; at least one message holds text \
             (`ChatMessageWithText`); messages without text are skipped."
        );
        messages["not"] =
            json!({"items": {"not": {"$ref": "#/components/schemas/ChatMessageWithText"}}});
    }
}

/// Methods of each path template of the document.
#[derive(Debug, Clone, Default)]
pub struct AllowedMethods(Vec<(Vec<String>, String)>);

impl AllowedMethods {
    /// From the `paths` of an OpenAPI document. `HEAD` is listed beside `GET`
    /// (poem answers it), `OPTIONS` is not.
    pub fn from_document(doc: &Value) -> Self {
        let mut out = Vec::new();
        if let Some(paths) = doc["paths"].as_object() {
            for (path, ops) in paths {
                let mut methods: Vec<String> = ops
                    .as_object()
                    .map(|o| o.keys().map(|m| m.to_ascii_uppercase()).collect())
                    .unwrap_or_default();
                if methods.iter().any(|m| m == "GET") {
                    methods.push("HEAD".into());
                }
                let segments = path.split('/').map(str::to_string).collect();
                out.push((segments, methods.join(", ")));
            }
        }
        AllowedMethods(out)
    }

    /// The `Allow` value for a request path, if a path template matches it
    /// (`{param}` matches one non-empty segment).
    pub fn allow(&self, path: &str) -> Option<&str> {
        let parts: Vec<&str> = path.split('/').collect();
        self.0.iter().find_map(|(segments, allow)| {
            let matches = segments.len() == parts.len()
                && segments.iter().zip(&parts).all(|(s, p)| {
                    s == p || (s.starts_with('{') && s.ends_with('}') && !p.is_empty())
                });
            matches.then_some(allow.as_str())
        })
    }
}

/// Gives every 405 answer an `Allow` header (the path's methods from the
/// document) and a problem body.
pub struct AllowHeader(pub Arc<AllowedMethods>);

impl<E: Endpoint> Middleware<E> for AllowHeader {
    type Output = AllowHeaderEndpoint<E>;
    fn transform(&self, ep: E) -> Self::Output {
        AllowHeaderEndpoint {
            inner: ep,
            methods: self.0.clone(),
        }
    }
}

/// See [`AllowHeader`].
pub struct AllowHeaderEndpoint<E> {
    inner: E,
    methods: Arc<AllowedMethods>,
}

impl<E: Endpoint> Endpoint for AllowHeaderEndpoint<E> {
    type Output = Response;

    fn call(&self, req: Request) -> impl Future<Output = Result<Self::Output>> + Send {
        // (A combinator, not an `async fn`: see `crate::middleware`.)
        // (The `Uri` shares the request's bytes: no copy of the path.)
        let uri = req.uri().clone();
        self.inner.call(req).map(move |result| {
            let mut resp = match result {
                Ok(r) => r.into_response(),
                Err(e) if e.status() == StatusCode::METHOD_NOT_ALLOWED && !e.is_from_response() => {
                    crate::problem::from_poem_error(e)
                }
                Err(e) => return Err(e),
            };
            if resp.status() == StatusCode::METHOD_NOT_ALLOWED {
                if let Some(v) = self
                    .methods
                    .allow(uri.path())
                    .and_then(|a| HeaderValue::from_str(a).ok())
                {
                    resp.headers_mut().insert(header::ALLOW, v);
                }
            }
            Ok(resp)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allow_matches_templates() {
        let doc = json!({"paths": {
            "/api/profile": {"post": {}},
            "/storage/v1/object/public/avatars/{user_id}/avatar": {"get": {}},
        }});
        let m = AllowedMethods::from_document(&doc);
        assert_eq!(m.allow("/api/profile"), Some("POST"));
        assert_eq!(
            m.allow("/storage/v1/object/public/avatars/abc/avatar"),
            Some("GET, HEAD")
        );
        assert_eq!(m.allow("/storage/v1/object/public/avatars//avatar"), None);
        assert_eq!(m.allow("/api/nope"), None);
    }

    #[test]
    fn the_plan_is_the_enum_of_the_catalogue_in_force() {
        let doc: Value = serde_json::from_str(document()).unwrap();
        let plan = &doc["components"]["schemas"]["PaymentRequest"]["properties"]["plan"];
        assert_eq!(plan["enum"], json!(["BASIC", "PRO", "ULTIMATE"]));
        let other = entity::base::plans::Catalogue::parse(
            "currency = \"IDR\"\n\
             [[plans]]\nid = \"FREE\"\nname = \"Free\"\nprice = 0\npurchasable = false\nai_requests_per_5min = 1\n\
             [[plans]]\nid = \"TEAM\"\nname = \"Team\"\nprice = 5\npurchasable = true\nai_requests_per_5min = 1\n",
        )
        .unwrap();
        let served: Value = serde_json::from_str(&document_for(&other)).unwrap();
        assert_eq!(
            served["components"]["schemas"]["PaymentRequest"]["properties"]["plan"]["enum"],
            json!(["TEAM"])
        );
    }

    #[test]
    fn the_redrive_body_is_one_of_two_closed_shapes() {
        let doc: Value = serde_json::from_str(document()).unwrap();
        let schema = &doc["components"]["schemas"]["RedriveRequest"];
        let shapes = schema["oneOf"].as_array().expect("oneOf");
        assert_eq!(shapes.len(), 2);
        assert_eq!(shapes[0]["required"], json!(["queue", "all"]));
        assert_eq!(shapes[0]["properties"]["all"]["enum"], json!([true]));
        assert_eq!(shapes[1]["required"], json!(["queue", "ids"]));
        assert_eq!(shapes[1]["properties"]["ids"]["minItems"], json!(1));
        assert_eq!(shapes[1]["properties"]["ids"]["maxItems"], json!(100));
        assert!(schema.get("properties").is_none(), "{schema}");
    }

    #[test]
    fn the_subscription_body_is_one_of_two_closed_shapes() {
        let doc: Value = serde_json::from_str(document()).unwrap();
        let schema = &doc["components"]["schemas"]["SubscriptionRequest"];
        let shapes = schema["oneOf"].as_array().expect("oneOf");
        assert_eq!(shapes.len(), 2);
        assert_eq!(shapes[0]["required"], json!(["action"]));
        assert!(shapes[0]["properties"].get("plan").is_none());
        assert_eq!(shapes[1]["required"], json!(["action", "plan"]));
        assert_eq!(
            shapes[1]["properties"]["plan"]["enum"],
            doc["components"]["schemas"]["PaymentRequest"]["properties"]["plan"]["enum"],
            "the plans for sale"
        );
        assert_eq!(schema["example"], json!({"action": "cancel"}));
    }

    #[test]
    fn the_chat_needs_a_message_with_text() {
        let doc: Value = serde_json::from_str(document()).unwrap();
        let schemas = &doc["components"]["schemas"];
        let messages = &schemas["ChatRequest"]["properties"]["messages"];
        assert_eq!(
            messages["not"]["items"]["not"]["$ref"],
            "#/components/schemas/ChatMessageWithText"
        );
        let with_text = &schemas["ChatMessageWithText"]["anyOf"];
        assert_eq!(with_text[0]["properties"]["content"]["minLength"], json!(1));
        assert_eq!(with_text[1]["not"], json!({"required": ["content"]}));
        assert_eq!(
            with_text[1]["properties"]["parts"]["not"]["items"]["not"]["$ref"],
            "#/components/schemas/ChatTextPart"
        );
        assert_eq!(
            schemas["ChatTextPart"]["properties"]["text"]["minLength"],
            json!(1)
        );
    }

    #[test]
    fn json_bodies_but_open_ones_are_closed_and_document_408_and_415() {
        let doc: Value = serde_json::from_str(document()).unwrap();
        for (path, ops) in doc["paths"].as_object().unwrap() {
            for (method, op) in ops.as_object().unwrap() {
                let schema = &op["requestBody"]["content"]["application/json"]["schema"];
                if schema.is_null() {
                    continue;
                }
                // The identity provider answers a wrong `Content-Type` with its 400.
                let identity = path.starts_with("/auth/");
                assert_eq!(
                    op["responses"].get("415").is_some(),
                    !identity,
                    "{method} {path}"
                );
                assert!(op["responses"].get("408").is_some(), "{method} {path}");
                let name = schema["$ref"].as_str().unwrap().rsplit('/').next().unwrap();
                // Provider notifications, the AI SDK's chat body and the
                // identity provider's bodies stay open: senders add fields at will.
                let expected = if open_body(op) {
                    Value::Null
                } else {
                    json!(false)
                };
                let schema = &doc["components"]["schemas"][name];
                match schema["oneOf"].as_array() {
                    // Each shape of a `oneOf` body is closed on its own.
                    Some(shapes) => {
                        for shape in shapes {
                            assert_eq!(shape["additionalProperties"], expected, "{name}");
                        }
                    }
                    None => assert_eq!(schema["additionalProperties"], expected, "{name}"),
                }
            }
        }
    }
}
