//! Verification of mailed links and codes (GoTrue's `verify`): consumes the
//! one-time token, applies its effect, signs the user in.

use entity::identity::{account, flow, otp, otp::MailKind};
use uuid::Uuid;

use super::*;

impl Idp {
    /// Verifies a mail's `token_hash` of `kind` (`signup`, `email`,
    /// `magiclink`, `recovery`, `invite`, `email_change`) and signs the user in.
    pub async fn verify_token_hash(
        &self,
        kind: &str,
        token_hash: &str,
    ) -> Result<SessionGrant, AuthApiError> {
        let (user_id, _) = self
            .consume(kind, otp::Proof::TokenHash(token_hash))
            .await?;
        self.issue_session(user_id, "otp", "email").await
    }

    /// Verifies `email` + 6-digit `code` of `kind` and signs the user in.
    pub async fn verify_code(
        &self,
        kind: &str,
        email: &str,
        code: &str,
    ) -> Result<SessionGrant, AuthApiError> {
        let (_, norm) = account::normalize_email(email)?;
        let (user_id, _) = self
            .consume(
                kind,
                otp::Proof::Code {
                    email_norm: &norm,
                    code,
                },
            )
            .await?;
        self.issue_session(user_id, "otp", "email").await
    }

    /// Verifies a link for `GET /verify`: the user and, when the mail was
    /// part of a PKCE flow, the auth code to redirect with.
    pub async fn verify_link(
        &self,
        kind: &str,
        token_hash: &str,
    ) -> Result<LinkOutcome, AuthApiError> {
        let (user_id, flow_id) = self
            .consume(kind, otp::Proof::TokenHash(token_hash))
            .await?;
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
    /// the user and the PKCE flow, if any. Wrong codes count against the
    /// email's tokens ([`otp::MAX_FAILED_ATTEMPTS`]).
    async fn consume(
        &self,
        kind: &str,
        proof: otp::Proof<'_>,
    ) -> Result<(Uuid, Option<Uuid>), AuthApiError> {
        let kinds = otp::kinds_for_type(kind)?;
        let expiry = self.settings.auth_otp_expiry.as_secs() as i64;
        let row = self
            .bounded(otp::consume(&self.db, kinds, proof, expiry))
            .await??;
        let grant = self.grant();
        let applied = async {
            if row.kind == MailKind::EmailChange.as_str() {
                let other_half = self
                    .bounded(otp::outstanding(
                        &self.db,
                        row.user_id,
                        MailKind::EmailChange,
                    ))
                    .await??;
                if !other_half {
                    self.bounded(account::apply_email_change(&self.db, row.user_id))
                        .await??;
                }
            }
            self.bounded(account::confirm_email(&self.db, row.user_id, &grant))
                .await??;
            Ok::<_, AuthApiError>(())
        }
        .await;
        // Also when the second step failed: the first may have committed.
        self.user_changed(row.user_id);
        applied?;
        Ok((row.user_id, row.flow_state_id))
    }
}
