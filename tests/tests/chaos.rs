//! Chaos across replicas, against the real binaries on one PostgreSQL and one
//! Redis: two apis and three worker slots. 10,000 contact messages and 2,000
//! signed provider_a notices are sent across both apis (32 requests in
//! flight), while a chaos task stops workers at random (SIGTERM or SIGKILL)
//! and starts them again. Afterwards every contact message has reached the
//! fake email API under its own idempotency key (exactly one key per
//! message, all keys distinct, none missing; a message cut mid-send may
//! arrive again under the same key) and every payment is PAID, settled
//! exactly once (one event, one settle audit row, one subscription period).
//!
//! `CHAOS_CONTACTS` / `CHAOS_NOTICES` scale the counts for local runs; CI
//! runs the defaults. `CHAOS_SEED` replays a run's random choices (the seed
//! is printed).

use std::{
    collections::{BTreeSet, HashMap},
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use entity::entities::{
    payments,
    subscriptions::{self, SubscriptionStatus},
};
use futures::StreamExt;
use sea_orm::EntityTrait;
use serde_json::{json, Value};
use tests::{
    connect_db, count, paid_payments, pending_pro_payments, provider_a_settlement, random_ip,
    report, wait_until, EnvMap, Proc, ProviderAStatusApi, Reply, Stack, CONTACT_EMAIL,
};
use uuid::Uuid;
use wiremock::{
    matchers::{method, path},
    Mock, MockServer, Request, ResponseTemplate,
};

const A_KEY: &str = "SB-Mid-server-chaos-tests";
/// Worker slots.
const WORKERS: usize = 3;
/// Requests in flight across both apis.
const IN_FLIGHT: usize = 32;
/// `WORKER_HEARTBEAT_MS`: a SIGKILLed worker's jobs come back after 4 beats.
const HEARTBEAT_MS: u64 = 1000;
/// `WORKER_SHUTDOWN_TIMEOUT_SECS`.
const SHUTDOWN_SECS: u64 = 2;
/// The subject prefix the contact job writes before the sender's name.
const NAME_PREFIX: &str = "Chaos ";

fn count_from_env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A small xorshift generator: the run's random choices, replayable by seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The fake email API: answers 200 to `POST /emails` and records, per
/// contact message (its number, read from the subject), the idempotency keys
/// it arrived under, and the receipts of settled payments (their key
/// `receipt:<order id>`); anything else it cannot attribute is kept in
/// `stray`.
#[derive(Clone, Default)]
struct EmailApi {
    keys: Arc<Mutex<HashMap<usize, BTreeSet<String>>>>,
    receipts: Arc<Mutex<BTreeSet<String>>>,
    calls: Arc<AtomicUsize>,
    stray: Arc<Mutex<Vec<String>>>,
}

impl EmailApi {
    async fn start(&self) -> MockServer {
        let server = MockServer::builder()
            .disable_request_recording()
            .start()
            .await;
        Mock::given(method("POST"))
            .and(path("/emails"))
            .respond_with(self.clone())
            .mount(&server)
            .await;
        server
    }

    /// Messages that arrived at least once.
    fn delivered(&self) -> usize {
        self.keys.lock().unwrap().len()
    }
}

impl wiremock::Respond for EmailApi {
    fn respond(&self, req: &Request) -> ResponseTemplate {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let key = req
            .headers
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let body: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
        let subject = body["subject"].as_str().unwrap_or("");
        let n = subject
            .rsplit_once(NAME_PREFIX)
            .and_then(|(_, n)| n.trim().parse::<usize>().ok());
        match n {
            Some(n) if !key.is_empty() && body["to"] == json!([CONTACT_EMAIL]) => {
                self.keys.lock().unwrap().entry(n).or_default().insert(key);
            }
            _ if key.starts_with("receipt:") => {
                self.receipts.lock().unwrap().insert(key);
            }
            _ => self
                .stray
                .lock()
                .unwrap()
                .push(format!("key {key:?}, body {body}")),
        }
        ResponseTemplate::new(200).set_body_json(json!({"id": Uuid::new_v4().to_string()}))
    }
}

/// What the chaos task did.
#[derive(Debug, Default)]
struct Chaos {
    starts: usize,
    terms: usize,
    kills: usize,
}

/// Stops (SIGTERM or SIGKILL, the first two stops one of each) and starts
/// workers in random slots every 0.2–1.2 s until `stop`; answers what it did
/// and the workers left running.
async fn chaos(
    stack: Arc<Stack>,
    env: EnvMap,
    mut slots: Vec<Option<Proc>>,
    mut rng: Rng,
    stop: Arc<AtomicBool>,
) -> (Chaos, Vec<Option<Proc>>) {
    let mut did = Chaos::default();
    while !stop.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(200 + rng.below(1000))).await;
        let running = slots.iter().filter(|s| s.is_some()).count();
        let i = rng.below(WORKERS as u64) as usize;
        match slots[i].take() {
            None => {
                slots[i] = Some(stack.worker(&env).await);
                did.starts += 1;
            }
            Some(p) if running == 1 && rng.below(2) == 0 => {
                // Mostly keep one worker going, so the run makes progress.
                slots[i] = Some(p);
            }
            Some(mut p) => {
                let stops = did.terms + did.kills;
                let term = match stops {
                    0 => true,
                    1 => false,
                    _ => rng.below(2) == 0,
                };
                if term {
                    p.term();
                    let status = p
                        .wait_exit(Duration::from_secs(SHUTDOWN_SECS + 20))
                        .await
                        .unwrap_or_else(|| {
                            panic!(
                                "a worker given SIGTERM did not exit; stderr:\n{}",
                                tests::tail(&p.stderr(), 4000)
                            )
                        });
                    assert!(
                        status.success(),
                        "a worker given SIGTERM exited with {status}; stderr:\n{}",
                        tests::tail(&p.stderr(), 4000)
                    );
                    did.terms += 1;
                } else {
                    p.kill9();
                    did.kills += 1;
                }
            }
        }
    }
    (did, slots)
}

