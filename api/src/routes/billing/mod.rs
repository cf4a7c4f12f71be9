//! Billing: checkout and quotes, the renewal pay link, the subscription
//! (cancel, resume, change), operator grants, the payment providers' webhooks.

pub mod operator;
pub mod pay;
pub mod payments;
pub mod plans;
pub mod reads;
pub mod subscription;
pub mod webhooks;
