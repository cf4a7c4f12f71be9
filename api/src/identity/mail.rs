//! The mails: magic link / code (`/otp`), recovery, resend, the
//! reauthentication nonce, and the shared sender (mail interval slot,
//! one-time token, PKCE flow, queued job).

use entity::identity::{
    account::{self, Created, NewAccount},
    flow, otp,
    otp::MailKind,
    IdentityError,
};
use uuid::Uuid;
use worker::{jobs::SendAuthEmail, Job};

use super::*;

/// How a mail treats the per-address interval ([`otp::claim_mail_slot`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Slot {
    /// Claim it; refused: 429 `over_email_send_rate_limit`.
    Claim,
    /// Claim it; refused: send nothing and answer as if sent (a sign-up,
    /// whose answer never shows the account).
    Quiet,
    /// Do not claim it (the caller did, or the mail answers one that did:
    /// the second mail of an email change, the notice of a dropped password).
    Claimed,
}

/// One mail to send ([`Idp::send_mail`]).
pub(super) struct Outgoing<'a> {
    /// The account.
    pub user_id: Uuid,
    /// Which mail (and token).
    pub kind: MailKind,
    /// The recipient as given.
    pub to: &'a str,
    /// The recipient normalised (the code is bound to it).
    pub to_norm: &'a str,
    /// `?redirect_to=`.
    pub redirect_to: Option<&'a str>,
    /// PKCE challenge and method.
    pub pkce: Option<&'a (String, flow::ChallengeMethod)>,
    /// Request id for the job's log line.
    pub request_id: Option<String>,
    /// The interval rule.
    pub slot: Slot,
    /// Replace the outstanding token of this kind (`false`: the second mail
    /// of an email change).
    pub replace: bool,
    /// The sign-up a confirmation mail is issued for, and its password hash
    /// (parked on the PKCE flow, if any).
    pub signup: Option<(Uuid, Option<String>)>,
    /// An email change's addresses (the account's current one, the new
    /// one), named in both of its mails.
    pub change: Option<(&'a str, &'a str)>,
}

impl<'a> Outgoing<'a> {
    /// A mail claiming the interval slot, replacing the outstanding token of its kind.
    pub(super) fn new(user_id: Uuid, kind: MailKind, to: &'a str, to_norm: &'a str) -> Self {
        Outgoing {
            user_id,
            kind,
            to,
            to_norm,
            redirect_to: None,
            pkce: None,
            request_id: None,
            slot: Slot::Claim,
            replace: true,
            signup: None,
            change: None,
        }
    }

    pub(super) fn redirect(mut self, r: Option<&'a str>) -> Self {
        self.redirect_to = r;
        self
    }

    pub(super) fn pkce(mut self, p: Option<&'a (String, flow::ChallengeMethod)>) -> Self {
        self.pkce = p;
        self
    }

    pub(super) fn request(mut self, id: Option<String>) -> Self {
        self.request_id = id;
        self
    }

    pub(super) fn slot(mut self, slot: Slot) -> Self {
        self.slot = slot;
        self
    }

    pub(super) fn change(mut self, current: &'a str, new: &'a str) -> Self {
        self.change = Some((current, new));
        self
    }

    pub(super) fn signup(mut self, id: Uuid, password_hash: Option<String>) -> Self {
        self.signup = Some((id, password_hash));
        self
    }
}

