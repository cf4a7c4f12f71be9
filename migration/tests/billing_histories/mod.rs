//! Generated billing histories: a property test of the money invariant of
//! `README.md` ("The invariants", Money): every second of a paid period is
//! bought by money still paid, at the price it was sold at, or given by an
//! operator, and a refund takes back only what that money bought that is
//! still to come.
//!
//! One customer per case, on the schema the migrations make (SQLite in
//! memory, then a scratch PostgreSQL database). The steps are what the
//! providers and the calendar do to a subscription through the model's own
//! entry points: a checkout of BASIC, PRO or ULTIMATE at its catalogue price
//! settled `PAID` (`settlement::settle_status_check`, the path webhooks and
//! reconciliation share), a full refund of an earlier payment settled
//! `REFUNDED`, a partial refund or chargeback of one (`refunded_amount`
//! grows, the payment stays `PAID`), time passing (the application's clock,
//! `entity::base::db::now`, moves on; each history begins now or on a
//! calendar edge: a month's last day, a leap day, a year's end), a tick of the renewal loop
//! (its lapse, past-due and offer passes in a shuffled order,
//! `renewal::run_batch`), paying
//! the open renewal, paying a checkout of the latest renewal whatever it
//! became since (outdated renewal payments, priced as time on the plan in
//! force), `change` of the next renewal's plan, `cancel` / `resume`, and
//! an operator's grant of a plan until a date, and the catalogue cutting or
//! raising a plan's price. Between ticks an ended period stays `active`, as while the
//! loop is late or paused. Steps also come as renewal cycles (a phase
//! scheduled), as "the end passes, a tick", and as two steps racing on the
//! pool ([`races`]); the checks after every step hold for any order.
//!
//! After every step, with `R` the paid time still to come (the period end
//! less the database's now, on a paid plan) and `P` the price of the plan in
//! force:
//! * **no free time**: `R` is at most what the money still paid could buy
//!   of that plan: `R × P ≤ Σ(amount of PAID payments) × 31 days` (a partial
//!   refund takes no time, so its payment's whole amount counts);
//! * **a partial refund takes no time**: the payment stays `PAID` with the
//!   total gone back, the plan and its end are unchanged;
//! * **nothing paid, nothing running**: with no payment `PAID`, `R = 0`;
//! * **a refund takes only its own**: refunding a payment whose grant is
//!   over and carried nothing on leaves the plan and its end unchanged (but
//!   in a grace, below), and
//!   one whose grant carried nothing on takes at most what is still to come
//!   of that grant; in its grace, the whole refund of the payment whose
//!   grant ends the period ends the grace (FREE);
//! * **grace always warns**: a tick (its lapse, past-due and offer passes
//!   in any of their orders, as several workers' batches interleave) lapses
//!   a paid plan only after its past-due notice was recorded and its grace
//!   is over, or at the end of a subscription set to end;
//! * **no rise without notice**: a renewal a tick offers bills at most the
//!   catalogue price, and more than the customer last paid for the plan
//!   only under a price-change notice recorded at least
//!   `PRICE_CHANGE_NOTICE_DAYS` before, for at least that amount; one
//!   offered below the catalogue price leaves the customer told of the rise
//!   (`R × P` above counts each plan at the lowest price it was sold at);
//! * **a paid change waits for the period end**: a scheduled phase is
//!   backed by its payment, still `PAID` and not carried on, of another
//!   plan than the one in force; after a tick none is left whose period
//!   end has passed (the tick began it);
//! * **renewals keep the anchor**: a paid period ends on its stored
//!   anchor, and paying the renewal of the plan in force before its end
//!   moves the end exactly one anchored month on (31 January → 29 February
//!   → 31 March);
//! * **paying never loses time**: after a payment of plan `Q` settles, at
//!   least a short month (28 days) of `Q` runs, plus what ran before,
//!   converted at the prices (`R' × Q ≥ 28 days × Q + R × P × 28/31`, the
//!   second term less what partial refunds gave back: they lower the value
//!   carried),
//!   less at most a grace (three days) of a period that had ended (the
//!   grace days are billed; a payment never buys a period already over).
//!
//! Cases: `BILLING_CASES` (default 1000 per backend), split among
//! `BILLING_WORKERS` workers (default one per core), each on a database of
//! its own (PostgreSQL ones cloned from one migrated template) with seed
//! `BILLING_SEED` (default 44) plus its number; a failing case is shrunk to
//! its shortest history and printed with the settings that run its worker
//! alone. Run: `TEST_DATABASE_ADMIN_URL=postgres://postgres@127.0.0.1:5432/postgres
//! cargo nextest run -p migration -E 'test(/billing_histories/)'`.

