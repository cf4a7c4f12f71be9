//! `webhook_events`: every provider webhook we accepted, stored before it is
//! settled so that a retry of the same notification is recognised
//! (`dedupe_key` is unique) and unsettled events can be replayed.

use sea_orm::entity::prelude::*;
use serde::{Deserialize, Serialize};

/// A received provider webhook.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, Serialize, Deserialize)]
#[sea_orm(table_name = "webhook_events")]
pub struct Model {
    /// Row id.
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    /// Sending provider: one of [`super::payments::PROVIDERS`].
    #[sea_orm(column_type = "Text")]
    pub provider: String,
    /// Identity of the notification (e.g. provider + order + status + provider
    /// event id); unique, so a redelivery fails to insert.
    #[sea_orm(column_type = "Text", unique)]
    pub dedupe_key: String,
    /// Our `payments.order_id` the event is about (not a foreign key: events for
    /// unknown orders are kept too).
    #[sea_orm(column_type = "Text")]
    pub order_id: String,
    /// Status as the provider spelled it, before mapping to `PaymentStatus`.
    #[sea_orm(column_type = "Text")]
    pub provider_status: String,
    /// The webhook body as received (JSON).
    pub payload: Json,
    /// When we received it (UTC).
    pub received_at: DateTimeUtc,
    /// When settlement finished (UTC); `None` while pending or after a failure.
    pub settled_at: Option<DateTimeUtc>,
    /// Last settlement error, if settlement failed.
    #[sea_orm(column_type = "Text", nullable)]
    pub settlement_error: Option<String>,
}

/// Webhook events have no declared relations (`order_id` is matched by value).
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

timestamps!(received_at);
