//! The model's rules on the schema the migrations make, as one test binary:
//! each module is a file beside this one, `common` what they share (one
//! link of the dependency tree instead of one per file).

mod billing_histories;
mod common;
mod email_change_rules;
mod ledger_rules;
mod model_rules;
mod outbox_rules;
mod pause_rules;
mod roundtrip;
mod session_rules;
mod signup_rules;
