//! `GET /user` and `PUT /user` (GoTrue's `user`).

use entity::identity::{account, flow, otp, otp::MailKind, password, sessions, IdentityError};

use super::*;

/// A session signed in longer ago than this needs the reauthentication
/// nonce to change the password (the platform's 24 h).
pub const REAUTHENTICATION_AFTER_SECS: i64 = 24 * 3600;

impl Idp {
    /// `GET /user`: verifies the bearer token and answers its user while the
    /// session still exists, in one query ([`entity::identity::view::load_for_session`]).
    pub async fn current_user(&self, bearer: Option<&str>) -> Result<UserJson, AuthApiError> {
        let token = bearer.ok_or_else(AuthApiError::no_authorization)?;
        let claims = self.verify_access(token)?;
        if let Some(user) = self.accounts.session_user(claims.sub, claims.session_id) {
            return Ok(user);
        }
        let ticket = self.accounts.ticket();
        let view = self
            .bounded(entity::identity::view::load_for_session(
                &self.db,
                claims.sub,
                claims.session_id,
            ))
            .await??;
        let user = UserJson::from_view(&view);
        self.accounts
            .put_session_user(ticket, claims.sub, claims.session_id, &user);
        Ok(user)
    }

    /// `PUT /user`: password, email (sends the change mails), data.
    ///
    /// A new password ends every other session of the account (their refresh
    /// tokens with them). From a session signed in more than 24 h ago
    /// ([`REAUTHENTICATION_AFTER_SECS`], database clock) it needs the nonce
    /// mailed by `GET /reauthenticate`: without it 400
    /// `reauthentication_needed`, a wrong or used one 422
    /// `reauthentication_not_valid`; it voids the account's outstanding
    /// recovery, magic-link and email-change mails. A new email gets a mail
    /// at the new and at the current address, both bound to this request and
    /// its address ([`Idp::send_email_change`]); it applies when both are
    /// verified.
    pub async fn update_user(
        &self,
        claims: &AccessClaims,
        req: UpdateUser<'_>,
    ) -> Result<UserJson, AuthApiError> {
        let view = self
            .bounded(entity::identity::view::load(&self.db, claims.sub))
            .await??;
        let Some(acc) = view.account.clone() else {
            return Err(IdentityError::UserNotFound.into());
        };
        if let Some(pw) = req.password {
            password::check_strength(pw, self.settings.auth_password_min_length)?;
            self.check_reauthentication(claims, &acc.email_norm, req.nonce)
                .await?;
            let (pw1, old) = (pw.to_string(), acc.password_hash.clone());
            let same = self
                .hashing(move || old.is_some_and(|h| password::verify(&pw1, &h)))
                .await?;
            if same {
                return Err(IdentityError::SamePassword.into());
            }
            let (pw2, cost) = (pw.to_string(), self.settings.auth_password_hash_cost);
            let hash = self.hashing(move || password::hash(&pw2, cost)).await?;
            self.bounded(account::set_password(&self.db, claims.sub, &hash))
                .await??;
            let revoked = self
                .bounded(sessions::revoke_others(
                    &self.db,
                    claims.sub,
                    Some(claims.session_id),
                ))
                .await;
            // Whoever holds an earlier recovery, magic-link or email-change
            // mail of the account may no longer use it.
            let voided = self
                .bounded(otp::void_kinds(
                    &self.db,
                    claims.sub,
                    &otp::VOIDED_BY_CREDENTIAL_CHANGE,
                ))
                .await;
            self.user_changed(claims.sub);
            revoked??;
            voided??;
        }
        if let Some(data) = req.data {
            match data {
                serde_json::Value::Object(m) => {
                    self.bounded(account::merge_metadata(&self.db, claims.sub, m))
                        .await??;
                    self.user_changed(claims.sub);
                }
                serde_json::Value::Null => {}
                _ => return Err(AuthApiError::validation("data must be an object")),
            }
        }
        if let Some(new_email) = req.email {
            let (new_email, new_norm) = account::normalize_email(new_email)?;
            if new_norm != acc.email_norm {
                let pkce = flow::pkce_params(req.code_challenge, req.code_challenge_method)?;
                // Slots claimed, then the pending address and both tokens
                // written, in one transaction: a refused request changes nothing.
                self.send_email_change(
                    &acc,
                    &new_email,
                    req.redirect_to,
                    pkce.as_ref(),
                    req.request_id,
                )
                .await?;
            }
        }
        let view = self
            .bounded(entity::identity::view::load(&self.db, claims.sub))
            .await??;
        Ok(UserJson::from_view(&view))
    }

    /// The 24-h rule of a password change (see [`Idp::update_user`]).
    async fn check_reauthentication(
        &self,
        claims: &AccessClaims,
        email_norm: &str,
        nonce: Option<&str>,
    ) -> Result<(), AuthApiError> {
        let old = self
            .bounded(sessions::signed_in_before(
                &self.db,
                claims.session_id,
                REAUTHENTICATION_AFTER_SECS,
            ))
            .await??;
        if !old {
            return Ok(());
        }
        let nonce = nonce
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .ok_or(IdentityError::ReauthenticationNeeded)?;
        let expiry = self.settings.auth_otp_expiry.as_secs() as i64;
        let row = self
            .bounded(otp::consume(
                &self.db,
                &[MailKind::Reauthentication],
                otp::Proof::Code {
                    email_norm,
                    code: nonce,
                },
                expiry,
                self.settings.auth_code_failures_per_hour,
            ))
            .await?;
        match row {
            Ok(row) if row.user_id == claims.sub => Ok(()),
            Ok(_) | Err(IdentityError::OtpExpired) => {
                Err(IdentityError::ReauthenticationNotValid.into())
            }
            Err(e) => Err(e.into()),
        }
    }
}
