//! The mails: magic link / code (`/otp`), recovery, resend, and the
//! shared sender (60-s slot, one-time token, PKCE flow, queued job).

use entity::identity::{
    account::{self, Created, NewAccount},
    flow, otp,
    otp::MailKind,
};
use uuid::Uuid;
use worker::{jobs::SendAuthEmail, Job};

use super::*;

impl Idp {
    /// `POST /otp`: a magic link / code mail (creating the user when allowed).
    pub async fn send_otp(&self, req: OtpRequest<'_>) -> Result<(), AuthApiError> {
        let (email, norm) = account::normalize_email(req.email)?;
        let pkce = flow::pkce_params(req.code_challenge, req.code_challenge_method)?;
        let existing = self
            .bounded(account::find_by_email(&self.db, &norm))
            .await??;
        let (user_id, kind) = match existing {
            Some(a) if a.email_confirmed_at.is_some() => (a.user_id, MailKind::Magiclink),
            Some(a) => (a.user_id, MailKind::Confirmation),
            None if !req.create_user => {
                return Err(AuthApiError::new(
                    422,
                    "otp_disabled",
                    "Signups not allowed for otp",
                ))
            }
            None => {
                let meta = match req.data {
                    Some(serde_json::Value::Object(m)) => serde_json::Value::Object(m.clone()),
                    _ => serde_json::json!({}),
                };
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
                (a.user_id, MailKind::Confirmation)
            }
        };
        let verify_type = if kind == MailKind::Magiclink {
            "magiclink"
        } else {
            "signup"
        };
        self.send_mail(
            user_id,
            kind,
            &email,
            &norm,
            req.redirect_to,
            pkce.as_ref(),
            verify_type,
            req.request_id,
        )
        .await
    }

    /// `POST /recover`: a recovery mail when the account exists; `Ok` either way
    /// (except the 60-s rule).
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
            acc.user_id,
            MailKind::Recovery,
            &acc.email,
            &norm,
            req.redirect_to,
            pkce.as_ref(),
            "recovery",
            req.request_id,
        )
        .await
    }

    /// `POST /resend`: the confirmation (`signup`) or email-change mail again.
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
                    acc.user_id,
                    MailKind::Confirmation,
                    &acc.email,
                    &norm,
                    redirect_to,
                    None,
                    "signup",
                    request_id,
                )
                .await
            }
            "email_change" => match acc.email_change.clone() {
                Some(new) => {
                    let new_norm = new.to_ascii_lowercase();
                    self.send_mail(
                        acc.user_id,
                        MailKind::EmailChange,
                        &new,
                        &new_norm,
                        redirect_to,
                        None,
                        "email_change",
                        request_id,
                    )
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

    /// Claims the 60-s slot, issues the token and queues the mail.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn send_mail(
        &self,
        user_id: Uuid,
        kind: MailKind,
        to: &str,
        to_norm: &str,
        redirect_to: Option<&str>,
        pkce: Option<&(String, flow::ChallengeMethod)>,
        verify_type: &str,
        request_id: Option<String>,
    ) -> Result<(), AuthApiError> {
        let Some(from) = self.settings.email_from.clone() else {
            return Err(AuthApiError::new(
                500,
                "email_address_not_authorized",
                "Error sending email: EMAIL_FROM is not configured",
            ));
        };
        self.bounded(otp::claim_mail_slot(&self.db, user_id, kind))
            .await??;
        self.user_changed(user_id).await;
        let flow_id = match pkce {
            Some((challenge, method)) => Some(
                self.bounded(flow::create_flow_state(
                    &self.db,
                    flow::FlowStart {
                        provider: "email".into(),
                        code_challenge: challenge.clone(),
                        code_challenge_method: method.as_str().into(),
                        authentication_method: verify_type.into(),
                        user_id: Some(user_id),
                    },
                ))
                .await??,
            ),
            None => None,
        };
        let issued = self
            .bounded(otp::issue(&self.db, user_id, kind, to_norm, flow_id))
            .await??;
        let redirect = self.redirect_target(redirect_to);
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
            kind,
            from,
            to: to.to_string(),
            token: issued.code,
            token_hash: issued.token_hash,
            confirmation_url,
            redirect_to: redirect,
            site_url: self.settings.app_url.clone(),
            request_id,
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
