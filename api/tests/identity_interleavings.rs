//! Generated interleavings of the identity routes: a stateful property
//! test of the invariant of
//! `docs/identity.md` ("The invariant"): when the owner of a mailbox first
//! proves it, the account is theirs alone.
//!
//! Two actors, the owner and an attacker, over two fresh addresses per case:
//! one plain, one listed in `ADMIN_EMAILS`. The steps (`Step`) are sign-up
//! with a password (each actor has two passwords of its own), `/otp` (code
//! sign-up / magic link), `/resend`, `/recover`, `/verify` with the k-th mail
//! the owner's mailbox holds (by link `token_hash` or by code, resolved when
//! the step runs), password sign-in, refresh, logout (every scope),
//! `PUT /user` password / data / email, and GitHub sign-ins through a fake
//! GitHub (the owner's account verified or not, the attacker's never
//! verified). The attacker never reads the mailbox. A third of the steps
//! (more while an address is new) are two of these at once
//! (`Step::Together`, `identity_concurrent`): both requests in flight
//! together, as two api processes serve them.
//!
//! The real api runs in process (`identity_harness`: `api::app::app` on
//! `api::app::build_state`, a fresh PostgreSQL database, the queued
//! `send_auth_email` jobs as the mailbox, no worker). Time:
//! `AUTH_MAIL_INTERVAL_SECS=0` (no interval window blocks a mail, so the
//! held-back sign-up is not exercised); the per-IP limits are raised out of
//! the way; passwords hashed at a test-only argon2 cost.
//!
//! After every step, by SQL only (no sign-in probes, `identity_invariant`):
//! for every account whose address has been proven, unless the owner
//! legitimately adopted the attacker's sole sign-up (GoTrue's rule, never for
//! an `ADMIN_EMAILS` address; then the proof keeps no attacker password but
//! that sign-up's), the password hash verifies none of the attacker's
//! passwords, no session the attacker holds is alive on it, its
//! `user_metadata` carries nothing the attacker wrote, and it has no identity
//! of the attacker's; no account whose address nobody proved has a live
//! attacker session; and no account with a live attacker session or an
//! attacker's password is admin. After a concurrent step the check holds
//! for every order the two requests may have taken.
//!
//! Cases: `PROPTEST_CASES` (default 128, ~25 s here), seed `PROPTEST_RNG_SEED` (default
//! fixed, 43). Failing cases shrink and are kept in
//! `api/proptest-regressions/identity_interleavings.txt`.
//! Run: `TEST_DATABASE_ADMIN_URL=postgres://postgres@127.0.0.1:5432/postgres
//! cargo test -p api --test suite identity_interleavings`.

use std::{
    collections::{HashMap, HashSet},
    sync::atomic::{AtomicU64, Ordering},
};

use base64::{engine::general_purpose::URL_SAFE_NO_PAD, Engine as _};
use poem::http::{Method, StatusCode};
use proptest::{
    prelude::*,
    test_runner::{Config as ProptestConfig, FileFailurePersistence, RngSeed, TestRunner},
};
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest};
use sea_orm::{ConnectionTrait, Database};
use serde_json::{json, Value};
use uuid::Uuid;

use crate::{identity_concurrent, identity_harness::*};

/// What the run exercised (printed at the end).
static STEPS: AtomicU64 = AtomicU64::new(0);
pub(crate) static PROOFS: AtomicU64 = AtomicU64::new(0);
pub(crate) static ADMIN_PROOFS: AtomicU64 = AtomicU64::new(0);
pub(crate) static ADOPTIONS: AtomicU64 = AtomicU64::new(0);
static VERIFIED: AtomicU64 = AtomicU64::new(0);
static ATTACKER_SESSIONS: AtomicU64 = AtomicU64::new(0);
static OAUTH_STEPS: AtomicU64 = AtomicU64::new(0);
static OAUTH_SESSIONS: AtomicU64 = AtomicU64::new(0);

// ---------------------------------------------------------------- GitHub

/// The GitHub account id of `actor` in case `n` (unique per case: an
/// identity links by provider and id across the whole database).
pub(crate) fn github_id(actor: Actor, n: u64) -> u64 {
    1_000_000 + 2 * n + u64::from(actor == Actor::Attacker)
}

// ---------------------------------------------------------------- steps

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Actor {
    Owner,
    Attacker,
}