mod calendar;
mod checks;
mod history;
mod named;
mod phases;
mod prices;
mod races;
mod world;

use chrono::Duration;
use entity::{
    accounts::users::{ensure_user, Identity},
    billing::{
        payment::PaymentStatus,
        renewal, settlement,
        subscription::{self, SubscriptionAction},
    },
    entities::{
        renewals::{self, RenewalStatus},
        subscriptions,
    },
};
use proptest::{
    prelude::*,
    test_runner::{Config as ProptestConfig, RngSeed, TestCaseError, TestRunner},
};
use sea_orm::{ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter, QueryOrder};
use uuid::Uuid;

use crate::common::{sqlite_memory, Scratch};
use checks::*;
use entity::billing::ledger;
use history::history;
use world::*;

/// One thing that happens to the customer.
#[derive(Debug, Clone)]
pub(super) enum Step {
    /// A checkout of `PLANS[i]` is paid.
    Pay(usize),
    /// The `k`-th payment (mod how many there are) is refunded in full.
    Refund(usize),
    /// The `k`-th `PAID` payment is partly refunded or charged back: this
    /// many percent (1–99) of what is still paid of it goes back.
    PartialRefund(usize, i64),
    /// This many hours pass.
    Pass(i64),
    /// A tick of the renewal loop: its passes in a tick's order.
    /// A tick of the renewal loop: its lapse, past-due and offer passes,
    /// in the `k`-th of their six orders (0: the scheduler's own; the rule
    /// must not depend on it: several workers' batches interleave).
    Tick(usize),
    /// The open renewal (if any) is paid through its pay link.
    PayRenewal,
    /// A checkout made through the latest renewal's pay link, whatever it
    /// became since (paid, voided, outdated), is paid now.
    PayStaleRenewal,
    /// `change`: the next renewal bills `PLANS[i]`.
    Change(usize),
    /// `cancel`, or `resume` when `false`.
    Cancel(bool),
    /// An operator gives `PLANS[i]` until this many hours from now.
    Give(usize, i64),
    /// The catalogue sells every plan at this many percent of its price in
    /// `config/plans.toml` from now on (a cut or a rise).
    Reprice(i64),
    /// Time passes to this many hours before the period end (if a paid
    /// period runs): into the renewal's lead, or (negative) past the end.
    ToEnd(i64),
    /// Two of the steps above at once ([`races`]).
    Race(Box<Step>, Box<Step>),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (0..PLANS.len()).prop_map(Step::Pay),
        2 => (0..8usize).prop_map(Step::Refund),
        1 => (0..8usize, 1i64..100).prop_map(|(k, pct)| Step::PartialRefund(k, pct)),
        2 => prop_oneof![1i64..48, 24i64..24 * 45].prop_map(Step::Pass),
        4 => prop_oneof![3 => Just(0usize), 1 => 1usize..6].prop_map(Step::Tick),
        3 => Just(Step::PayRenewal),
        1 => Just(Step::PayStaleRenewal),
        2 => (0..PLANS.len()).prop_map(Step::Change),
        1 => any::<bool>().prop_map(Step::Cancel),
        1 => (0..PLANS.len(), 1i64..24 * 60).prop_map(|(i, h)| Step::Give(i, h)),
        1 => prop_oneof![Just(80i64), Just(100), Just(130), Just(160)].prop_map(Step::Reprice),
        4 => (-72i64..24 * 8).prop_map(Step::ToEnd),
    ]
}

