//! The invariant of `identity_interleavings`, checked by SQL after every
//! step (see that module's header): a proven account keeps no attacker's
//! credential unless the owner adopted the attacker's sole sign-up, no
//! unproven account has a live attacker session, no admin account holds an
//! attacker's password or session.

use std::sync::atomic::Ordering;

use uuid::Uuid;

use crate::{
    identity_harness::rows,
    identity_interleavings::{github_id, Actor, Case, Touch, ADMIN_PROOFS, ADOPTIONS, PROOFS},
};

impl Case {
    /// The sign-ups the owner's consuming a mail in the last step may have
    /// adopted at `addr` (GoTrue's rule, as docs/identity.md states it):
    /// every request that touched the pending account was the attacker's one
    /// sign-up (the same password each time), the consumed mail was a
    /// confirmation, and the address is not an admin one. After a concurrent
    /// step, under any order its two requests may have taken (so each of
    /// them may have come before the proof or after it). None: no adoption.
    fn adoptions(&self, addr: usize) -> Vec<Touch> {
        let confirmation = self
            .consumed
            .iter()
            .any(|(kind, at)| *at == addr && kind == "confirmation");
        if self.admin[addr] || !confirmation {
            return Vec::new();
        }
        let orders = match &self.orders {
            Some(orders) => orders.as_slice(),
            None => std::slice::from_ref(&self.touches),
        };
        orders
            .iter()
            .filter_map(|o| {
                let t = &o[addr];
                match t.first()? {
                    first @ Touch::SignUp(Actor::Attacker, _) if t.iter().all(|x| x == first) => {
                        Some(first.clone())
                    }
                    first @ (Touch::Otp(Actor::Attacker) | Touch::OAuth(Actor::Attacker))
                        if t.len() == 1 =>
                    {
                        Some(first.clone())
                    }
                    _ => None,
                }
            })
            .collect()
    }

    /// The invariant, by SQL.
    pub(crate) async fn check(&mut self) {
        self.read_mailbox().await;
        let attacker_sessions: Vec<Uuid> = self
            .sessions
            .get(&Actor::Attacker)
            .map(|l| l.iter().map(|s| s.id).collect())
            .unwrap_or_default();
        for addr in 0..2 {
            let accounts = rows(
                "SELECT a.user_id, a.password_hash, a.user_metadata::text AS meta, \
                 a.email_confirmed_at IS NOT NULL AS confirmed, \
                 COALESCE(r.role, '') AS role \
                 FROM auth_accounts a LEFT JOIN user_roles r ON r.user_id = a.user_id \
                 WHERE a.email_norm = $1",
                vec![self.addrs[addr].clone().into()],
            )
            .await;
            for acc in accounts {
                let uid: Uuid = acc.try_get("", "user_id").expect("user_id");
                let hash: Option<String> = acc.try_get("", "password_hash").expect("hash");
                let meta: String = acc.try_get("", "meta").unwrap_or_default();
                let confirmed: bool = acc.try_get("", "confirmed").expect("confirmed");
                let role: String = acc.try_get("", "role").unwrap_or_default();
                let attacker_password = hash.as_deref().and_then(|h| {
                    self.attacker_passwords
                        .iter()
                        .find(|p| entity::identity::password::verify(p, h))
                        .cloned()
                });
                let live: Vec<Uuid> = rows(
                    "SELECT id FROM auth_sessions WHERE user_id = $1",
                    vec![uid.into()],
                )
                .await
                .iter()
                .map(|r| r.try_get::<Uuid>("", "id").expect("id"))
                .filter(|id| attacker_sessions.contains(id))
                .collect();
                if role == "admin" {
                    assert!(
                        attacker_password.is_none() && live.is_empty(),
                        "an admin account ({}) holds an attacker's credential: password {attacker_password:?}, \
                         live attacker sessions {live:?}\nsteps:\n{}",
                        self.addrs[addr],
                        self.log.join("\n")
                    );
                }
                if !confirmed {
                    // No sign-in has a session on an address nobody proved.
                    assert!(
                        live.is_empty(),
                        "the attacker holds a session ({live:?}) on the unproven account of {}\nsteps:\n{}",
                        self.addrs[addr],
                        self.log.join("\n")
                    );
                    continue;
                }
                let adopted = match self.proven.get(&uid) {
                    Some(a) => *a,
                    None => {
                        let adoptions = self.adoptions(addr);
                        let a = !adoptions.is_empty();
                        // The proof keeps no attacker password but the
                        // adopted sign-up's.
                        let kept = attacker_password.as_ref().is_none_or(|p| {
                            adoptions.contains(&Touch::SignUp(Actor::Attacker, p.clone()))
                        });
                        assert!(
                            !a || kept,
                            "the proof of {} adopting {adoptions:?} keeps the attacker's password \
                             {attacker_password:?}\nsteps:\n{}",
                            self.addrs[addr],
                            self.log.join("\n")
                        );
                        PROOFS.fetch_add(1, Ordering::Relaxed);
                        if self.admin[addr] {
                            ADMIN_PROOFS.fetch_add(1, Ordering::Relaxed);
                        }
                        if a {
                            ADOPTIONS.fetch_add(1, Ordering::Relaxed);
                        }
                        self.log.push(format!(
                            "first proof of {} (adopted: {a})",
                            self.addrs[addr]
                        ));
                        self.proven.insert(uid, a);
                        a
                    }
                };
                if adopted {
                    continue;
                }
                // The owner's own GitHub identity may stay; the attacker's not.
                let identities = rows(
                    "SELECT provider FROM auth_identities WHERE user_id = $1 AND provider <> 'email' \
                     AND provider_id <> $2",
                    vec![uid.into(), github_id(Actor::Owner, self.n).to_string().into()],
                )
                .await;
                let attacker_meta = meta.contains("attacker");
                assert!(
                    attacker_password.is_none()
                        && live.is_empty()
                        && !attacker_meta
                        && identities.is_empty(),
                    "the proven account of {} keeps an attacker's credential: password {attacker_password:?}, \
                     live attacker sessions {live:?}, metadata {meta}, attacker identities {}\nsteps:\n{}",
                    self.addrs[addr],
                    identities.len(),
                    self.log.join("\n")
                );
            }
        }
    }
}