#[derive(Debug, Clone)]
pub(crate) enum Step {
    /// `POST /signup` with the actor's `pw`-th password and data naming it.
    SignUp { actor: Actor, addr: u8, pw: u8 },
    /// `POST /otp` (`create_user: true`): a code sign-up or a magic link.
    Otp { actor: Actor, addr: u8 },
    /// `POST /resend {type: signup}`.
    Resend { actor: Actor, addr: u8 },
    /// `POST /recover`.
    Recover { actor: Actor, addr: u8 },
    /// The owner uses the k-th mail to `addr`: `via` 0 types its code, 1
    /// posts its `token_hash`, 2 opens its link (`GET /verify`).
    Verify { addr: u8, k: u8, via: u8 },
    /// `POST /token?grant_type=password` with the actor's `pw`-th password.
    SignIn { actor: Actor, addr: u8, pw: u8 },
    /// `POST /token?grant_type=refresh_token` with the s-th session's token.
    Refresh { actor: Actor, s: u8 },
    /// `POST /logout?scope=…` with the s-th session.
    Logout { actor: Actor, s: u8, scope: u8 },
    /// `PUT /user {password}` with a new password of the actor's.
    UpdatePassword { actor: Actor, s: u8, pw: u8 },
    /// `PUT /user {data}` naming the actor.
    UpdateData { actor: Actor, s: u8 },
    /// `PUT /user {email}`.
    UpdateEmail { actor: Actor, s: u8, addr: u8 },
    /// A GitHub sign-in (implicit flow) through the fake GitHub whose
    /// account (one per actor) reports the address as its primary one:
    /// verified for the owner when `verified`, never verified for the
    /// attacker (no provider verifies an address for someone who does not
    /// own it).
    OAuth {
        actor: Actor,
        addr: u8,
        verified: bool,
    },
    /// Time passes: every timestamp of the identity tables moves back by
    /// `secs` (61 s, an hour and a second: the mailed tokens' lifetime, 25 h:
    /// past the reauthentication age).
    Wait { secs: u32 },
    /// Two of the steps above at once (never `Wait`): both requests are
    /// released together, the second `lag_us` µs later
    /// (`identity_concurrent`).
    Together(Box<Step>, Box<Step>, u16),
}

pub(crate) fn actor() -> impl Strategy<Value = Actor> {
    prop_oneof![Just(Actor::Owner), Just(Actor::Attacker)]
}

/// A sequential step.
fn step() -> BoxedStrategy<Step> {
    prop_oneof![
        25 => request(),
        1 => prop_oneof![Just(61u32), Just(3601), Just(90_000)].prop_map(|secs| Step::Wait { secs }),
    ]
    .boxed()
}

/// A step that sends a request (every step but `Wait` and `Together`).
pub(crate) fn request() -> BoxedStrategy<Step> {
    let addr = 0u8..2;
    prop_oneof![
        4 => (actor(), addr.clone(), 0u8..2).prop_map(|(actor, addr, pw)| Step::SignUp { actor, addr, pw }),
        2 => (actor(), addr.clone()).prop_map(|(actor, addr)| Step::Otp { actor, addr }),
        2 => (actor(), addr.clone()).prop_map(|(actor, addr)| Step::Resend { actor, addr }),
        1 => (actor(), addr.clone()).prop_map(|(actor, addr)| Step::Recover { actor, addr }),
        5 => (addr.clone(), any::<u8>(), 0u8..3).prop_map(|(addr, k, via)| Step::Verify { addr, k, via }),
        3 => (actor(), addr.clone(), 0u8..3).prop_map(|(actor, addr, pw)| Step::SignIn { actor, addr, pw }),
        1 => (actor(), any::<u8>()).prop_map(|(actor, s)| Step::Refresh { actor, s }),
        1 => (actor(), any::<u8>(), 0u8..3).prop_map(|(actor, s, scope)| Step::Logout { actor, s, scope }),
        2 => (actor(), any::<u8>(), 0u8..2).prop_map(|(actor, s, pw)| Step::UpdatePassword { actor, s, pw }),
        1 => (actor(), any::<u8>()).prop_map(|(actor, s)| Step::UpdateData { actor, s }),
        1 => (actor(), any::<u8>(), addr.clone()).prop_map(|(actor, s, addr)| Step::UpdateEmail { actor, s, addr }),
        2 => (actor(), addr, any::<bool>()).prop_map(|(actor, addr, v)| Step::OAuth {
            actor,
            addr,
            verified: v && actor == Actor::Owner,
        }),
    ]
    .boxed()
}

