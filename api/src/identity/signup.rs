//! `POST /signup` (GoTrue's `signup`).

use entity::identity::{
    account::{self, Created, NewAccount},
    flow,
    otp::MailKind,
    password,
};
use uuid::Uuid;

use super::{
    mail::{Outgoing, Slot},
    *,
};

impl Idp {
    /// `POST /signup`.
    ///
    /// Every sign-up of an unconfirmed address is its newest: its password
    /// replaces the pending one, and its confirmation mail is sent when the
    /// address's interval slot is free, else held back quietly. A second
    /// sign-up with another password (sent or held back) contests the
    /// account: from then on no mail's confirmation keeps a pre-proof password
    /// ([`account::confirm_email`]); the owner is signed in by the link and
    /// mailed a set-password notice, and in a PKCE flow the password waits on
    /// that flow's state for the exchange with its verifier. Repeating the
    /// same password is the same sign-up. A sent mail voids the address's
    /// earlier codes, never its links. The answer to a repeated sign-up is a
    /// look-alike built from the same clocks as a new account's (the
    /// database's, read at the same steps), after the same hashing.
    pub async fn sign_up(&self, req: SignUp<'_>) -> Result<SignUpOutcome, AuthApiError> {
        let (email, norm) = account::normalize_email(req.email)?;
        password::check_strength(req.password, self.settings.auth_password_min_length)?;
        let pkce = flow::pkce_params(req.code_challenge, req.code_challenge_method)?;
        let meta = match req.data {
            Some(serde_json::Value::Object(m)) => serde_json::Value::Object(m.clone()),
            None | Some(serde_json::Value::Null) => serde_json::json!({}),
            Some(_) => return Err(AuthApiError::validation("data must be an object")),
        };
        // Before anything depends on whether the address has an account.
        account::check_metadata(&meta)?;
        let (pw, cost) = (
            req.password.to_string(),
            self.settings.auth_password_hash_cost,
        );
        let hash = self.hashing(move || password::hash(&pw, cost)).await?;
        let autoconfirm = self.settings.auth_autoconfirm;
        let grant = self.grant();
        let signup_id = Uuid::new_v4();
        let created = self
            .bounded(account::create(
                &self.db,
                NewAccount {
                    email: &email,
                    email_norm: &norm,
                    password_hash: Some(hash.clone()),
                    user_metadata: meta.clone(),
                    confirmed: autoconfirm,
                    signup_id: Some(signup_id),
                },
                &grant,
            ))
            .await??;
        // The clock a new account's `created_at` came from, read at the same
        // step for a look-alike answer (before the hashing below, as a new
        // account's is), so the answer's times do not tell them apart.
        let lookalike_created_at = match &created {
            Created::Existing(_) if !autoconfirm => {
                Some(self.bounded(entity::base::db::now(&self.db)).await??)
            }
            _ => None,
        };
        // Whether this sign-up repeats the pending password: verified on every
        // branch (against a dummy hash when there is none to compare with), so
        // the work does not tell the branches apart.
        let pending = match &created {
            Created::Existing(a) if !autoconfirm && a.email_confirmed_at.is_none() => {
                a.password_hash.clone()
            }
            _ => None,
        };
        let (pw, has_pending) = (req.password.to_string(), pending.is_some());
        let same_password = self
            .hashing(move || match pending {
                Some(phc) => password::verify(&pw, &phc),
                None => password::verify(&pw, password::dummy_hash(cost)),
            })
            .await?
            && has_pending;
        match created {
            Created::New(acc) if autoconfirm => Ok(SignUpOutcome::Session(Box::new(
                self.issue_session(acc.user_id, "password", "email").await?,
            ))),
            Created::New(acc) => {
                let sent = self
                    .send_mail(
                        Outgoing::new(acc.user_id, MailKind::Confirmation, &email, &norm)
                            .redirect(req.redirect_to)
                            .pkce(pkce.as_ref())
                            .request(req.request_id.clone())
                            .slot(Slot::Quiet)
                            .signup(signup_id, Some(hash)),
                    )
                    .await?;
                if !sent {
                    // Held back by the address's interval (a `/resend` just
                    // claimed it): answered as sent all the same, as a known
                    // address's look-alike is, so the answer does not tell
                    // a new address from a known one.
                    self.bounded(entity::identity::otp::stamp_mail_sent(
                        &self.db,
                        acc.user_id,
                        MailKind::Confirmation,
                    ))
                    .await??;
                }
                let view = self
                    .bounded(entity::identity::view::load(&self.db, acc.user_id))
                    .await??;
                Ok(SignUpOutcome::User(Box::new(UserJson::from_view(&view))))
            }
            Created::Existing(_) if autoconfirm => Err(AuthApiError::new(
                422,
                "user_already_exists",
                "User already registered",
            )),
            Created::Existing(acc) => {
                let created_at = match lookalike_created_at {
                    Some(t) => t,
                    None => self.bounded(entity::base::db::now(&self.db)).await??,
                };
                if acc.email_confirmed_at.is_some() {
                    // A new account's mail claims the address's slot: so does
                    // this answer, sending nothing, so that the next mail to
                    // the address answers alike for both: `/resend` (a
                    // confirmation) and `/otp` (a confirmation for a new
                    // account, a magic link for a confirmed one: one slot).
                    match self.claim_slot(&norm, MailKind::Confirmation).await {
                        Ok(()) => {}
                        Err(e) if e.code == "over_email_send_rate_limit" => {}
                        Err(e) => return Err(e),
                    }
                }
                if acc.email_confirmed_at.is_none() {
                    // Which sign-up the pending password now belongs to: the
                    // same one when its password is repeated, and none at
                    // all once another request touched the pending account
                    // (a sign-up with another password, or a code sign-up or
                    // OAuth sign-in that made it, in either order): a
                    // contested account, whose confirmation keeps no
                    // pre-proof credential, whichever mail proves the mailbox.
                    let pending_id = match (acc.signup_id, acc.password_hash.is_some()) {
                        (Some(previous), true)
                            if previous != account::CONTESTED && same_password =>
                        {
                            previous
                        }
                        _ => account::CONTESTED,
                    };
                    // The mail's own sign-up id: never the contested marker.
                    let id = if pending_id == account::CONTESTED {
                        signup_id
                    } else {
                        pending_id
                    };
                    let taken = self
                        .bounded(account::retake_pending(
                            &self.db,
                            acc.user_id,
                            Some(hash.clone()),
                            meta.clone(),
                            Some(pending_id),
                        ))
                        .await??;
                    self.user_changed(acc.user_id);
                    if taken {
                        self.send_mail(
                            Outgoing::new(acc.user_id, MailKind::Confirmation, &acc.email, &norm)
                                .redirect(req.redirect_to)
                                .pkce(pkce.as_ref())
                                .request(req.request_id.clone())
                                .slot(Slot::Quiet)
                                .signup(id, Some(hash)),
                        )
                        .await?;
                    }
                }
                let sent_at = self.bounded(entity::base::db::now(&self.db)).await??;
                Ok(SignUpOutcome::User(Box::new(UserJson::decoy(
                    &email, meta, created_at, sent_at,
                ))))
            }
        }
    }
}