impl Idp {
    /// `POST /otp`: a magic link / code mail (creating the user when allowed).
    /// For an account not confirmed yet this is its newest sign-up, without a
    /// password: once the address's interval slot is claimed the pending
    /// credentials are dropped ([`account::retake_pending`]).
    pub async fn send_otp(&self, req: OtpRequest<'_>) -> Result<(), AuthApiError> {
        let (email, norm) = account::normalize_email(req.email)?;
        let pkce = flow::pkce_params(req.code_challenge, req.code_challenge_method)?;
        let meta = match req.data {
            Some(serde_json::Value::Object(m)) => serde_json::Value::Object(m.clone()),
            _ => serde_json::json!({}),
        };
        // Before anything depends on whether the address has an account.
        account::check_metadata(&meta)?;
        let existing = self
            .bounded(account::find_by_email(&self.db, &norm))
            .await??;
        let request = Uuid::new_v4();
        let (user_id, kind, slot) = match existing {
            Some(a) if a.email_confirmed_at.is_some() => {
                (a.user_id, MailKind::Magiclink, Slot::Claim)
            }
            Some(a) => {
                self.contest_pending(&norm, a.user_id, meta).await?;
                (a.user_id, MailKind::Confirmation, Slot::Claimed)
            }
            None if !req.create_user => {
                return Err(AuthApiError::new(
                    422,
                    "otp_disabled",
                    "Signups not allowed for otp",
                ))
            }
            None => {
                let grant = self.grant();
                // The code sign-up is the request that made the account: its
                // mail is issued for it ([`account::confirm_email`]).
                let created = self
                    .bounded(account::create(
                        &self.db,
                        NewAccount {
                            email: &email,
                            email_norm: &norm,
                            password_hash: None,
                            user_metadata: meta.clone(),
                            confirmed: false,
                            signup_id: Some(request),
                        },
                        &grant,
                    ))
                    .await??;
                match created {
                    Created::New(a) => (a.user_id, MailKind::Confirmation, Slot::Claim),
                    // Another request made the account between the lookup
                    // and the create (a racing sign-up): it is an existing
                    // account, handled as above, so the code sign-up
                    // contests it instead of leaving the other request's
                    // credentials uncontested.
                    Created::Existing(a) if a.email_confirmed_at.is_some() => {
                        (a.user_id, MailKind::Magiclink, Slot::Claim)
                    }
                    Created::Existing(a) => {
                        self.contest_pending(&norm, a.user_id, meta).await?;
                        (a.user_id, MailKind::Confirmation, Slot::Claimed)
                    }
                }
            }
        };
        let mut mail = Outgoing::new(user_id, kind, &email, &norm)
            .redirect(req.redirect_to)
            .pkce(pkce.as_ref())
            .request(req.request_id)
            .slot(slot);
        if kind == MailKind::Confirmation {
            mail = mail.signup(request, None);
        }
        self.send_mail(mail).await.map(|_| ())
    }

    /// A code sign-up of the pending account `user_id` at `norm`: another
    /// request touching it, so once the confirmation's interval slot is
    /// claimed the account is contested and its pre-proof credentials are
    /// dropped ([`account::retake_pending`]); no later confirmation keeps one.
    async fn contest_pending(
        &self,
        norm: &str,
        user_id: Uuid,
        meta: serde_json::Value,
    ) -> Result<(), AuthApiError> {
        self.claim_slot(norm, MailKind::Confirmation).await?;
        self.bounded(account::retake_pending(
            &self.db,
            user_id,
            None,
            meta,
            Some(account::CONTESTED),
        ))
        .await??;
        self.user_changed(user_id);
        Ok(())
    }

    /// Claims the interval slot of a `kind` mail to `norm`.
    pub(super) async fn claim_slot(&self, norm: &str, kind: MailKind) -> Result<(), AuthApiError> {
        self.bounded(otp::claim_mail_slot(
            &self.db,
            norm,
            kind,
            self.settings.auth_mail_interval_secs,
        ))
        .await??;
        Ok(())
    }

    /// `POST /recover`: a recovery mail when the account exists; `Ok` either
    /// way. The address's interval slot is claimed whether or not an account
    /// has it, so a second request within the interval answers 429 for both.
    pub async fn recover(&self, req: OtpRequest<'_>) -> Result<(), AuthApiError> {
        let (_, norm) = account::normalize_email(req.email)?;
        let pkce = flow::pkce_params(req.code_challenge, req.code_challenge_method)?;
        let acc = self
            .bounded(account::find_by_email(&self.db, &norm))
            .await??;
        self.claim_slot(&norm, MailKind::Recovery).await?;
        let Some(acc) = acc else {
            return Ok(());
        };
        self.send_mail(
            Outgoing::new(acc.user_id, MailKind::Recovery, &acc.email, &norm)
                .redirect(req.redirect_to)
                .pkce(pkce.as_ref())
                .request(req.request_id)
                .slot(Slot::Claimed),
        )
        .await
        .map(|_| ())
    }