/// The reference machine holds only which addresses no step could have
/// made an account at yet (races on a new address are generated more
/// often while there is one); every step is resolved against the real
/// system when it runs (which mail, which session).
struct Steps;

impl ReferenceStateMachine for Steps {
    /// Per address: whether it is new.
    type State = [bool; 2];
    type Transition = Step;

    fn init_state() -> BoxedStrategy<[bool; 2]> {
        Just([true, true]).boxed()
    }

    fn transitions(new: &[bool; 2]) -> BoxedStrategy<Step> {
        match identity_concurrent::on_a_new_address(*new) {
            Some(race) => prop_oneof![
                2 => step(),
                1 => identity_concurrent::together(),
                2 => race,
            ]
            .boxed(),
            None => prop_oneof![2 => step(), 1 => identity_concurrent::together()].boxed(),
        }
    }

    fn apply(mut new: [bool; 2], step: &Step) -> Self::State {
        match step {
            Step::SignUp { addr, .. }
            | Step::Otp { addr, .. }
            | Step::OAuth { addr, .. }
            | Step::UpdateEmail { addr, .. } => new[*addr as usize] = false,
            Step::Together(a, b, _) => new = Self::apply(Self::apply(new, a), b),
            _ => {}
        }
        new
    }
}

// ---------------------------------------------------------------- one case

#[derive(Debug, Clone)]
pub(crate) struct Session {
    access: String,
    refresh: String,
    pub(crate) id: Uuid,
}

/// A request that touched a pending account (sign-up, code sign-up, or the
/// unverified OAuth sign-in that made it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Touch {
    SignUp(Actor, String),
    Otp(Actor),
    /// An unverified OAuth sign-in that made the pending account.
    OAuth(Actor),
}

#[derive(Clone)]
pub(crate) struct Case {
    pub(crate) n: u64,
    /// `[plain, admin]` (the admin one plain too past [`admin_slots`]).
    pub(crate) addrs: [String; 2],
    pub(crate) admin: [bool; 2],
    /// The owner's mailbox: every mail queued to the case's addresses.
    mails: Vec<Mail>,
    /// The queue's rows read so far.
    last_rowid: i64,
    pub(crate) sessions: HashMap<Actor, Vec<Session>>,
    /// Every password the attacker chose.
    pub(crate) attacker_passwords: HashSet<String>,
    /// Requests that touched each address's pending account, in order.
    pub(crate) touches: [Vec<Touch>; 2],
    /// After a concurrent step: the touches each address's pending account
    /// may have had when the step's proof came, one per order the two
    /// requests may have taken (else only `touches`).
    pub(crate) orders: Option<Vec<[Vec<Touch>; 2]>>,
    /// Accounts seen proven: whether the owner legitimately adopted the
    /// attacker's sole sign-up there (then the attacker is not checked on it).
    pub(crate) proven: HashMap<Uuid, bool>,
    /// The kind of each mail the last step's successful verifies consumed
    /// (one, or two at once), and to which address.
    pub(crate) consumed: Vec<(String, usize)>,
    pub(crate) log: Vec<String>,
}

pub(crate) fn password(actor: Actor, n: u64, pw: u8) -> String {
    match actor {
        Actor::Owner => format!("owner-{n}-pass-{pw}"),
        Actor::Attacker => format!("attacker-{n}-pass-{pw}"),
    }
}

pub(crate) fn new_password(actor: Actor, n: u64, pw: u8) -> String {
    match actor {
        Actor::Owner => format!("owner-{n}-new-{pw}"),
        Actor::Attacker => format!("attacker-{n}-new-{pw}"),
    }
}

fn tag(actor: Actor) -> &'static str {
    match actor {
        Actor::Owner => "owner",
        Actor::Attacker => "attacker",
    }
}

fn verify_type(kind: &str) -> Option<&'static str> {
    match kind {
        "confirmation" => Some("signup"),
        "magiclink" => Some("magiclink"),
        "recovery" | "password_notice" => Some("recovery"),
        "email_change" => Some("email_change"),
        _ => None,
    }
}

