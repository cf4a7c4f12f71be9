//! `auth_flow_states`: a PKCE flow (RFC 7636) from its start (code challenge)
//! to the exchange of its auth code (single use).

use sea_orm::entity::prelude::*;

/// A PKCE flow state.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "auth_flow_states")]
pub struct Model {
    /// Flow id.
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    /// The user, once known.
    pub user_id: Option<Uuid>,
    /// `email`, `github`, `google`.
    #[sea_orm(column_type = "Text")]
    pub provider: String,
    /// The client's code challenge.
    #[sea_orm(column_type = "Text")]
    pub code_challenge: String,
    /// `s256` or `plain`.
    #[sea_orm(column_type = "Text")]
    pub code_challenge_method: String,
    /// `magiclink`, `signup`, `recovery`, `email_change`, `oauth`, …
    #[sea_orm(column_type = "Text")]
    pub authentication_method: String,
    /// SHA-256 (hex) of the issued auth code.
    #[sea_orm(column_type = "Text", nullable)]
    pub auth_code_digest: Option<String>,
    /// When the auth code was issued (database clock).
    pub auth_code_issued_at: Option<DateTimeUtc>,
    /// argon2id hash of the password of the sign-up that started this flow:
    /// installed by this flow's exchange (the verifier proves the sign-up's
    /// browser, the auth code the mailbox).
    #[sea_orm(column_type = "Text", nullable)]
    pub password_hash: Option<String>,
    /// Created (database clock).
    pub created_at: DateTimeUtc,
}

/// No navigable relations.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
