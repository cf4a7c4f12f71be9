//! Harness of the black-box tests: every test starts the real `api` / `worker`
//! binaries against its own PostgreSQL database and its own Redis key space,
//! talks HTTP to them and reads what they did from PostgreSQL, Redis, an SMTP
//! sink or a fake email API.
//!
//! * [`Stack`]: one test's world — a fresh database ([`TestDb`]), a unique
//!   queue prefix ([`RedisNs`]) and a scratch directory ([`TempDir`]); all
//!   removed when dropped.
//! * [`Proc`]: a spawned binary (clean environment, captured output, killed on drop).
//! * [`SmtpSink`]: a real SMTP server inside the test process.
//! * [`TcpProxy`]: a switchable TCP forwarder to simulate outages.
//! * [`TlsRedis`]: a `redis-server` speaking TLS only, with a private CA.
//! * [`Reply`]: a fully read HTTP answer with problem-details assertions.
//!
//! The binaries are the ones `cargo build --workspace --bins` put next to the
//! test executable (`target/debug/`).
//!
//! One module per concern (`db`, `redis`, `stack`, `proc`, `http`, `smtp`,
//! `h2c`, `identity`, `proxy`, `renewal`, `s3`, `tls_redis`, `tokens`, `util`); every public name is re-exported here.

use std::{
    collections::BTreeMap,
    future::Future,
    io::{BufRead, BufReader, Read},
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use reqwest::{header::HeaderMap, StatusCode};
use sea_orm::sqlx::{self, postgres::PgPoolOptions, PgPool};
use serde_json::Value;
use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader as TokioBufReader},
    net::{TcpListener, TcpStream},
    sync::watch,
    task::JoinHandle,
};

pub use reqwest;
pub use serde_json::json;

mod billing;
mod db;
mod github;
mod h2c;
mod http;
mod identity;
mod proc;
mod proxy;
mod redis;
mod renewal;
mod s3;
mod smtp;
mod stack;
mod tls_redis;
mod tokens;
mod util;

pub use billing::*;
pub use db::*;
pub use github::*;
pub use h2c::*;
pub use http::*;
pub use identity::*;
pub use proc::*;
pub use proxy::*;
pub use redis::*;
pub use renewal::*;
pub use s3::*;
pub use smtp::*;
pub use stack::*;
pub use tls_redis::*;
pub use tokens::*;
pub use util::*;