fn session_of(body: &Value) -> Option<Session> {
    let access = body.get("access_token")?.as_str()?.to_string();
    let refresh = body.get("refresh_token")?.as_str()?.to_string();
    let payload = access.split('.').nth(1)?;
    let claims: Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).ok()?).ok()?;
    let id = claims.get("session_id")?.as_str()?.parse().ok()?;
    Some(Session {
        access,
        refresh,
        id,
    })
}

impl Case {
    fn new() -> Self {
        let n = env().next_case.fetch_add(1, Ordering::Relaxed);
        let run = std::process::id();
        let plain = format!("v{run}x{n}@example.com");
        let (admin_addr, admin) = if n < admin_slots() {
            (admin_address(n), true)
        } else {
            (format!("w{run}x{n}@example.com"), false)
        };
        Case {
            n,
            addrs: [plain, admin_addr],
            admin: [false, admin],
            mails: Vec::new(),
            last_rowid: 0,
            sessions: HashMap::new(),
            attacker_passwords: HashSet::new(),
            touches: [Vec::new(), Vec::new()],
            orders: None,
            proven: HashMap::new(),
            consumed: Vec::new(),
            log: Vec::new(),
        }
    }

    /// Reads the mails queued since the last read.
    pub(crate) async fn read_mailbox(&mut self) {
        let new = mails_since(&mut self.last_rowid, &self.addrs).await;
        self.mails.extend(new);
    }

    /// Whether `addr` has an account.
    async fn exists(&self, addr: usize) -> bool {
        !rows(
            "SELECT 1 FROM auth_accounts WHERE email_norm = $1",
            vec![self.addrs[addr].clone().into()],
        )
        .await
        .is_empty()
    }

    /// Whether `addr` has a confirmed account.
    async fn confirmed(&self, addr: usize) -> bool {
        !rows(
            "SELECT 1 FROM auth_accounts WHERE email_norm = $1 AND email_confirmed_at IS NOT NULL",
            vec![self.addrs[addr].clone().into()],
        )
        .await
        .is_empty()
    }

    fn session(&self, actor: Actor, s: u8) -> Option<Session> {
        let list = self.sessions.get(&actor)?;
        (!list.is_empty()).then(|| list[s as usize % list.len()].clone())
    }

    fn keep(&mut self, actor: Actor, a: &Answer) {
        if a.status == StatusCode::OK {
            if let Some(s) = session_of(&a.body) {
                if actor == Actor::Attacker {
                    ATTACKER_SESSIONS.fetch_add(1, Ordering::Relaxed);
                }
                self.sessions.entry(actor).or_default().push(s);
            }
        }
    }

