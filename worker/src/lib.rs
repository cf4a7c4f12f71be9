//! The jobs of the subscription backend: their payloads, queue names and
//! handlers, the queue backends (Redis in production, SQLite embedded), and the
//! worker runtime. The `api` crate enqueues [`Job`]s through a [`queue::Producer`].

pub mod ai;
pub mod drain;
pub mod http;
pub mod jobs;
pub mod listener;
pub mod mailer;
pub mod metrics;
pub mod oauth;
pub mod outbox;
pub mod probes;
pub mod providers;
pub mod queue;
pub mod queue_stats;
pub mod redis_client;
pub mod retry;
pub mod runtime;
pub mod scheduler;
pub mod server;
pub mod storage;

pub use jobs::{Job, QueueName};
pub use queue::{Producer, Queues};
