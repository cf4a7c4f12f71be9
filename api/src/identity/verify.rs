//! Verification of mailed links and codes (GoTrue's `verify`): consumes the
//! one-time token, applies its effect, signs the user in.

use entity::identity::{account, flow, otp, otp::MailKind};
use uuid::Uuid;

use super::*;

impl Idp {
    /// Verifies a mail's `token_hash` of `kind` (`signup`, `email`,
    /// `magiclink`, `recovery`, `invite`, `email_change`) and signs the user in.
    /// The first verified half of an email change answers a message and no
    /// session (GoTrue's secure email change): whoever holds one of the two
    /// mailboxes is not signed in to the account by it.
    pub async fn verify_token_hash(
        &self,
        kind: &str,
        token_hash: &str,
    ) -> Result<Verified, AuthApiError> {
        let (user_id, _, first_half) = self
            .consume(kind, otp::Proof::TokenHash(token_hash))
            .await?;
        self.verified(user_id, first_half).await
    }

    async fn verified(&self, user_id: Uuid, first_half: bool) -> Result<Verified, AuthApiError> {
        if first_half {
            return Ok(Verified::Message(EMAIL_CHANGE_FIRST_HALF.into()));
        }
        Ok(Verified::Session(Box::new(
            self.issue_session(user_id, "otp", "email").await?,
        )))
    }

    /// Verifies `email` + 6-digit `code` of `kind` and signs the user in.
    pub async fn verify_code(
        &self,
        kind: &str,
        email: &str,
        code: &str,
    ) -> Result<Verified, AuthApiError> {
        let (_, norm) = account::normalize_email(email)?;
        let (user_id, _, first_half) = self
            .consume(
                kind,
                otp::Proof::Code {
                    email_norm: &norm,
                    code,
                },
            )
            .await?;
        self.verified(user_id, first_half).await
    }

    /// Verifies a link for `GET /verify`: the user and, when the mail was
    /// part of a PKCE flow, the auth code to redirect with.
    pub async fn verify_link(
        &self,
        kind: &str,
        token_hash: &str,
    ) -> Result<LinkOutcome, AuthApiError> {
        let (user_id, flow_id, first_half) = self
            .consume(kind, otp::Proof::TokenHash(token_hash))
            .await?;
        if first_half {
            return Ok(LinkOutcome::Message(EMAIL_CHANGE_FIRST_HALF.into()));
        }
        match flow_id {
            Some(f) => {
                let code = self
                    .bounded(flow::issue_auth_code(&self.db, f, user_id))
                    .await??;
                Ok(LinkOutcome::Code(code))
            }
            None => Ok(LinkOutcome::Session(Box::new(
                self.issue_session(user_id, "otp", "email").await?,
            ))),
        }
    }

    /// Consumes a one-time token and applies its effect (confirm the email;
    /// apply an email change once both of its mails are verified); returns
    /// the user, the PKCE flow, if any, and whether this was the first half
    /// of an email change (nothing applied yet). Code checks are bounded per
    /// address (`AUTH_CODE_FAILURES_PER_HOUR`, [`otp::consume`]). When the
    /// confirmation drops a password chosen before the mailbox was proven,
    /// the owner (signed in by the caller) is mailed a notice with a
    /// set-password link.
    async fn consume(
        &self,
        kind: &str,
        proof: otp::Proof<'_>,
    ) -> Result<(Uuid, Option<Uuid>, bool), AuthApiError> {
        let kinds = otp::kinds_for_type(kind)?;
        let expiry = self.settings.auth_otp_expiry.as_secs() as i64;
        let row = self
            .bounded(otp::consume(
                &self.db,
                kinds,
                proof,
                expiry,
                self.settings.auth_code_failures_per_hour,
            ))
            .await??;
        let grant = self.grant();
        let mut first_half = false;
        let applied = async {
            if row.kind == MailKind::EmailChange.as_str() {
                // Applies the address this token's request named, once both
                // of its halves are verified.
                first_half = !self
                    .bounded(account::apply_email_change(&self.db, &row))
                    .await??;
            }
            // The first proof of the address decides, once, what the
            // account keeps (nothing at a later sign-in).
            let proof = account::Proof {
                request_id: row
                    .signup_id
                    .filter(|_| row.kind == MailKind::Confirmation.as_str()),
                flow_state_id: row.flow_state_id,
                identity_id: None,
            };
            let confirmed = self
                .bounded(account::confirm_email(&self.db, row.user_id, &grant, proof))
                .await??;
            Ok::<_, AuthApiError>(confirmed)
        }
        .await;
        // Also when the second step failed: the first may have committed.
        self.user_changed(row.user_id);
        if applied?.password_dropped {
            self.send_password_notice(row.user_id).await;
        }
        Ok((row.user_id, row.flow_state_id, first_half))
    }

    /// Mails the notice that the confirmation dropped the password chosen
    /// before the mailbox was proven, with a set-password (recovery) link.
    /// Not held to the interval (it answers the confirmation just made); a
    /// failure is logged, the sign-in goes on.
    async fn send_password_notice(&self, user_id: Uuid) {
        let acc = match self
            .bounded(entity::identity::view::load(&self.db, user_id))
            .await
        {
            Ok(Ok(view)) => view.account,
            _ => None,
        };
        let Some(acc) = acc else {
            tracing::error!(%user_id, "auth: no account for the password notice");
            return;
        };
        let mail = super::mail::Outgoing::new(
            user_id,
            MailKind::PasswordNotice,
            &acc.email,
            &acc.email_norm,
        )
        .slot(super::mail::Slot::Claimed);
        if let Err(e) = self.send_mail(mail).await {
            tracing::error!(error = %e, %user_id, "auth: could not queue the password notice");
        }
    }
}
