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
    /// Claim the one-mail-per-interval slot (`AUTH_MAIL_INTERVAL_SECS`;
    /// `false`: stamp it only, the caller claimed it or the per-IP limits
    /// bound this mail).
    pub throttle: bool,
    /// Replace the outstanding token of this kind (`false`: the second mail
    /// of an email change).
    pub replace: bool,
}

impl<'a> Outgoing<'a> {
    /// A throttled mail replacing the outstanding token of its kind.
    pub(super) fn new(user_id: Uuid, kind: MailKind, to: &'a str, to_norm: &'a str) -> Self {
        Outgoing {
            user_id,
            kind,
            to,
            to_norm,
            redirect_to: None,
            pkce: None,
            request_id: None,
            throttle: true,
            replace: true,
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
}

impl Idp {
    /// `POST /otp`: a magic link / code mail (creating the user when allowed).
    /// For an account not confirmed yet this is its newest sign-up: the
    /// pending credentials and every earlier link and code are voided
    /// ([`account::retake_pending`]) once the interval slot is claimed.
    pub async fn send_otp(&self, req: OtpRequest<'_>) -> Result<(), AuthApiError> {
        let (email, norm) = account::normalize_email(req.email)?;
        let pkce = flow::pkce_params(req.code_challenge, req.code_challenge_method)?;
        let meta = match req.data {
            Some(serde_json::Value::Object(m)) => serde_json::Value::Object(m.clone()),
            _ => serde_json::json!({}),
        };
        let existing = self
            .bounded(account::find_by_email(&self.db, &norm))
            .await??;
        let (user_id, kind, throttle) = match existing {
            Some(a) if a.email_confirmed_at.is_some() => (a.user_id, MailKind::Magiclink, true),
            Some(a) => {
                self.bounded(otp::claim_mail_slot(
                    &self.db,
                    a.user_id,
                    MailKind::Confirmation,
                    self.settings.auth_mail_interval_secs,
                ))
                .await??;
                self.bounded(account::retake_pending(&self.db, a.user_id, None, meta))
                    .await??;
                self.user_changed(a.user_id);
                (a.user_id, MailKind::Confirmation, false)
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
                let created = self
                    .bounded(account::create(
                        &self.db,
                        NewAccount {
                            email: &email,
                            email_norm: &norm,
                            password_hash: None,
                            user_metadata: meta,
                            confirmed: false,
                        },
                        &grant,
                    ))
                    .await??;
                let a = match created {
                    Created::New(a) | Created::Existing(a) => a,
                };
                (a.user_id, MailKind::Confirmation, true)
            }
        };
        let mut mail = Outgoing::new(user_id, kind, &email, &norm)
            .redirect(req.redirect_to)
            .pkce(pkce.as_ref())
            .request(req.request_id);
        mail.throttle = throttle;
        self.send_mail(mail).await
    }

    /// `POST /recover`: a recovery mail when the account exists; `Ok` either way
    /// (except the mail interval rule).
    pub async fn recover(&self, req: OtpRequest<'_>) -> Result<(), AuthApiError> {
        let (_, norm) = account::normalize_email(req.email)?;
        let pkce = flow::pkce_params(req.code_challenge, req.code_challenge_method)?;
        let Some(acc) = self
            .bounded(account::find_by_email(&self.db, &norm))
            .await??
        else {
            return Ok(());
        };
        self.send_mail(
            Outgoing::new(acc.user_id, MailKind::Recovery, &acc.email, &norm)
                .redirect(req.redirect_to)
                .pkce(pkce.as_ref())
                .request(req.request_id),
        )
        .await
    }

    /// `POST /resend`: the confirmation (`signup`) or email-change mails again.
    pub async fn resend(
        &self,
        kind: &str,
        email: &str,
        redirect_to: Option<&str>,
        request_id: Option<String>,
    ) -> Result<(), AuthApiError> {
        let (_, norm) = account::normalize_email(email)?;
        let Some(acc) = self
            .bounded(account::find_by_email(&self.db, &norm))
            .await??
        else {
            return Ok(());
        };
        match kind {
            "signup" if acc.email_confirmed_at.is_none() => {
                self.send_mail(
                    Outgoing::new(acc.user_id, MailKind::Confirmation, &acc.email, &norm)
                        .redirect(redirect_to)
                        .request(request_id),
                )
                .await
            }
            "email_change" => match acc.email_change.clone() {
                Some(new) => {
                    self.send_email_change(&acc, &new, redirect_to, None, request_id)
                        .await
                }
                None => Ok(()),
            },
            "signup" => Ok(()),
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
        let view = self.bounded(account::load(&self.db, claims.sub)).await??;
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
    }

    /// The two mails of an email change of `acc` to `new`: one to the new
    /// address, one to the current one; the change applies when both are
    /// verified (the platform's "double confirm changes").
    pub(super) async fn send_email_change(
        &self,
        acc: &entity::entities::auth_accounts::Model,
        new: &str,
        redirect_to: Option<&str>,
        pkce: Option<&(String, flow::ChallengeMethod)>,
        request_id: Option<String>,
    ) -> Result<(), AuthApiError> {
        let new_norm = new.to_ascii_lowercase();
        self.send_mail(
            Outgoing::new(acc.user_id, MailKind::EmailChange, new, &new_norm)
                .redirect(redirect_to)
                .pkce(pkce)
                .request(request_id.clone()),
        )
        .await?;
        // The PKCE flow (if any) rides on the new address's link.
        let mut current = Outgoing::new(
            acc.user_id,
            MailKind::EmailChange,
            &acc.email,
            &acc.email_norm,
        )
        .redirect(redirect_to)
        .request(request_id);
        current.throttle = false;
        current.replace = false;
        self.send_mail(current).await
    }

    /// Claims (or stamps) the interval slot, issues the token and queues the mail.
    pub(super) async fn send_mail(&self, m: Outgoing<'_>) -> Result<(), AuthApiError> {
        let Some(from) = self.settings.email_from.clone() else {
            return Err(AuthApiError::new(
                500,
                "email_address_not_authorized",
                "Error sending email: EMAIL_FROM is not configured",
            ));
        };
        let verify_type = m.kind.verify_type();
        if m.throttle {
            self.bounded(otp::claim_mail_slot(
                &self.db,
                m.user_id,
                m.kind,
                self.settings.auth_mail_interval_secs,
            ))
            .await??;
        } else {
            self.bounded(otp::stamp_mail_sent(&self.db, m.user_id, m.kind))
                .await??;
        }
        self.user_changed(m.user_id);
        let flow_id = match m.pkce {
            Some((challenge, method)) => Some(
                self.bounded(flow::create_flow_state(
                    &self.db,
                    flow::FlowStart {
                        provider: "email".into(),
                        code_challenge: challenge.clone(),
                        code_challenge_method: method.as_str().into(),
                        authentication_method: verify_type.into(),
                        user_id: Some(m.user_id),
                    },
                ))
                .await??,
            ),
            None => None,
        };
        let issued = if m.replace {
            self.bounded(otp::issue(&self.db, m.user_id, m.kind, m.to_norm, flow_id))
                .await??
        } else {
            self.bounded(otp::issue_another(
                &self.db, m.user_id, m.kind, m.to_norm, flow_id,
            ))
            .await??
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
        let job = Job::SendAuthEmail(SendAuthEmail {
            kind: m.kind,
            from,
            to: m.to.to_string(),
            token: issued.code,
            token_hash: issued.token_hash,
            confirmation_url,
            redirect_to: redirect,
            site_url: self.settings.app_url.clone(),
            request_id: m.request_id,
        });
        self.queues
            .push_within(job, self.settings.dependency_timeout)
            .await
            .map_err(|e| {
                tracing::error!(error = %e, "auth: could not queue the mail");
                AuthApiError::unavailable()
            })?;
        Ok(())
    }
}