/// One request of the run.
enum Item {
    Contact(usize),
    Notice(usize),
}

#[tokio::test(flavor = "multi_thread")]
async fn workers_stopped_and_started_at_random_lose_no_email_and_settle_each_payment_once() {
    let started = Instant::now();
    let contacts = count_from_env("CHAOS_CONTACTS", 10_000);
    let notices = count_from_env("CHAOS_NOTICES", 2_000);
    let seed_value = std::env::var("CHAOS_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| u64::from_le_bytes(Uuid::new_v4().as_bytes()[..8].try_into().unwrap()))
        | 1;
    report(&format!(
        "chaos: {contacts} contact messages, {notices} notices, CHAOS_SEED={seed_value}"
    ));
    let mut rng = Rng(seed_value);

    let stack = Arc::new(Stack::new().await);
    let email = EmailApi::default();
    let email_server = email.start().await;
    let (status_api, status) = ProviderAStatusApi::start(A_KEY).await;
    let env = stack
        .env()
        .with("CONTACT_EMAIL", CONTACT_EMAIL)
        .with("EMAIL_PROVIDER_API_KEY", "re_chaos")
        .with("EMAIL_PROVIDER_BASE_URL", email_server.uri())
        .with("PROVIDER_A_SERVER_KEY", A_KEY)
        .with("PROVIDER_A_API_BASE_URL", status_api.uri())
        .with("JOB_RETRY_BASE_SECS", "1")
        .with("WORKER_HEARTBEAT_MS", HEARTBEAT_MS.to_string())
        .with("WORKER_SHUTDOWN_TIMEOUT_SECS", SHUTDOWN_SECS.to_string())
        // Two apis and three workers, each killed worker's connections held
        // until PostgreSQL notices: at the default pool of 20 they reach the
        // server's 100 connections and starve every other test.
        .with("DB_MAX_CONNECTIONS", "6");

    let apis = [stack.api(&env).await, stack.api(&env).await];
    let db = connect_db(&stack).await;
    let pool = stack.db.pool().await;
    let orders = pending_pro_payments(&db, notices).await;
    for order in &orders {
        status.set(order, "settlement");
    }

    let mut slots = Vec::new();
    for _ in 0..WORKERS {
        slots.push(Some(stack.worker(&env).await));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let chaos_task = tokio::spawn(chaos(
        stack.clone(),
        env.clone(),
        slots,
        Rng(rng.next() | 1),
        stop.clone(),
    ));

    // Every message and notice, shuffled, alternating between the apis.
    let mut sends: Vec<Item> = (0..contacts)
        .map(Item::Contact)
        .chain((0..notices).map(Item::Notice))
        .collect();
    for i in (1..sends.len()).rev() {
        sends.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let http = tests::client();
    let contact_urls = [apis[0].url("/api/contact"), apis[1].url("/api/contact")];
    let notice_urls = [
        apis[0].url("/api/webhooks/provider_a"),
        apis[1].url("/api/webhooks/provider_a"),
    ];
    let answers: Vec<(String, Reply)> =
        futures::stream::iter(sends.iter().enumerate().map(|(k, s)| {
            let api = k % 2;
            let (what, req) = match *s {
                Item::Contact(n) => (
                    format!("contact {n} via api {api}"),
                    http.post(&contact_urls[api])
                        .header("x-forwarded-for", random_ip())
                        .json(&json!({
                            "name": format!("{NAME_PREFIX}{n}"),
                            "email": format!("sender{n}@example.org"),
                            "message": format!("chaos message number {n}"),
                        })),
                ),
                Item::Notice(n) => (
                    format!("notice {} via api {api}", orders[n]),
                    http.post(&notice_urls[api])
                        .header("content-type", "application/json")
                        .body(provider_a_settlement(&orders[n], A_KEY)),
                ),
            };
            async move { (what, Reply::send(req).await) }
        }))
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await;
    let sent_in = started.elapsed();
    for (what, r) in &answers {
        assert_eq!(r.status, 200, "{what}: {}", r.text);
    }

    // Chaos goes on while most of the backlog drains, then stops.
    let drained_most = wait_until(Duration::from_secs(30), || async {
        email.delivered() * 10 >= contacts * 9
            && paid_payments(&pool).await * 10 >= notices as i64 * 9
    })
    .await;
    stop.store(true, Ordering::SeqCst);
    let (did, mut slots) = chaos_task.await.expect("chaos task");
    report(&format!(
        "chaos: sent in {sent_in:?}; {did:?}; 90 % drained under chaos: {drained_most}"
    ));
    assert!(did.terms >= 1 && did.kills >= 1, "{did:?}");
    for slot in &mut slots {
        if slot.is_none() {
            *slot = Some(stack.worker(&env).await);
        }
    }

    // Everything arrives: every message under some key, every payment PAID.
    let all = wait_until(Duration::from_secs(120), || async {
        email.delivered() == contacts
            && paid_payments(&pool).await == notices as i64
            && count(
                &pool,
                "SELECT count(*) FROM webhook_events WHERE settled_at IS NULL",
            )
            .await
                == 0
    })
    .await;
    let stderr = || {
        slots
            .iter()
            .flatten()
            .map(|p| tests::tail(&p.stderr(), 2000).to_string())
            .collect::<Vec<_>>()
            .join("\n---\n")
    };
    assert!(
        all,
        "not everything arrived: {}/{contacts} messages, {}/{notices} paid; workers' stderr:\n{}",
        email.delivered(),
        paid_payments(&pool).await,
        stderr()
    );
    // A little longer for any delivery under a second key to show itself.
    tokio::time::sleep(Duration::from_millis(HEARTBEAT_MS * 4)).await;

    // Emails: one idempotency key per message, all distinct, none missing.
    let keys = email.keys.lock().unwrap().clone();
    let stray = email.stray.lock().unwrap().clone();
    assert!(
        stray.is_empty(),
        "unattributable emails: {} (the first: {:?})",
        stray.len(),
        stray.first()
    );
    // Every PAID payment's receipt, under its one key, and no other.
    let paid: BTreeSet<String> = sea_orm::sqlx::query_scalar::<_, String>(
        "SELECT order_id FROM payments WHERE status = 'PAID'",
    )
    .fetch_all(&pool)
    .await
    .expect("paid orders")
    .into_iter()
    .map(|o| format!("receipt:{o}"))
    .collect();
    let receipts_arrived = wait_until(Duration::from_secs(60), || async {
        *email.receipts.lock().unwrap() == paid
    })
    .await;
    assert!(
        receipts_arrived,
        "receipts: {} of {} paid payments, {} not of a paid payment",
        email.receipts.lock().unwrap().intersection(&paid).count(),
        paid.len(),
        email.receipts.lock().unwrap().difference(&paid).count()
    );
    let missing: Vec<usize> = (0..contacts).filter(|n| !keys.contains_key(n)).collect();
    assert!(missing.is_empty(), "messages never delivered: {missing:?}");
    assert_eq!(keys.len(), contacts, "messages delivered");
    let several: Vec<_> = keys.iter().filter(|(_, k)| k.len() != 1).collect();
    assert!(
        several.is_empty(),
        "messages delivered under more than one key: {several:?}"
    );
    let distinct: BTreeSet<&String> = keys.values().flatten().collect();
    assert_eq!(distinct.len(), contacts, "distinct idempotency keys");
    let calls = email.calls.load(Ordering::SeqCst);
    report(&format!(
        "chaos: {calls} email API calls for {contacts} messages ({} repeated under the same key)",
        calls - contacts
    ));
    for queue in ["email", "settlement"] {
        assert_eq!(
            stack.redis.count("SCARD", &format!("{queue}:dead")).await,
            0,
            "dead letters on {queue}"
        );
    }

    // Payments: each PAID, settled exactly once.
    let n = notices as i64;
    assert_eq!(paid_payments(&pool).await, n, "PAID payments");
    assert_eq!(count(&pool, "SELECT count(*) FROM payments").await, n);
    assert_eq!(
        count(&pool, "SELECT count(*) FROM webhook_events").await,
        n,
        "one event per notification"
    );
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM webhook_events \
             WHERE settled_at IS NOT NULL AND settlement_error IS NULL"
        )
        .await,
        n,
        "every event settled, none refused"
    );
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM audit_logs WHERE action = 'payment.settle'"
        )
        .await,
        n,
        "settle audit rows"
    );
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM payments p JOIN audit_logs a \
             ON a.target_id = p.order_id AND a.action = 'payment.settle'"
        )
        .await,
        n,
        "exactly one settle audit row per payment"
    );
    assert_eq!(
        count(
            &pool,
            "SELECT count(DISTINCT target_id) FROM audit_logs WHERE action = 'payment.settle'"
        )
        .await,
        n,
        "no payment settled twice"
    );
    let subs = subscriptions::Entity::find().all(&db).await.unwrap();
    let pays: HashMap<Uuid, payments::Model> = payments::Entity::find()
        .all(&db)
        .await
        .unwrap()
        .into_iter()
        .map(|p| (p.user_id, p))
        .collect();
    assert_eq!(subs.len(), notices);
    for s in &subs {
        assert_eq!(s.plan, "PRO", "{}", s.user_id);
        assert_eq!(s.status, SubscriptionStatus::Active);
        let pay = &pays[&s.user_id];
        let start = s.current_period_start.expect("period start");
        let end = s.current_period_end.expect("period end");
        assert_eq!(Some(start), pay.paid_at, "the period starts when paid");
        assert_eq!(
            Some(tests::month_after(start)),
            Some(end),
            "one month, not extended twice ({})",
            s.user_id
        );
    }
    drop(slots);
    drop(apis);
    report(&format!("chaos: took {:?}", started.elapsed()));
}