    /// `POST /resend`: the confirmation (`signup`) or email-change mails
    /// again. A `signup` resend claims the address's slot whether or not an
    /// account has it, and is issued for the account's pending sign-up.
    pub async fn resend(
        &self,
        kind: &str,
        email: &str,
        redirect_to: Option<&str>,
        request_id: Option<String>,
    ) -> Result<(), AuthApiError> {
        let (_, norm) = account::normalize_email(email)?;
        let acc = self
            .bounded(account::find_by_email(&self.db, &norm))
            .await??;
        match kind {
            "signup" => {
                self.claim_slot(&norm, MailKind::Confirmation).await?;
                let Some(acc) = acc.filter(|a| a.email_confirmed_at.is_none()) else {
                    return Ok(());
                };
                let mut mail =
                    Outgoing::new(acc.user_id, MailKind::Confirmation, &acc.email, &norm)
                        .redirect(redirect_to)
                        .request(request_id)
                        .slot(Slot::Claimed);
                if let Some(s) = acc.signup_id.filter(|s| *s != account::CONTESTED) {
                    mail = mail.signup(s, None);
                }
                self.send_mail(mail).await.map(|_| ())
            }
            "email_change" => match acc.and_then(|a| a.email_change.clone().map(|n| (a, n))) {
                Some((acc, new)) => {
                    self.send_email_change(&acc, &new, redirect_to, None, request_id)
                        .await
                }
                None => Ok(()),
            },
            _ => Err(AuthApiError::validation(
                "type: expected signup or email_change",
            )),
        }
    }

    /// `GET /reauthenticate`: mails the signed-in user a 6-digit nonce that a
    /// password change from a session signed in more than 24 h ago needs
    /// (`PUT /user {password, nonce}`). One mail per
    /// `AUTH_MAIL_INTERVAL_SECS` (60 s).
    pub async fn reauthenticate(&self, claims: &AccessClaims) -> Result<(), AuthApiError> {
        let view = self
            .bounded(entity::identity::view::load(&self.db, claims.sub))
            .await??;
        let Some(acc) = view.account else {
            return Err(IdentityError::UserNotFound.into());
        };
        if acc.email_confirmed_at.is_none() {
            return Err(IdentityError::EmailNotConfirmed.into());
        }
        self.send_mail(Outgoing::new(
            acc.user_id,
            MailKind::Reauthentication,
            &acc.email,
            &acc.email_norm,
        ))
        .await
        .map(|_| ())
    }

    /// The two mails of an email change of `acc` to `new` (GoTrue's secure
    /// email change): one to the new address, one to the current one, both
    /// bound to this one request (its id on both tokens) and the change
    /// applies when both are verified, to the address this request named.
    /// The mail slots of both addresses are claimed before anything is
    /// written, in the transaction that writes the pending address, the
    /// stamps, the PKCE flow and both tokens: a refused request (429,
    /// 422 `email_exists`) changes nothing, and `new_email` shows only for a
    /// request whose mails go out. The request voids the earlier one's tokens.
    pub(super) async fn send_email_change(
        &self,
        acc: &entity::entities::auth_accounts::Model,
        new: &str,
        redirect_to: Option<&str>,
        pkce: Option<&(String, flow::ChallengeMethod)>,
        request_id: Option<String>,
    ) -> Result<(), AuthApiError> {
        let from = self.mail_from()?;
        let (new, new_norm) = account::normalize_email(new)?;
        let change = Uuid::new_v4();
        let txn = self.bounded(account::begin(&self.db)).await??;
        let interval = self.settings.auth_mail_interval_secs;
        // A read: 422 `email_exists` claims nothing.
        if self
            .bounded(account::find_by_email(&txn, &new_norm))
            .await??
            .is_some_and(|o| o.user_id != acc.user_id)
        {
            return Err(IdentityError::EmailExists.into());
        }
        for address in [new_norm.as_str(), acc.email_norm.as_str()] {
            self.bounded(otp::claim_mail_slot(
                &txn,
                address,
                MailKind::EmailChange,
                interval,
            ))
            .await??;
        }
        self.bounded(account::request_email_change(
            &txn,
            acc.user_id,
            &new,
            &new_norm,
        ))
        .await??;
        // The PKCE flow (if any) rides on the new address's link.
        let to_new = Outgoing::new(acc.user_id, MailKind::EmailChange, &new, &new_norm)
            .redirect(redirect_to)
            .pkce(pkce)
            .request(request_id.clone())
            .slot(Slot::Claimed)
            .signup(change, None)
            .change(&acc.email, &new);
        let mut to_current = Outgoing::new(
            acc.user_id,
            MailKind::EmailChange,
            &acc.email,
            &acc.email_norm,
        )
        .redirect(redirect_to)
        .request(request_id)
        .slot(Slot::Claimed)
        .signup(change, None)
        .change(&acc.email, &new);
        to_current.replace = false;
        let first = self.write_mail(&txn, &to_new, from.clone()).await?;
        let second = self.write_mail(&txn, &to_current, from).await?;
        self.bounded(txn.commit()).await??;
        self.user_changed(acc.user_id);
        self.push_mail(first).await?;
        self.push_mail(second).await
    }

