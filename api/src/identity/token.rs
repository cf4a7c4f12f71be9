//! Password and code sign-in results as sessions, refresh-token rotation,
//! PKCE exchange, sign-out, and access-token verification (GoTrue's `token`
//! and `logout`).

use entity::identity::{account, flow, password, sessions, IdentityError};
use jsonwebtoken::{Algorithm, Header};
use uuid::Uuid;

use super::*;

impl Idp {
    /// Verifies one of our access tokens (signature, `exp`, `aud`, `iss`) —
    /// locally, without asking the database whether the session still exists.
    pub fn verify_access(&self, token: &str) -> Result<AccessClaims, AuthApiError> {
        self.check(token).map_err(|why| {
            AuthApiError::bad_jwt(match why {
                Rejected::Malformed => "malformed token",
                Rejected::Algorithm => "unexpected algorithm",
                Rejected::NoKid => "no kid",
                Rejected::UnknownKey => "unknown key",
                Rejected::Expired => "token is expired",
                _ => "invalid token",
            })
        })
    }

    /// Verifies one of our access tokens for the logged-in `/api` routes
    /// (locally: signature, `exp`, `aud`, `iss`). The claims carry the
    /// token's `session_id`; [`crate::state::AppState::session`] then checks
    /// that the session still exists (from the cache of accounts, or folded
    /// into the account's query), so a signed-out or revoked session's token
    /// stops working at once.
    pub fn verify_session_token(
        &self,
        token: &str,
    ) -> Result<crate::identity::session::Claims, crate::identity::session::AuthError> {
        use crate::identity::session::AuthError as E;
        let c = self.check(token).map_err(|why| match why {
            Rejected::Malformed => E::Malformed,
            Rejected::Algorithm => E::UnsupportedAlgorithm,
            Rejected::NoKid | Rejected::UnknownKey => E::UnknownKey,
            Rejected::Expired => E::Expired,
            Rejected::NotYetValid => E::NotYetValid,
            Rejected::Audience => E::WrongAudience,
            Rejected::Issuer => E::WrongIssuer,
            Rejected::Signature => E::BadSignature,
        })?;
        Ok(crate::identity::session::Claims {
            sub: c.sub,
            email: Some(c.email).filter(|e| !e.is_empty()),
            exp: c.exp,
            role: Some(c.role),
            iat: Some(c.iat),
            external: false,
            session_id: Some(c.session_id),
        })
    }

    /// The checks both verifiers share. A token that verified before is
    /// answered from [`VerifiedTokens`] with only `exp` checked again (leeway 0,
    /// as in [`Validation`] here).
    fn check(&self, token: &str) -> Result<AccessClaims, Rejected> {
        use jsonwebtoken::errors::ErrorKind as K;
        let token = token.trim();
        if token.is_empty() || token.len() > 16 * 1024 {
            return Err(Rejected::Malformed);
        }
        if let Some(c) = self.verified.get(token) {
            return if c.exp <= chrono::Utc::now().timestamp() {
                Err(Rejected::Expired)
            } else {
                Ok(c)
            };
        }
        let header = jsonwebtoken::decode_header(token).map_err(|_| Rejected::Malformed)?;
        if header.alg != Algorithm::ES256 {
            return Err(Rejected::Algorithm);
        }
        let kid = header.kid.ok_or(Rejected::NoKid)?;
        let key = self
            .keys
            .public
            .iter()
            .find(|k| k.kid == kid)
            .ok_or(Rejected::UnknownKey)?;
        let claims = jsonwebtoken::decode::<AccessClaims>(token, &key.decoding, &self.validation)
            .map_err(|e| match e.kind() {
                K::ExpiredSignature => Rejected::Expired,
                K::ImmatureSignature => Rejected::NotYetValid,
                K::InvalidAudience => Rejected::Audience,
                K::InvalidIssuer => Rejected::Issuer,
                K::InvalidSignature | K::InvalidEcdsaKey => Rejected::Signature,
                _ => Rejected::Malformed,
            })?
            .claims;
        self.verified.insert(token, &claims);
        Ok(claims)
    }

    /// Verifies the bearer token AND that its session still exists
    /// (`GET/PUT /user`, `POST /logout`).
    pub async fn authenticate(&self, bearer: Option<&str>) -> Result<AccessClaims, AuthApiError> {
        let token = bearer.ok_or_else(AuthApiError::no_authorization)?;
        let claims = self.verify_access(token)?;
        let exists = self
            .bounded(sessions::exists(&self.db, claims.session_id))
            .await??;
        if !exists {
            return Err(IdentityError::SessionNotFound.into());
        }
        Ok(claims)
    }

    /// Mints the session answer for an issued session.
    async fn grant_for(
        &self,
        issued: sessions::IssuedSession,
    ) -> Result<SessionGrant, AuthApiError> {
        let view = match issued.view {
            Some(view) => view,
            None => {
                self.bounded(entity::identity::view::load(
                    &self.db,
                    issued.session.user_id,
                ))
                .await??
            }
        };
        let user = UserJson::from_view(&view);
        let iat = issued.session.refreshed_at.timestamp();
        let exp = iat + self.ttl();
        let claims = AccessClaims {
            iss: self.issuer.clone(),
            sub: issued.session.user_id,
            aud: AUDIENCE.into(),
            exp,
            iat,
            email: user.email.clone(),
            phone: String::new(),
            app_metadata: serde_json::to_value(&user.app_metadata).unwrap_or_default(),
            user_metadata: user.user_metadata.clone(),
            role: AUDIENCE.into(),
            aal: issued.session.aal.clone(),
            amr: vec![Amr {
                method: issued.session.amr_method.clone(),
                timestamp: issued.session.created_at.timestamp(),
            }],
            session_id: issued.session.id,
            is_anonymous: false,
        };
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some(self.keys.kid.clone());
        let access_token = jsonwebtoken::encode(&header, &claims, &self.keys.encoding)
            .map_err(AuthApiError::internal)?;
        Ok(SessionGrant {
            access_token,
            token_type: "bearer".into(),
            expires_in: self.ttl(),
            expires_at: exp,
            refresh_token: issued.refresh_token,
            user,
        })
    }