    /// Runs a sequential step (a concurrent one runs two of these at once).
    pub(crate) async fn run(&mut self, step: &Step) {
        let n = self.n;
        let note = match step.clone() {
            Step::SignUp { actor, addr, pw } => {
                let addr = addr as usize;
                let p = password(actor, n, pw);
                if actor == Actor::Attacker {
                    self.attacker_passwords.insert(p.clone());
                }
                if !self.confirmed(addr).await {
                    self.touches[addr].push(Touch::SignUp(actor, p.clone()));
                }
                let a = call(
                    Method::POST,
                    "/auth/v1/signup",
                    None,
                    Some(json!({"email": self.addrs[addr], "password": p, "data": {"by": tag(actor)}})),
                )
                .await;
                self.keep(actor, &a);
                a.status
            }
            Step::Otp { actor, addr } => {
                let addr = addr as usize;
                let pending = !self.confirmed(addr).await;
                let a = call(
                    Method::POST,
                    "/auth/v1/otp",
                    None,
                    Some(json!({"email": self.addrs[addr], "create_user": true, "data": {"by": tag(actor)}})),
                )
                .await;
                // A refused one touches nothing: a 429 when a racing
                // request's mail claimed the address's slot first (even
                // with no interval, one of two claims at once wins).
                if pending && a.status == StatusCode::OK {
                    self.touches[addr].push(Touch::Otp(actor));
                }
                a.status
            }
            Step::Resend { actor, addr } => {
                // Both actors send the same request (one client address).
                let _ = actor;
                call(
                    Method::POST,
                    "/auth/v1/resend",
                    None,
                    Some(json!({"type": "signup", "email": self.addrs[addr as usize]})),
                )
                .await
                .status
            }
            Step::Recover { actor, addr } => {
                let _ = actor;
                call(
                    Method::POST,
                    "/auth/v1/recover",
                    None,
                    Some(json!({"email": self.addrs[addr as usize]})),
                )
                .await
                .status
            }
            Step::Verify { addr, k, via } => {
                let addr_i = addr as usize;
                let to = self.addrs[addr_i].clone();
                let mine: Vec<Mail> = self
                    .mails
                    .iter()
                    .filter(|m| m.to == to && verify_type(&m.kind).is_some())
                    .cloned()
                    .collect();
                if mine.is_empty() {
                    self.log.push(format!("{step:?} -> no mail"));
                    return;
                }
                let m = &mine[k as usize % mine.len()];
                let ty = verify_type(&m.kind).expect("filtered");
                let a = match via {
                    0 => {
                        let body = json!({"type": ty, "email": to, "token": m.token});
                        call(Method::POST, "/auth/v1/verify", None, Some(body)).await
                    }
                    1 => {
                        let body = json!({"type": ty, "token_hash": m.token_hash});
                        call(Method::POST, "/auth/v1/verify", None, Some(body)).await
                    }
                    _ => open_link(&m.url).await,
                };
                if a.status == StatusCode::OK {
                    VERIFIED.fetch_add(1, Ordering::Relaxed);
                    self.consumed.push((m.kind.clone(), addr_i));
                }
                self.keep(Actor::Owner, &a);
                self.log
                    .push(format!("{step:?} -> mail {} ({})", m.kind, a.status));
                return;
            }
            Step::SignIn { actor, addr, pw } => {
                let p = if pw == 2 {
                    new_password(actor, n, 0)
                } else {
                    password(actor, n, pw)
                };
                let a = call(
                    Method::POST,
                    "/auth/v1/token?grant_type=password",
                    None,
                    Some(json!({"email": self.addrs[addr as usize], "password": p})),
                )
                .await;
                self.keep(actor, &a);
                a.status
            }
            Step::Refresh { actor, s } => {
                let Some(sess) = self.session(actor, s) else {
                    self.log.push(format!("{step:?} -> no session"));
                    return;
                };
                let a = call(
                    Method::POST,
                    "/auth/v1/token?grant_type=refresh_token",
                    None,
                    Some(json!({"refresh_token": sess.refresh})),
                )
                .await;
                self.keep(actor, &a);
                a.status
            }
            Step::Logout { actor, s, scope } => {
                let Some(sess) = self.session(actor, s) else {
                    self.log.push(format!("{step:?} -> no session"));
                    return;
                };
                let scope = ["global", "local", "others"][scope as usize % 3];
                call(
                    Method::POST,
                    &format!("/auth/v1/logout?scope={scope}"),
                    Some(&sess.access),
                    None,
                )
                .await
                .status
            }
            Step::UpdatePassword { actor, s, pw } => {
                let Some(sess) = self.session(actor, s) else {
                    self.log.push(format!("{step:?} -> no session"));
                    return;
                };
                let p = new_password(actor, n, pw);
                if actor == Actor::Attacker {
                    self.attacker_passwords.insert(p.clone());
                }
                call(
                    Method::PUT,
                    "/auth/v1/user",
                    Some(&sess.access),
                    Some(json!({"password": p})),
                )
                .await
                .status
            }
            Step::UpdateData { actor, s } => {
                let Some(sess) = self.session(actor, s) else {
                    self.log.push(format!("{step:?} -> no session"));
                    return;
                };
                call(
                    Method::PUT,
                    "/auth/v1/user",
                    Some(&sess.access),
                    Some(json!({"data": {"by": tag(actor)}})),
                )
                .await
                .status
            }
            Step::UpdateEmail { actor, s, addr } => {
                let Some(sess) = self.session(actor, s) else {
                    self.log.push(format!("{step:?} -> no session"));
                    return;
                };
                call(
                    Method::PUT,
                    "/auth/v1/user",
                    Some(&sess.access),
                    Some(json!({"email": self.addrs[addr as usize]})),
                )
                .await
                .status
            }
            Step::OAuth {
                actor,
                addr,
                verified,
            } => {
                let addr = addr as usize;
                let existed = self.exists(addr).await;
                let linked = !rows(
                    "SELECT 1 FROM auth_identities WHERE provider = 'github' AND provider_id = $1",
                    vec![github_id(actor, n).to_string().into()],
                )
                .await
                .is_empty();
                let a = github_sign_in(github_id(actor, n), &self.addrs[addr], verified).await;
                OAUTH_STEPS.fetch_add(1, Ordering::Relaxed);
                if a.status == StatusCode::OK {
                    OAUTH_SESSIONS.fetch_add(1, Ordering::Relaxed);
                }
                // It made the pending account when it mailed a confirmation
                // for an address without one and a GitHub account not linked
                // yet (not when a racing sign-up made it: then it is refused).
                let mailed = a.body["error_description"]
                    .as_str()
                    .is_some_and(|d| d.contains("has been sent"));
                if !existed && !verified && !linked && mailed {
                    self.touches[addr].push(Touch::OAuth(actor));
                }
                self.keep(actor, &a);
                a.status
            }
            Step::Wait { secs } => {
                age(secs, &self.addrs).await;
                StatusCode::OK
            }
            Step::Together(..) => unreachable!("run by identity_concurrent::run"),
        };
        self.log.push(format!("{step:?} -> {note}"));
    }
}