/// A step, or a renewal cycle with a plan change: a checkout of one plan,
/// `change` to another, time to `h` hours before the period end (into the
/// renewal's lead), a tick (which offers the renewal of the chosen plan),
/// and that renewal paid early: a scheduled phase (alone, those steps line
/// up in about 2 % of histories); or the period's end passing by `h` hours
/// and a tick.
fn chunk() -> impl Strategy<Value = Vec<Step>> {
    let n = PLANS.len();
    prop_oneof![
        8 => step().prop_map(|s| vec![s]),
        2 => (0..n, 1..n, 24i64..24 * 7).prop_map(move |(i, other, h)| vec![
            Step::Pay((i + other) % n),
            Step::Change(i),
            Step::ToEnd(h),
            Step::Tick(0),
            Step::PayRenewal
        ]),
        2 => (0i64..72, 0usize..6).prop_map(|(h, k)| vec![Step::ToEnd(-h), Step::Tick(k)]),
        // An operator's grant in the grace, resumed, then the catalogue
        // moves and the renewal is offered.
        1 => (1i64..48, 0..n, 24i64 * 8..24 * 40, prop_oneof![Just(80i64), Just(130)]).prop_map(
            |(h, i, hours, pct)| vec![
                Step::ToEnd(-h),
                Step::Tick(0),
                Step::Give(i, hours),
                Step::Cancel(false),
                Step::Reprice(pct),
                Step::ToEnd(24 * 6),
                Step::Tick(0)
            ]
        ),
        // A rise announced, its renewal paid, a second rise before the
        // next renewal (the first notice has run its course by then or not).
        1 => (0..n, 24i64..24 * 7, 0i64..24 * 10, prop_oneof![Just(100i64), Just(160)]).prop_map(
            |(i, h, late, pct)| vec![
                Step::Pay(i),
                Step::Reprice(130),
                Step::ToEnd(h),
                Step::Tick(0),
                Step::PayRenewal,
                Step::Reprice(pct),
                Step::ToEnd(h),
                Step::Pass(late),
                Step::Tick(0),
                Step::PayRenewal,
                Step::ToEnd(h),
                Step::Tick(0)
            ]
        ),
        // A rise announced, the run ended by a refund, a new run bought
        // at the old price, its renewal offered (a notice is the run's).
        1 => (0..n, 24i64..24 * 7, 0..4usize, 1i64..24 * 40).prop_map(|(i, h, k, gap)| vec![
            Step::Pay(i),
            Step::Reprice(130),
            Step::ToEnd(h),
            Step::Tick(0),
            Step::Refund(k),
            Step::Pass(gap),
            Step::Pay(i),
            Step::ToEnd(h),
            Step::Tick(0)
        ]),
        // A plan chosen, a price move, its renewal offered, and offered
        // again after `cancel` and `resume`.
        1 => (0..n, 1..n, 24i64..24 * 7, prop_oneof![Just(80i64), Just(130), Just(160)]).prop_map(
            move |(i, other, h, pct)| vec![
                Step::Pay(i),
                Step::Change((i + other) % n),
                Step::Reprice(pct),
                Step::ToEnd(h),
                Step::Tick(0),
                Step::Cancel(true),
                Step::Cancel(false),
                Step::Tick(0)
            ]
        ),
        1 => (racer(), racer()).prop_map(|(a, b)| vec![Step::Race(Box::new(a), Box::new(b))]),
    ]
}

/// A step that can run beside another ([`races`]).
fn racer() -> impl Strategy<Value = Step> {
    prop_oneof![
        2 => (0..PLANS.len()).prop_map(Step::Pay),
        2 => (0..8usize).prop_map(Step::Refund),
        1 => (0..8usize, 1i64..100).prop_map(|(k, pct)| Step::PartialRefund(k, pct)),
        3 => (0..6usize).prop_map(Step::Tick),
        3 => Just(Step::PayRenewal),
        1 => Just(Step::PayStaleRenewal),
        1 => (0..PLANS.len()).prop_map(Step::Change),
        1 => any::<bool>().prop_map(Step::Cancel),
        1 => (0..PLANS.len(), 1i64..24 * 60).prop_map(|(i, h)| Step::Give(i, h)),
    ]
}

