//! `POST /signup` (GoTrue's `signup`).

use entity::identity::{
    account::{self, Created, NewAccount},
    flow,
    otp::MailKind,
    password,
};

use super::{mail::Outgoing, *};

impl Idp {
    /// `POST /signup`.
    pub async fn sign_up(&self, req: SignUp<'_>) -> Result<SignUpOutcome, AuthApiError> {
        let (email, norm) = account::normalize_email(req.email)?;
        password::check_strength(req.password, self.settings.auth_password_min_length)?;
        let pkce = flow::pkce_params(req.code_challenge, req.code_challenge_method)?;
        let meta = match req.data {
            Some(serde_json::Value::Object(m)) => serde_json::Value::Object(m.clone()),
            None | Some(serde_json::Value::Null) => serde_json::json!({}),
            Some(_) => return Err(AuthApiError::validation("data must be an object")),
        };
        let (pw, cost) = (
            req.password.to_string(),
            self.settings.auth_password_hash_cost,
        );
        let hash = self.hashing(move || password::hash(&pw, cost)).await?;
        let autoconfirm = self.settings.auth_autoconfirm;
        let grant = self.grant();
        let created = self
            .bounded(account::create(
                &self.db,
                NewAccount {
                    email: &email,
                    email_norm: &norm,
                    password_hash: Some(hash.clone()),
                    user_metadata: meta.clone(),
                    confirmed: autoconfirm,
                },
                &grant,
            ))
            .await??;
        match created {
            Created::New(acc) if autoconfirm => Ok(SignUpOutcome::Session(Box::new(
                self.issue_session(acc.user_id, "password", "email").await?,
            ))),
            Created::New(acc) => {
                self.send_mail(
                    Outgoing::new(acc.user_id, MailKind::Confirmation, &email, &norm)
                        .redirect(req.redirect_to)
                        .pkce(pkce.as_ref())
                        .request(req.request_id.clone()),
                )
                .await?;
                let view = self.bounded(account::load(&self.db, acc.user_id)).await??;
                Ok(SignUpOutcome::User(Box::new(UserJson::from_view(&view))))
            }
            Created::Existing(_) if autoconfirm => Err(AuthApiError::new(
                422,
                "user_already_exists",
                "User already registered",
            )),
            Created::Existing(acc) => {
                // Indistinguishable from a fresh sign-up: same status and shape.
                // Until the email is confirmed the newest sign-up wins: its
                // password replaces the pending one, every earlier link and
                // code is void, and its own confirmation is mailed (not held
                // back by the mail interval rule; the per-IP limits bound it). A
                // confirmed account changes and sends nothing.
                if acc.email_confirmed_at.is_none() {
                    let taken = self
                        .bounded(account::retake_pending(
                            &self.db,
                            acc.user_id,
                            Some(hash),
                            meta.clone(),
                        ))
                        .await??;
                    self.user_changed(acc.user_id);
                    if taken {
                        let mut mail =
                            Outgoing::new(acc.user_id, MailKind::Confirmation, &acc.email, &norm)
                                .redirect(req.redirect_to)
                                .pkce(pkce.as_ref())
                                .request(req.request_id.clone());
                        mail.throttle = false;
                        self.send_mail(mail).await?;
                    }
                }
                let now = self.bounded(entity::db::now(&self.db)).await??;
                Ok(SignUpOutcome::User(Box::new(UserJson::decoy(
                    &email, meta, now,
                ))))
            }
        }
    }
}