    /// A new session for `user_id`, established by `amr_method` (`password`,
    /// `otp`, …) through `provider` (informational). OAuth sign-ins use
    /// [`Idp::issue_oauth_session`].
    pub async fn issue_session(
        &self,
        user_id: Uuid,
        amr_method: &str,
        provider: &str,
    ) -> Result<SessionGrant, AuthApiError> {
        let _ = provider;
        let issued = self
            .bounded(sessions::create(
                &self.db,
                &self.refresh_secret,
                user_id,
                amr_method,
            ))
            .await??;
        self.bounded(account::record_sign_in(&self.db, user_id))
            .await??;
        self.user_changed(user_id);
        self.grant_for(issued).await
    }

    /// The session of an OAuth sign-in, issued while its identity is held
    /// ([`entity::identity::external::grant_session`]); `None` when the
    /// owner's first proof removed the identity meanwhile (refused).
    pub async fn issue_oauth_session(
        &self,
        user_id: Uuid,
        identity_id: Uuid,
    ) -> Result<Option<SessionGrant>, AuthApiError> {
        let issued = self
            .bounded(entity::identity::external::grant_session(
                &self.db,
                &self.refresh_secret,
                user_id,
                identity_id,
            ))
            .await??;
        let Some(issued) = issued else {
            return Ok(None);
        };
        self.bounded(account::record_sign_in(&self.db, user_id))
            .await??;
        self.user_changed(user_id);
        self.grant_for(issued).await.map(Some)
    }

    /// `grant_type=password`.
    pub async fn sign_in_password(
        &self,
        email: &str,
        pw: &str,
    ) -> Result<SessionGrant, AuthApiError> {
        let (_, norm) =
            account::normalize_email(email).map_err(|_| IdentityError::InvalidCredentials)?;
        if pw.is_empty() || pw.len() > password::MAX_PASSWORD_BYTES {
            return Err(IdentityError::InvalidCredentials.into());
        }
        let acc = self
            .bounded(account::find_by_email(&self.db, &norm))
            .await??;
        let phc = acc.as_ref().and_then(|a| a.password_hash.clone());
        let (pw, cost) = (pw.to_string(), self.settings.auth_password_hash_cost);
        let ok = self
            .hashing(move || match phc {
                Some(phc) => password::verify(&pw, &phc),
                None => password::verify(&pw, password::dummy_hash(cost)),
            })
            .await?;
        let Some(acc) = acc.filter(|a| ok && a.password_hash.is_some()) else {
            return Err(IdentityError::InvalidCredentials.into());
        };
        if acc.email_confirmed_at.is_none() {
            return Err(IdentityError::EmailNotConfirmed.into());
        }
        self.issue_session(acc.user_id, "password", "email").await
    }

    /// `grant_type=refresh_token`. With `AUTH_SESSIONS_TIMEBOX_SECS` or
    /// `AUTH_SESSIONS_INACTIVITY_TIMEOUT_SECS` set, a session past either
    /// (database clock) is refused: 400 `session_expired`.
    pub async fn refresh(&self, token: &str) -> Result<SessionGrant, AuthApiError> {
        let reuse = self.settings.auth_refresh_reuse_interval.as_millis() as i64;
        let secs = |d: Option<std::time::Duration>| d.map(|d| d.as_secs() as i64);
        let lifetime = sessions::Lifetime {
            timebox_secs: secs(self.settings.auth_sessions_timebox),
            inactivity_secs: secs(self.settings.auth_sessions_inactivity_timeout),
        };
        let issued = match self
            .bounded(sessions::refresh(
                &self.db,
                &self.refresh_secret,
                token,
                reuse,
                lifetime,
            ))
            .await?
        {
            Ok(issued) => issued,
            Err(IdentityError::RefreshTokenAlreadyUsed { user_id }) => {
                // The session was revoked.
                self.user_changed(user_id);
                return Err(IdentityError::RefreshTokenAlreadyUsed { user_id }.into());
            }
            Err(e) => return Err(e.into()),
        };
        self.grant_for(issued).await
    }

    /// `grant_type=pkce`: exchanges an auth code with its verifier.
    pub async fn exchange_pkce(
        &self,
        auth_code: &str,
        code_verifier: &str,
    ) -> Result<SessionGrant, AuthApiError> {
        let ex = self
            .bounded(flow::exchange(&self.db, auth_code, code_verifier))
            .await??;
        // The password of the sign-up that started this flow: the verifier
        // proves that sign-up's browser, the auth code the mailbox.
        if let Some(hash) = ex.password_hash.as_deref() {
            self.bounded(account::install_parked_password(&self.db, ex.user_id, hash))
                .await??;
        }
        let amr = if ex.provider == "email" {
            "otp"
        } else {
            "oauth"
        };
        self.issue_session(ex.user_id, amr, &ex.provider).await
    }

    /// `POST /logout?scope=`.
    pub async fn logout(
        &self,
        claims: &AccessClaims,
        scope: Option<&str>,
    ) -> Result<(), AuthApiError> {
        let scope = sessions::LogoutScope::parse(scope)?;
        self.bounded(sessions::logout(
            &self.db,
            claims.sub,
            claims.session_id,
            scope,
        ))
        .await??;
        self.user_changed(claims.sub);
        Ok(())
    }
}
