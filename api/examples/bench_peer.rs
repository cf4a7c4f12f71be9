//! Benchmark peer: a bare poem route (`GET /bare`, the baseline every figure in
//! BENCHMARKS.md is compared to) and a fake HTTP email API (`POST /emails`,
//! answers 200 and counts) for measuring the worker's drain rate.
//!
//! `cargo run --release -p api --example bench_peer -- 127.0.0.1:9999`
//! `GET /count` returns the number of emails received so far.

use std::sync::{
    atomic::{AtomicU64, Ordering},
    Arc,
};

use poem::{get, handler, listener::TcpListener, post, web::Data, EndpointExt, Route, Server};

#[handler]
fn bare() -> &'static str {
    "ok"
}

#[handler]
fn emails(count: Data<&Arc<AtomicU64>>, body: poem::Body) -> poem::Response {
    drop(body);
    let n = count.fetch_add(1, Ordering::Relaxed) + 1;
    poem::Response::builder()
        .content_type("application/json")
        .body(format!("{{\"id\":\"{n}\"}}"))
}

#[handler]
fn counted(count: Data<&Arc<AtomicU64>>) -> String {
    count.load(Ordering::Relaxed).to_string()
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:9999".into());
    let count = Arc::new(AtomicU64::new(0));
    let app = Route::new()
        .at("/bare", get(bare))
        .at("/emails", post(emails))
        .at("/count", get(counted))
        .data(count);
    println!("bench peer on http://{addr}");
    Server::new(TcpListener::bind(addr)).run(app).await
}
