//! `POST /api/waitlist` on PostgreSQL: stored once, duplicates 409, invalid email 400.

use futures::future::join_all;
use sea_orm::sqlx;
use serde_json::json;
use tests::{post_json, random_ip, Stack};

async fn rows(stack: &Stack) -> Vec<(String, Option<String>)> {
    let pool = stack.db.pool().await;
    let rows = sqlx::query_as::<_, (String, Option<String>)>(
        "SELECT email, name FROM waitlist ORDER BY email",
    )
    .fetch_all(&pool)
    .await
    .expect("SELECT waitlist");
    pool.close().await;
    rows
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lead_is_stored_once_and_repeats_conflict() {
    let stack = Stack::new().await;
    let api = stack.api(&stack.env()).await;
    let url = api.url("/api/waitlist");

    let r = post_json(
        &url,
        &random_ip(),
        &json!({"email": "Lead.Person@Example.com", "name": "Lead Person"}),
    )
    .await;
    assert_eq!(r.status, 200, "body: {}", r.text);
    assert_eq!(r.json, json!({"success": true}));
    for h in [
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
        "x-request-id",
    ] {
        assert!(r.header(h).is_some(), "{h} missing: {:?}", r.headers);
    }
    assert_eq!(
        rows(&stack).await,
        vec![(
            "lead.person@example.com".to_string(),
            Some("Lead Person".to_string())
        )],
        "stored lowercased and trimmed"
    );

    for again in [
        "Lead.Person@Example.com",
        "lead.person@example.com",
        "LEAD.PERSON@EXAMPLE.COM",
        "  lead.person@example.com  ",
        "\tLead.Person@example.COM\n",
    ] {
        let r = post_json(
            &url,
            &random_ip(),
            &json!({"email": again, "name": "Someone Else"}),
        )
        .await;
        let body = r.assert_problem(409, Some("already_registered"), None);
        assert!(
            !body["detail"].as_str().unwrap_or("").is_empty(),
            "{again:?}: {body}"
        );
    }
    assert_eq!(rows(&stack).await.len(), 1, "duplicates must not be stored");
}

#[tokio::test(flavor = "multi_thread")]
async fn name_is_optional() {
    let stack = Stack::new().await;
    let api = stack.api(&stack.env()).await;
    let r = post_json(
        &api.url("/api/waitlist"),
        &random_ip(),
        &json!({"email": "noname@example.com"}),
    )
    .await;
    assert_eq!(r.status, 200, "body: {}", r.text);
    let rows = rows(&stack).await;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].0, "noname@example.com");
}

#[tokio::test(flavor = "multi_thread")]
async fn invalid_email_is_400_naming_email() {
    let stack = Stack::new().await;
    let api = stack.api(&stack.env()).await;
    let url = api.url("/api/waitlist");
    let mut failures = Vec::new();
    for bad in [
        "not-an-email",
        "a@",
        "@example.com",
        "two@@example.com",
        "spaces in@example.com",
        "",
        "   ",
        "a@b@c.com",
        "trailing.dot.@example.com",
        "x@example.com\r\nBcc: y@example.com",
    ] {
        let r = post_json(&url, &random_ip(), &json!({"email": bad, "name": "X"})).await;
        if let Err(e) = r.check_problem(Some(400), None, Some("email")) {
            failures.push(format!("email {bad:?}: {e}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(rows(&stack).await.is_empty(), "nothing stored");
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_signups_of_one_email_store_one_row() {
    let stack = Stack::new().await;
    let api = stack.api(&stack.env()).await;
    let url = api.url("/api/waitlist");
    let replies = join_all((0..10).map(|i| {
        let url = url.clone();
        async move {
            let email = if i % 2 == 0 {
                "race@example.com"
            } else {
                "RACE@example.com"
            };
            post_json(&url, &random_ip(), &json!({"email": email})).await
        }
    }))
    .await;
    let ok = replies.iter().filter(|r| r.status == 200).count();
    let conflict = replies.iter().filter(|r| r.status == 409).count();
    assert_eq!(
        (ok, conflict),
        (1, 9),
        "statuses: {:?}",
        replies
            .iter()
            .map(|r| r.status.as_u16())
            .collect::<Vec<_>>()
    );
    for r in replies.iter().filter(|r| r.status == 409) {
        r.assert_problem(409, Some("already_registered"), None);
    }
    assert_eq!(rows(&stack).await.len(), 1);
}