// ---------------------------------------------------------------- the test

struct Interleavings;

impl StateMachineTest for Interleavings {
    type SystemUnderTest = Case;
    type Reference = Steps;

    fn init_test(_: &[bool; 2]) -> Case {
        Case::new()
    }

    fn teardown(case: Case, _: [bool; 2]) {
        if std::env::var_os("IDENTITY_PROP_LOG").is_some() {
            eprintln!("case {}:\n{}\n", case.n, case.log.join("\n"));
        }
    }

    fn apply(mut case: Case, _: &[bool; 2], step: Step) -> Case {
        STEPS.fetch_add(1, Ordering::Relaxed);
        case.consumed.clear();
        case.orders = None;
        env().rt.block_on(async move {
            case.read_mailbox().await;
            let mut case = match &step {
                Step::Together(first, second, lag) => {
                    identity_concurrent::run(case, first, second, *lag).await
                }
                step => {
                    case.run(step).await;
                    case
                }
            };
            case.check().await;
            case
        })
    }
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: cases(),
        rng_seed: RngSeed::Fixed(seed()),
        max_shrink_iters: 2048,
        // Relative to the package (cargo runs tests in `api/`).
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "proptest-regressions/identity_interleavings.txt",
        ))),
        ..ProptestConfig::default()
    }
}

/// The invariant over generated interleavings of both actors' steps. A
/// failing case is shrunk and kept in
/// `api/proptest-regressions/identity_interleavings.txt` (replayed first on
/// every later run).
#[test]
fn identity_interleavings() {
    let mut config = config();
    config.source_file = Some(file!());
    let mut runner = TestRunner::new(config.clone());
    let started = std::time::Instant::now();
    let result = runner.run(&Steps::sequential_strategy(1..24), |(init, steps, seen)| {
        Interleavings::test_sequential(config.clone(), init, steps, seen);
        Ok(())
    });
    eprintln!(
        "identity_interleavings: {} cases, seed {}, {:.1?}: {} steps, {} verifies accepted, \
         {} first proofs ({} of an ADMIN_EMAILS address, {} adopting the attacker's sole sign-up), \
         {} sessions obtained by the attacker, {} GitHub sign-ins ({} with a session); {}",
        cases(),
        seed(),
        started.elapsed(),
        STEPS.load(Ordering::Relaxed),
        VERIFIED.load(Ordering::Relaxed),
        PROOFS.load(Ordering::Relaxed),
        ADMIN_PROOFS.load(Ordering::Relaxed),
        ADOPTIONS.load(Ordering::Relaxed),
        ATTACKER_SESSIONS.load(Ordering::Relaxed),
        OAUTH_STEPS.load(Ordering::Relaxed),
        OAUTH_SESSIONS.load(Ordering::Relaxed),
        identity_concurrent::summary(),
    );
    let env = env();
    env.rt.block_on(async {
        if let Ok(admin) = Database::connect(&env.admin_url).await {
            let _ = admin
                .execute_unprepared(&format!(
                    "DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)",
                    env.name
                ))
                .await;
        }
    });
    let _ = std::fs::remove_dir_all(std::env::temp_dir().join(format!("prop-{}", env.name)));
    if let Err(e) = result {
        panic!("{e}");
    }
}