    fn mail_from(&self) -> Result<String, AuthApiError> {
        self.settings.email_from.clone().ok_or_else(|| {
            AuthApiError::new(
                500,
                "email_address_not_authorized",
                "Error sending email: EMAIL_FROM is not configured",
            )
        })
    }

    async fn push_mail(&self, job: Job) -> Result<(), AuthApiError> {
        self.queues
            .push_within(job, self.settings.dependency_timeout)
            .await
            .map_err(|e| {
                tracing::error!(error = %e, "auth: could not queue the mail");
                AuthApiError::unavailable()
            })
            .map(|_| ())
    }

    /// Claims the interval slot (per [`Slot`]), spends the daily budget of a
    /// confirmation, issues the token and queues the mail. `Ok(false)`: held
    /// back quietly ([`Slot::Quiet`], or the day's confirmations spent),
    /// nothing sent.
    pub(super) async fn send_mail(&self, m: Outgoing<'_>) -> Result<bool, AuthApiError> {
        let from = self.mail_from()?;
        match m.slot {
            Slot::Claim => self.claim_slot(m.to_norm, m.kind).await?,
            Slot::Quiet => match self.claim_slot(m.to_norm, m.kind).await {
                Ok(()) => {}
                Err(e) if e.code == "over_email_send_rate_limit" => return Ok(false),
                Err(e) => return Err(e),
            },
            Slot::Claimed => {}
        }
        // Only a mail that goes out spends the address's daily budget of
        // confirmations; past it, the mail is held back quietly (the
        // request answers as if sent, whoever asked).
        if m.kind == MailKind::Confirmation
            && !self
                .bounded(otp::spend_daily_mail(
                    &self.db,
                    m.to_norm,
                    m.kind,
                    self.settings.auth_confirmation_mails_per_day,
                ))
                .await??
        {
            tracing::info!(user_id = %m.user_id, "auth: confirmation mail held back, AUTH_CONFIRMATION_MAILS_PER_DAY spent");
            return Ok(false);
        }
        let job = self.write_mail(&self.db, &m, from).await;
        self.user_changed(m.user_id);
        self.push_mail(job?).await?;
        Ok(true)
    }

    /// Writes what a mail needs (the account's stamp, the PKCE flow, the
    /// token) on `db` and builds its job; the slot is the caller's.
    async fn write_mail<C: sea_orm::ConnectionTrait>(
        &self,
        db: &C,
        m: &Outgoing<'_>,
        from: String,
    ) -> Result<Job, AuthApiError> {
        let verify_type = m.kind.verify_type();
        self.bounded(otp::stamp_mail_sent(db, m.user_id, m.kind))
            .await??;
        let (signup_id, password_hash) = match &m.signup {
            Some((id, hash)) => (Some(*id), hash.clone()),
            None => (None, None),
        };
        let flow_id = match m.pkce {
            Some((challenge, method)) => Some(
                self.bounded(flow::create_flow_state(
                    db,
                    flow::FlowStart {
                        provider: "email".into(),
                        code_challenge: challenge.clone(),
                        code_challenge_method: method.as_str().into(),
                        authentication_method: verify_type.into(),
                        user_id: Some(m.user_id),
                        password_hash,
                    },
                ))
                .await??,
            ),
            None => None,
        };
        let issue = otp::Issue {
            user_id: m.user_id,
            kind: m.kind,
            email_norm: m.to_norm,
            flow_state_id: flow_id,
            signup_id,
        };
        let issued = if m.replace {
            self.bounded(otp::issue(db, issue)).await??
        } else {
            self.bounded(otp::issue_another(db, issue)).await??
        };
        let redirect = self.redirect_target(m.redirect_to);
        let link_token = if flow_id.is_some() {
            format!("pkce_{}", issued.token_hash)
        } else {
            issued.token_hash.clone()
        };
        let confirmation_url = format!(
            "{}/verify?token={}&type={}&redirect_to={}",
            self.issuer,
            link_token,
            verify_type,
            urlencode(&redirect)
        );
        Ok(Job::SendAuthEmail(SendAuthEmail {
            kind: m.kind,
            from,
            to: m.to.to_string(),
            token: issued.code,
            token_hash: issued.token_hash,
            confirmation_url,
            redirect_to: redirect,
            site_url: self.settings.app_url.clone(),
            request_id: m.request_id.clone(),
            account_email: m.change.map(|(current, _)| current.to_string()),
            new_email: m.change.map(|(_, new)| new.to_string()),
        }))
    }
}
