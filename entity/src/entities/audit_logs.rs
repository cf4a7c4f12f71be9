//! `audit_logs`: append-only record of privileged or money-moving actions.
//!
//! `actor_id` is deliberately not a foreign key: the trail must survive the
//! deletion of the acting user.

use sea_orm::entity::prelude::*;
use serde::{Deserialize, Serialize};

/// `action` when an admin changes a user's role.
pub const ACTION_ROLE_CHANGE: &str = "role.change";
/// `action` when a payment is settled from a webhook or a status check.
pub const ACTION_PAYMENT_SETTLE: &str = "payment.settle";

/// One audited action.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, Serialize, Deserialize)]
#[sea_orm(table_name = "audit_logs")]
pub struct Model {
    /// Row id.
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    /// Acting user; `None` for the system (webhooks, jobs).
    pub actor_id: Option<Uuid>,
    /// What happened, dotted `<object>.<verb>`, e.g. [`ACTION_ROLE_CHANGE`],
    /// [`ACTION_PAYMENT_SETTLE`].
    #[sea_orm(column_type = "Text")]
    pub action: String,
    /// Kind of object acted on, e.g. `user`, `payment`.
    #[sea_orm(column_type = "Text")]
    pub target_type: String,
    /// Id of the object acted on, as text (a uuid or an order id).
    #[sea_orm(column_type = "Text")]
    pub target_id: String,
    /// State before the action (JSON), if relevant.
    pub old_value: Option<Json>,
    /// State after the action (JSON), if relevant.
    pub new_value: Option<Json>,
    /// Request id of the HTTP request or job that did it, for log correlation.
    #[sea_orm(column_type = "Text", nullable)]
    pub request_id: Option<String>,
    /// When it happened (UTC).
    pub created_at: DateTimeUtc,
}

/// Audit logs have no declared relations.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

timestamps!(created_at);
