//! Concurrent steps of `identity_interleavings`: `Step::Together` runs two
//! generated steps (one per actor, or both of one actor) at once against the
//! same in-process api, as two api processes serve two requests in
//! production, and the same SQL check follows.
//!
//! How: each side runs on its own copy of the case, spawned on the test
//! runtime's two worker threads; each waits right before its request is
//! sent (`identity_harness::Release`) until the other one is there too, so
//! both requests are in flight at once; the second side then waits `lag` µs
//! more (generated, shrinking to 0), which moves the window where they
//! overlap. The copies are merged back: new sessions, passwords, touches,
//! consumed mails and log lines of both.
//!
//! Which order the two requests took is not known, so the check after the
//! step holds for every order: a proof in the step may have come before the
//! other side's touch of the pending account or after it (`Case::orders`),
//! and adoption is allowed when some order allows it (and then keeps no
//! attacker password but the adopted sign-up's).
//!
//! What is generated: a third of the steps are concurrent (`together`),
//! weighing most the pairs that race on one address: sign-up vs `/otp`,
//! sign-up vs sign-up, `/verify` vs sign-up, GitHub vs sign-up, `PUT /user`
//! email vs `/verify`, `/otp` vs `/otp`; then any two steps. While an
//! address is new (no step could have made its account yet, the reference
//! state), two of five steps race two requests that may make it
//! (`on_a_new_address`: sign-up, `/otp`, GitHub, either actor): with
//! `send_otp`'s contest of an account that appeared between its lookup and
//! its create reverted, 128 cases find it in about two runs of three (a
//! `/otp` racing a `/otp` or a sign-up, then the owner's link), and every
//! seed tried within 200 cases.

