//! The committed `openapi/openapi.json` must equal what the code generates.

#[test]
fn committed_openapi_spec_matches_the_code() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../openapi/openapi.json");
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    let generated = format!("{}\n", api::spec::document());
    if committed != generated {
        panic!(
            "openapi/openapi.json is out of date with the code.\n\
             Regenerate it with:\n\n    cargo run -q -p api -- openapi > openapi/openapi.json\n"
        );
    }
}

#[test]
fn every_operation_documents_its_errors_and_an_example() {
    let spec: serde_json::Value = serde_json::from_str(api::spec::document()).unwrap();
    let paths = spec["paths"].as_object().unwrap();
    assert!(
        paths.contains_key("/api/contact")
            && paths.contains_key("/api/waitlist")
            && paths.contains_key("/api/health")
            && paths.contains_key("/api/profile/avatar")
            && paths.contains_key("/storage/v1/object/upload/sign/avatars/{user_id}/avatar")
            && paths.contains_key("/storage/v1/object/public/avatars/{user_id}/avatar")
    );
    for (path, ops) in paths {
        for (method, op) in ops.as_object().unwrap() {
            let responses = op["responses"].as_object().unwrap();
            // A page route (`/auth/confirm`) answers every failure with a
            // redirect to the error page: its 303 is its error answer.
            let redirects_only = responses.keys().all(|k| k.starts_with('3'));
            assert!(
                redirects_only
                    || responses
                        .keys()
                        .any(|k| k.starts_with('4') || k.starts_with('5')),
                "{method} {path} documents no error response"
            );
            // The platform's logout takes no body (auth-js sends none).
            if method == "post" && path != "/auth/v1/logout" {
                let json_body = op["requestBody"]["content"]
                    .as_object()
                    .into_iter()
                    .flatten()
                    .find(|(media, _)| media.starts_with("application/json"));
                assert!(
                    json_body.is_some_and(|(_, body)| !body["schema"].is_null()),
                    "{method} {path} has no JSON request body"
                );
            }
            if method == "post" && (path == "/api/contact" || path == "/api/waitlist") {
                assert!(
                    responses.contains_key("429"),
                    "{method} {path} is rate limited but documents no 429"
                );
                let h = responses["429"]["headers"].as_object().unwrap();
                for name in [
                    "X-RATELIMIT-LIMIT",
                    "X-RATELIMIT-REMAINING",
                    "X-RATELIMIT-RESET",
                    "RETRY-AFTER",
                ] {
                    assert!(
                        h.keys().any(|k| k.eq_ignore_ascii_case(name)),
                        "{method} {path} 429 lacks {name}"
                    );
                }
            }
        }
    }
    let schemas = spec["components"]["schemas"].as_object().unwrap();
    for (path, op) in [
        ("/api/subscription", "post"),
        ("/api/profile", "post"),
        ("/api/profile/avatar", "post"),
        ("/api/admin/users/role", "post"),
    ] {
        let o = &spec["paths"][path][op];
        assert!(
            !o["security"].is_null(),
            "{op} {path} declares no security scheme"
        );
        assert!(
            o["responses"].get("401").is_some(),
            "{op} {path} documents no 401"
        );
    }
    for name in [
        "ContactRequest",
        "WaitlistRequest",
        "Problem",
        "SubscriptionRequest",
        "ProfileRequest",
        "RoleRequest",
        "AvatarUploadRequest",
    ] {
        assert!(!schemas[name]["example"].is_null(), "{name} has no example");
    }
    // The signed upload answers every refusal the route makes.
    let upload = &spec["paths"]["/storage/v1/object/upload/sign/avatars/{user_id}/avatar"]["put"];
    for status in ["400", "401", "403", "413", "503"] {
        assert!(
            upload["responses"].get(status).is_some(),
            "the signed upload documents no {status}"
        );
    }
}
