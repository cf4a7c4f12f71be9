//! Billing mails against the real api (with its worker), PostgreSQL, Redis
//! and an SMTP sink, provider_b's notifications signed as DOKU documents
//! them:
//!
//! * a payment that becomes PAID mails one receipt (order id, plan, amount,
//!   provider, paid at, the period it grants, times in `BILLING_TIME_ZONE`
//!   with the zone named, the product name and the page link), text and
//!   HTML parts; a duplicate webhook delivery and a re-run of the mail job
//!   send nothing more;
//! * a refund mails one notice saying what the plan is now;
//! * a user without an email address gets no mail, and the payment still
//!   settles.

use std::time::Duration;

use entity::{
    billing::mail::{self, BillingMailJob, BillingMailKind},
    entities::{payments::PaymentStatus, users},
};
use sea_orm::{sqlx::PgPool, ActiveModelTrait, EntityTrait, IntoActiveModel, Set};
use serde_json::json;
use tests::{
    connect_db, count, payment_row, pending_payment, wait_payment_status, wait_until, EnvMap, Mail,
    Proc, SmtpSink, Stack,
};

const B_CLIENT: &str = "BRN-0001-BILLING-MAILS";
const B_SECRET: &str = "SK-billing-mail-tests";
const APP_URL: &str = "https://app.example.test";

fn env(stack: &Stack, sink: &SmtpSink) -> EnvMap {
    stack
        .env()
        .with("PROVIDER_B_CLIENT_ID", B_CLIENT)
        .with("PROVIDER_B_SECRET_KEY", B_SECRET)
        .with("SMTP_URL", sink.url())
        .with("APP_NAME", "Acme Cloud")
        .with("APP_URL", APP_URL)
}

/// Delivers provider_b's notice of `status` for the PRO order; answers the
/// webhook's JSON.
async fn notify(api: &Proc, order_id: &str, status: &str) -> serde_json::Value {
    tests::send_provider_b_notice(api, B_CLIENT, B_SECRET, order_id, 99_000, status).await
}

/// `html` with the entities the templates' escaping writes decoded, as a
/// mail client shows it.
fn unescape(html: &str) -> String {
    html.replace("&#x2f;", "/")
        .replace("&#x27;", "'")
        .replace("&quot;", "\"")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&")
}

fn assert_contains(mail: &Mail, wants: &[&str]) {
    let (text, html) = (mail.part("text/plain"), unescape(&mail.part("text/html")));
    assert!(html.contains("<html"), "an HTML part:\n{}", mail.data);
    for want in wants {
        assert!(text.contains(want), "the text lacks {want:?}:\n{text}");
        assert!(html.contains(want), "the HTML lacks {want:?}:\n{html}");
    }
}