use std::{
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use proptest::prelude::*;

use crate::{
    identity_harness::{Release, RELEASE},
    identity_interleavings::{actor, request, Actor, Case, Step, Touch},
};

/// Concurrent steps run, and those whose two requests were in flight
/// together (both sides sent one).
static RACES: AtomicU64 = AtomicU64::new(0);
static BOTH_SENT: AtomicU64 = AtomicU64::new(0);

/// What the run exercised, for the test's summary.
pub(crate) fn summary() -> String {
    format!(
        "{} concurrent steps ({} with both requests in flight)",
        RACES.load(Ordering::Relaxed),
        BOTH_SENT.load(Ordering::Relaxed)
    )
}

/// A concurrent step.
pub(crate) fn together() -> BoxedStrategy<Step> {
    use Step::*;
    let addr = || 0u8..2;
    let pw = || 0u8..2;
    let pair = prop_oneof![
        // Sign-up vs `/otp` on one address.
        4 => (actor(), actor(), addr(), pw()).prop_map(|(a, b, addr, pw)| {
            (SignUp { actor: a, addr, pw }, Otp { actor: b, addr })
        }),
        // Two sign-ups (the same password or not).
        3 => (actor(), actor(), addr(), pw(), pw()).prop_map(|(a, b, addr, p, q)| {
            (SignUp { actor: a, addr, pw: p }, SignUp { actor: b, addr, pw: q })
        }),
        // The owner's proof vs a sign-up.
        3 => (addr(), any::<u8>(), 0u8..3, actor(), pw()).prop_map(|(addr, k, via, a, pw)| {
            (Verify { addr, k, via }, SignUp { actor: a, addr, pw })
        }),
        // A GitHub sign-in vs a sign-up.
        2 => (actor(), any::<bool>(), actor(), addr(), pw()).prop_map(|(a, v, b, addr, pw)| {
            let verified = v && a == Actor::Owner;
            (OAuth { actor: a, addr, verified }, SignUp { actor: b, addr, pw })
        }),
        // An email change vs the owner's proof of the new address.
        2 => (actor(), any::<u8>(), addr(), any::<u8>(), 0u8..3).prop_map(|(a, s, addr, k, via)| {
            (UpdateEmail { actor: a, s, addr }, Verify { addr, k, via })
        }),
        // `/otp` vs a proof, `/otp` vs `/otp`, `/otp` vs GitHub, two proofs.
        1 => (addr(), any::<u8>(), 0u8..3, actor()).prop_map(|(addr, k, via, a)| {
            (Verify { addr, k, via }, Otp { actor: a, addr })
        }),
        2 => (actor(), actor(), addr()).prop_map(|(a, b, addr)| {
            (Otp { actor: a, addr }, Otp { actor: b, addr })
        }),
        1 => (actor(), any::<bool>(), actor(), addr()).prop_map(|(a, v, b, addr)| {
            let verified = v && a == Actor::Owner;
            (OAuth { actor: a, addr, verified }, Otp { actor: b, addr })
        }),
        1 => (addr(), any::<u8>(), any::<u8>(), 0u8..3, 0u8..3).prop_map(|(addr, k, l, v, w)| {
            (Verify { addr, k, via: v }, Verify { addr, k: l, via: w })
        }),
        // Any two.
        3 => (request(), request()),
    ];
    (pair, any::<bool>(), lag())
        .prop_map(|((a, b), swap, lag)| {
            let (a, b) = if swap { (b, a) } else { (a, b) };
            Step::Together(Box::new(a), Box::new(b), lag)
        })
        .boxed()
}

/// A race of two requests that may make the account of a new address
/// (sign-up, `/otp`, GitHub sign-in; either actor): the race most likely
/// to find a request that took the account another one made meanwhile for
/// a new one. None when no address is new.
pub(crate) fn on_a_new_address(new: [bool; 2]) -> Option<BoxedStrategy<Step>> {
    use Step::*;
    let addrs: Vec<u8> = (0u8..2).filter(|a| new[*a as usize]).collect();
    if addrs.is_empty() {
        return None;
    }
    let maker = |addr: u8| {
        prop_oneof![
            (actor(), 0u8..2).prop_map(move |(actor, pw)| SignUp { actor, addr, pw }),
            actor().prop_map(move |actor| Otp { actor, addr }),
            (actor(), any::<bool>()).prop_map(move |(actor, v)| OAuth {
                actor,
                addr,
                verified: v && actor == Actor::Owner,
            }),
        ]
    };
    let race = proptest::sample::select(addrs)
        .prop_flat_map(move |addr| (maker(addr), maker(addr), lag()))
        .prop_map(|(a, b, lag)| Step::Together(Box::new(a), Box::new(b), lag));
    Some(race.boxed())
}

/// The lag of a concurrent step's second request: none mostly (the
/// requests sent together), else up to 3 ms.
fn lag() -> impl Strategy<Value = u16> {
    prop_oneof![3 => Just(0u16), 1 => 1u16..3000]
}

/// Runs `first` and `second` at once on copies of `case` and merges them
/// back (see the module's header).
pub(crate) async fn run(mut case: Case, first: &Step, second: &Step, lag_us: u16) -> Case {
    RACES.fetch_add(1, Ordering::Relaxed);
    let together = Arc::new(tokio::sync::Barrier::new(2));
    let side = |step: &Step, lag: Duration| {
        let release = Release {
            together: together.clone(),
            passed: Arc::new(AtomicBool::new(false)),
            lag,
        };
        let (mut copy, step) = (case.clone(), step.clone());
        copy.log.clear();
        tokio::spawn(RELEASE.scope(release.clone(), async move {
            copy.run(&step).await;
            // A side that sent no request (no session, no mail) passes now.
            let sent = !release.pass().await;
            (copy, sent)
        }))
    };
    let a = side(first, Duration::ZERO);
    let b = side(second, Duration::from_micros(lag_us.into()));
    let aborts = [a.abort_handle(), b.abort_handle()];
    let ((a, a_sent), (b, b_sent)) = match tokio::try_join!(a, b) {
        Ok(sides) => sides,
        Err(e) => {
            aborts.iter().for_each(|h| h.abort());
            std::panic::resume_unwind(e.into_panic())
        }
    };
    if a_sent && b_sent {
        BOTH_SENT.fetch_add(1, Ordering::Relaxed);
    }
    merge(&mut case, a, b);
    case.log.push(format!(
        "  (together, the second {lag_us} µs later: {first:?} | {second:?})"
    ));
    case
}

/// Merges both sides' copies into `case` (what each added to it).
fn merge(case: &mut Case, a: Case, b: Case) {
    for actor in [Actor::Owner, Actor::Attacker] {
        let had = case.sessions.get(&actor).map_or(0, Vec::len);
        for side in [&a, &b] {
            if let Some(list) = side.sessions.get(&actor) {
                let new = list[had..].iter().cloned();
                case.sessions.entry(actor).or_default().extend(new);
            }
        }
    }
    for side in [&a, &b] {
        case.attacker_passwords
            .extend(side.attacker_passwords.iter().cloned());
        case.consumed.extend(side.consumed.iter().cloned());
        case.log
            .extend(side.log.iter().map(|line| format!("  | {line}")));
    }
    // Each side's touches went after what the case had; the proof (if one
    // side proved the address) came before the other side's touch or after.
    let base = case.touches.clone();
    let mut added: [[Vec<Touch>; 2]; 2] = [&a, &b]
        .map(|side| std::array::from_fn(|addr| side.touches[addr][base[addr].len()..].to_vec()));
    // Two GitHub sign-ins of one account both answer that they mailed a
    // confirmation, but only one made the pending account.
    let [first, second] = &mut added;
    for (first, second) in first.iter().zip(second.iter_mut()) {
        second.retain(|t| !(matches!(t, Touch::OAuth(_)) && first.contains(t)));
    }
    let order = |sides: &[usize]| -> [Vec<Touch>; 2] {
        std::array::from_fn(|addr| {
            let mut t = base[addr].clone();
            for &side in sides {
                t.extend(added[side][addr].iter().cloned());
            }
            t
        })
    };
    case.touches = order(&[0, 1]);
    case.orders = Some(vec![
        order(&[]),
        order(&[0]),
        order(&[1]),
        order(&[0, 1]),
        order(&[1, 0]),
    ]);
}