/// Histories run, and of them those in which a phase was scheduled (a
/// `schedule` ledger row or a waiting phase) and those in which one began
/// (a `switch` row).
static SEEN: [std::sync::atomic::AtomicUsize; 2] = [
    std::sync::atomic::AtomicUsize::new(0),
    std::sync::atomic::AtomicUsize::new(0),
];

/// The proptest seed of worker `w`: `BILLING_SEED` (default 44) plus `w`.
fn seed(w: usize) -> u64 {
    std::env::var("BILLING_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(44u64)
        + w as u64
}

/// How many histories run at once on each backend, each worker on a
/// database of its own: `BILLING_WORKERS`, by default one per core.
fn workers() -> usize {
    std::env::var("BILLING_WORKERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1)
}

/// Runs `cases` histories on `db` with a proptest runner of its own seeded
/// `seed`; the failing history, shrunk, is the error.
fn run_on(
    rt: &tokio::runtime::Runtime,
    db: &DatabaseConnection,
    seed: u64,
    cases: u32,
) -> Result<(), String> {
    let config = ProptestConfig {
        cases,
        rng_seed: RngSeed::Fixed(seed),
        max_shrink_iters: 512,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    let mut runner = TestRunner::new(config);
    let histories = (
        starts(),
        prop::collection::vec(chunk(), 1..12)
            .prop_map(|chunks| chunks.into_iter().flatten().collect::<Vec<_>>()),
    );
    runner
        .run(&histories, |(start, steps)| {
            rt.block_on(history(db, start, &steps))
        })
        .map_err(|e| e.to_string())
}

/// Runs `BILLING_CASES` histories on `backend`, split among one worker per
/// database in `dbs`, at once; panics with every worker's failing history
/// and how to run that worker alone.
fn run_all(rt: &tokio::runtime::Runtime, dbs: &[DatabaseConnection], backend: &str) {
    for seen in &SEEN {
        seen.store(0, std::sync::atomic::Ordering::Relaxed);
    }
    let per = cases().div_ceil(dbs.len() as u32);
    let failures: Vec<String> = std::thread::scope(|scope| {
        let running: Vec<_> = dbs
            .iter()
            .enumerate()
            .map(|(w, db)| (w, scope.spawn(move || run_on(rt, db, seed(w), per))))
            .collect();
        running
            .into_iter()
            .filter_map(|(w, h)| match h.join() {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(format!(
                    "worker {w} (alone: BILLING_WORKERS=1 BILLING_SEED={} BILLING_CASES={per}): {e}",
                    seed(w)
                )),
                Err(panic) => Some(format!("worker {w} panicked: {panic:?}")),
            })
            .collect()
    });
    if !failures.is_empty() {
        panic!("{backend}: {}", failures.join("\n\n"));
    }
    eprintln!(
        "{backend}: {} histories on {} workers; a phase scheduled in {}, begun in {}",
        per * dbs.len() as u32,
        dbs.len(),
        SEEN[0].load(std::sync::atomic::Ordering::Relaxed),
        SEEN[1].load(std::sync::atomic::Ordering::Relaxed)
    );
}

#[test]
fn generated_billing_histories_keep_the_money_invariant() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let n = workers();
    let sqlite: Vec<_> = (0..n).map(|_| rt.block_on(sqlite_memory())).collect();
    run_all(&rt, &sqlite, "SQLite");
    let scratches = rt.block_on(Scratch::clones(n));
    let pg: Vec<_> = scratches.iter().map(|s| s.db.clone()).collect();
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        run_all(&rt, &pg, "PostgreSQL")
    }));
    for scratch in scratches {
        rt.block_on(scratch.remove());
    }
    if let Err(e) = outcome {
        std::panic::resume_unwind(e);
    }
}
