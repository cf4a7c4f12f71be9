//! The black-box suite as one test binary: each module is one flow's file
//! beside this one (`tests/tests/<flow>.rs`), so the suite links once
//! instead of once per file (each file was its own binary: ~60 links of the
//! whole dependency tree, most of the build's time and disk). Run one file's
//! tests with a filter: `cargo nextest run -p tests -E 'test(/^identity::/)'`
//! or `bash .ci/test.sh identity::`.

mod ai_chat;
mod ai_embedded;
mod ai_quota;
mod ai_sdk_client;
mod auth_js_client;
mod availability;
mod avatars;
mod backlog;
mod bad_input;
mod billing_anchor;
mod billing_mails;
mod browser;
mod chaos;
mod checkout;
mod confirm;
mod connections;
mod contact;
mod cors;
mod dead_letters;
mod embedded;
mod embedded_complete;
mod health;
mod identity;
mod identity_accounts;
mod identity_proof;
mod identity_races;
mod identity_trust;
mod install;
mod job_limits;
mod metrics;
mod oauth;
mod operator_grants;
mod outbox;
mod pg_outage;
mod plan_changes;
mod queue_layout;
mod rate_limit;
mod reads;
mod reconcile;
mod reconcile_rules;
mod redis_tls;
mod refund_chains;
mod refunds;
mod renewal;
mod renewal_expire;
mod renewal_pages;
mod renewal_pauses;
mod renewal_payments;
mod replicas;
mod resilience;
mod retries;
mod revoked_sessions;
mod scale_in;
mod scheduler;
mod sessions;
mod settlement_crash;
mod settlement_rules;
mod shedding;
mod slow_bodies;
mod toggles;
mod waitlist;
mod webhooks;
mod worker_port;