async fn outbox_rows(pool: &PgPool) -> i64 {
    count(pool, "SELECT count(*) FROM job_outbox").await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_paid_payment_mails_one_receipt_and_a_refund_one_notice() {
    let stack = Stack::new().await;
    let sink = SmtpSink::start().await;
    // Not the default zone: the setting decides how the mail states times.
    let api = stack
        .api_with_worker(&env(&stack, &sink).with("BILLING_TIME_ZONE", "America/New_York"))
        .await;
    let db = connect_db(&stack).await;
    let (user, order) = pending_payment(&db, "provider_b").await;

    assert_eq!(
        notify(&api, &order, "SUCCESS").await,
        json!({"received": true})
    );
    assert_eq!(
        notify(&api, &order, "SUCCESS").await,
        json!({"received": true, "duplicate": true}),
        "the provider's retry of the same notice"
    );
    wait_payment_status(&db, &order, PaymentStatus::Paid).await;
    let mails = sink.wait_for(1, Duration::from_secs(30)).await;
    let receipt = &mails[0];
    let p = payment_row(&db, &order).await;
    let zone = chrono_tz::America::New_York;
    // The mail's own wording of a time: "5 December 2026, 06:30 EST
    // (America/New_York)".
    let local_time = |t: chrono::DateTime<chrono::Utc>, zone: chrono_tz::Tz| {
        format!(
            "{} ({})",
            t.with_timezone(&zone).format("%-d %B %Y, %H:%M %Z"),
            zone.name()
        )
    };
    assert_eq!(receipt.envelope_to, vec![format!("{user}@example.com")]);
    assert_eq!(
        receipt.header("subject").as_deref(),
        Some("Acme Cloud receipt: Pro, IDR 99,000")
    );
    let paid_at = local_time(p.paid_at.expect("paid_at"), zone);
    let start = local_time(p.grant_start.expect("the stored grant"), zone);
    let end = local_time(p.grant_end.expect("the stored grant"), zone);
    assert!(
        paid_at.ends_with("ST (America/New_York)") || paid_at.ends_with("DT (America/New_York)"),
        "{paid_at}"
    );
    // The numbered receipt it states is the one stored for the payment.
    let number = {
        use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
        entity::entities::billing_receipts::Entity::find()
            .filter(entity::entities::billing_receipts::Column::PaymentId.eq(p.id))
            .one(&db)
            .await
            .unwrap()
            .expect("a receipt for the paid payment")
            .number
    };
    let numbered = format!("no. {number}");
    assert_contains(
        receipt,
        &[
            &numbered,
            &order,
            "Pro (PRO)",
            "IDR 99,000",
            "provider_b",
            &paid_at,
            &start,
            &end,
            "Acme Cloud",
            APP_URL,
        ],
    );
    assert!(
        !receipt.part("text/plain").contains("Carried over"),
        "nothing was carried"
    );

    // The mail job runs again (a relay that pushed twice, a redelivery):
    // the key is sent, so nothing goes out.
    let again = BillingMailJob {
        kind: BillingMailKind::Receipt,
        key: mail::receipt_key(&order),
        user_id: user,
        to: format!("{user}@example.com"),
        vars: match json!({
            "order_id": order, "plan": "PRO", "amount": 99_000, "currency": "IDR",
            "provider": "provider_b", "paid_at": p.paid_at, "period_start": p.grant_start,
            "period_end": p.grant_end, "from_plan": null, "carried_seconds": 0,
        }) {
            serde_json::Value::Object(m) => m,
            _ => unreachable!(),
        },
    };
    entity::base::outbox::insert(&db, &mail::outbox_row(&again), Duration::ZERO)
        .await
        .unwrap();
    // Until the worker took the job: dropped it, or sent a second mail.
    let taken = wait_until(Duration::from_secs(30), || async {
        api.stderr().contains("billing mail already sent; dropped") || sink.count() > 1
    })
    .await;
    assert!(taken, "the re-run job was not taken");
    assert_eq!(
        outbox_rows(&stack.db.pool().await).await,
        0,
        "the relay moved the job"
    );
    assert_eq!(sink.count(), 1, "one receipt for one payment");

    // A refund: one notice, with the plan the take-back left.
    assert_eq!(
        notify(&api, &order, "REFUND").await,
        json!({"received": true})
    );
    wait_payment_status(&db, &order, PaymentStatus::Refunded).await;
    let mails = sink.wait_for(2, Duration::from_secs(30)).await;
    let notice = &mails[1];
    assert_eq!(
        notice.header("subject").as_deref(),
        Some(format!("Acme Cloud: your payment {order} was refunded").as_str())
    );
    assert_contains(notice, &[&order, "IDR 99,000", "Your plan is now Free."]);
    assert_eq!(
        notify(&api, &order, "REFUND").await,
        json!({"received": true, "duplicate": true})
    );
    // Another payment's receipt marks the queue past anything the refund
    // could have queued twice: then the refund has one notice.
    let (_, marker) = pending_payment(&db, "provider_b").await;
    notify(&api, &marker, "SUCCESS").await;
    let mails = sink.wait_for(3, Duration::from_secs(30)).await;
    assert!(
        mails.iter().any(|m| m.part("text/plain").contains(&marker)),
        "the marker's receipt"
    );
    assert_eq!(sink.count(), 3, "one notice for one refund");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_user_without_an_email_pays_and_gets_no_mail() {
    let stack = Stack::new().await;
    let sink = SmtpSink::start().await;
    let api = stack.api_with_worker(&env(&stack, &sink)).await;
    let db = connect_db(&stack).await;
    let (user, order) = pending_payment(&db, "provider_b").await;
    let mut u = users::Entity::find_by_id(user)
        .one(&db)
        .await
        .unwrap()
        .unwrap()
        .into_active_model();
    u.email = Set(None);
    u.update(&db).await.unwrap();

    notify(&api, &order, "SUCCESS").await;
    wait_payment_status(&db, &order, PaymentStatus::Paid).await;
    let pool = stack.db.pool().await;
    assert_eq!(count(&pool, "SELECT count(*) FROM billing_mails").await, 0);
    assert_eq!(outbox_rows(&pool).await, 0, "no mail job was written");
    assert!(payment_row(&db, &order).await.grant_end.is_some());

    // A user with an address paying after it is mailed: the mail path works.
    let (_, other) = pending_payment(&db, "provider_b").await;
    notify(&api, &other, "SUCCESS").await;
    let mails = sink.wait_for(1, Duration::from_secs(30)).await;
    assert_eq!(mails.len(), 1);
    assert!(mails[0].part("text/plain").contains(&other));
}
