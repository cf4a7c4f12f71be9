//! Audit actions and target types: the values of `audit_logs.action` (dotted
//! `<object>.<verb>`) and `audit_logs.target_type`, in one place so that every
//! domain writes the same words and a reader finds them all.

// Actions.

/// `audit_logs.action` when the provider refused or failed a checkout.
pub const ACTION_CHECKOUT_FAILED: &str = "payment.checkout_failed";

/// `audit_logs.action` when an admin puts dead letters back on their queue.
pub const ACTION_DEAD_LETTER_REDRIVE: &str = "dead_letter.redrive";

/// `audit_logs.action` when a payment already `EXPIRED` or `FAILED` is
/// reported paid (verified) and becomes `PAID`.
pub const ACTION_LATE_PAYMENT: &str = "late_payment";

/// `audit_logs.action` when a subscription lapsed and its user has no email
/// address, so no reminder or lapse mail could tell them.
pub const ACTION_NO_EMAIL: &str = "no_email";

/// `audit_logs.action` when an admin gives a customer a plan until a date
/// (`billing::operator::give`; `new_value`: plan, end, seconds, reason).
pub const ACTION_OPERATOR_GRANT: &str = "subscription.operator_grant";

/// `audit_logs.action` when a subscription's period ended unpaid and its
/// grace began (`status` → `past_due`).
pub const ACTION_PAST_DUE: &str = "subscription.past_due";

/// `audit_logs.action` when a payment is settled from a webhook or a status check.
pub const ACTION_PAYMENT_SETTLE: &str = "payment.settle";

/// `audit_logs.action` when a notification reports a status the provider's
/// status API does not confirm: nothing changed.
pub const ACTION_PAYMENT_UNCONFIRMED: &str = "payment.unconfirmed";

/// `audit_logs.action` when a renewal is paid a second time (target: the
/// second payment's order id; `new_value`: the renewal id and what the
/// payment was honoured as).
pub const ACTION_RENEWAL_DUPLICATE: &str = "renewal.duplicate";

/// `audit_logs.action` when an admin changes a user's role.
pub const ACTION_ROLE_CHANGE: &str = "role.change";

/// `audit_logs.action` when a configured grant (`ADMIN_USER_IDS`,
/// `ADMIN_EMAILS`) makes a user admin; an admin's grant is `role.change`.
pub const ACTION_ROLE_GRANT: &str = "role.grant";

/// `audit_logs.action` when a user cancels their subscription at the period
/// end (`POST /api/subscription`, actor = the user).
pub const ACTION_SUBSCRIPTION_CANCEL: &str = "subscription.cancel";

/// `audit_logs.action` when a user chooses the plan their next renewal
/// bills (`change`).
pub const ACTION_SUBSCRIPTION_CHANGE: &str = "subscription.change";

/// `audit_logs.action` when a paid subscription lapses back to FREE.
pub const ACTION_SUBSCRIPTION_EXPIRE: &str = "subscription.expire";

/// `audit_logs.action` when a user undoes their cancel (`resume`).
pub const ACTION_SUBSCRIPTION_RESUME: &str = "subscription.resume";

/// `audit_logs.action` when a refund or chargeback took back the period a
/// payment had bought.
pub const ACTION_SUBSCRIPTION_TAKE_BACK: &str = "subscription.take_back";

// Target types.

/// `audit_logs.target_type` of a payment.
pub const TARGET_TYPE_PAYMENT: &str = "payment";

/// `audit_logs.target_type` of a redrive's audit row: the queue.
pub const TARGET_TYPE_QUEUE: &str = "queue";

/// `audit_logs.target_type` of a subscription.
pub const TARGET_TYPE_SUBSCRIPTION: &str = "subscription";

/// `audit_logs.target_type` of a role change.
pub const TARGET_TYPE_USER: &str = "user";
