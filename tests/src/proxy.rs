//! TCP proxy: a switchable forwarder to simulate outages ([`TcpProxy`]).

use super::*;

/// What a [`TcpProxy`] does with connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyMode {
    /// Forward to the target.
    Forward,
    /// Close live connections; close new ones at once (like a refused connection).
    Refuse,
    /// Close live connections; accept new ones and never answer (a network
    /// black hole: only timeouts get the client out).
    Blackhole,
    /// Live connections stay open but nothing passes any more (a partition:
    /// requests in flight never get an answer); new ones hang as in
    /// `Blackhole`. Frozen connections are closed when the mode changes again.
    Freeze,
}

/// A TCP forwarder on `127.0.0.1:<free port>` to a target, switchable off and
/// on to simulate an outage of PostgreSQL or Redis. Stops on drop.
pub struct TcpProxy {
    /// Listening address.
    pub addr: SocketAddr,
    mode: watch::Sender<ProxyMode>,
    /// Milliseconds a new forwarded connection waits before it reaches the
    /// target (a slow network or a loaded server); 0 by default.
    connect_delay_ms: Arc<std::sync::atomic::AtomicU64>,
    /// How many more new connections pass before the delay applies.
    undelayed: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl TcpProxy {
    /// Forwards to `target` (`host:port`).
    pub async fn start(target: &str) -> Self {
        let target = target.to_string();
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("addr");
        let (tx, _) = watch::channel(ProxyMode::Forward);
        let mode = tx.clone();
        let connect_delay_ms = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let delay = connect_delay_ms.clone();
        let undelayed = Arc::new(AtomicUsize::new(0));
        let spared = undelayed.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut client, _)) = listener.accept().await else {
                    continue;
                };
                let mut rx = tx.subscribe();
                let now = *rx.borrow_and_update();
                match now {
                    ProxyMode::Refuse => drop(client),
                    ProxyMode::Blackhole | ProxyMode::Freeze => {
                        tokio::spawn(async move {
                            // Hold the socket, read and discard, until the mode changes.
                            let mut buf = [0u8; 4096];
                            loop {
                                tokio::select! {
                                    r = tokio::io::AsyncReadExt::read(&mut client, &mut buf) => {
                                        if matches!(r, Ok(0) | Err(_)) { return; }
                                    }
                                    _ = rx.changed() => return,
                                }
                            }
                        });
                    }
                    ProxyMode::Forward => {
                        let target = target.clone();
                        let first = spared
                            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                                n.checked_sub(1)
                            })
                            .is_ok();
                        let wait = if first {
                            0
                        } else {
                            delay.load(Ordering::Relaxed)
                        };
                        tokio::spawn(async move {
                            tokio::time::sleep(Duration::from_millis(wait)).await;
                            let Ok(mut upstream) = TcpStream::connect(&target).await else {
                                return;
                            };
                            let _ = client.set_nodelay(true);
                            let _ = upstream.set_nodelay(true);
                            tokio::select! {
                                _ = tokio::io::copy_bidirectional(&mut client, &mut upstream) => return,
                                _ = rx.wait_for(|m| *m != ProxyMode::Forward) => {}
                            }
                            if *rx.borrow() == ProxyMode::Freeze {
                                // Keep both sockets open, pass nothing.
                                let _ = rx.wait_for(|m| *m != ProxyMode::Freeze).await;
                            }
                            drop((client, upstream));
                        });
                    }
                }
            }
        });
        TcpProxy {
            addr,
            mode,
            connect_delay_ms,
            undelayed,
            task,
        }
    }

    /// Switches the mode; leaving `Forward` closes every live connection
    /// (except for `Freeze`, which holds them silent).
    pub fn set(&self, mode: ProxyMode) {
        self.mode.send_replace(mode);
    }

    /// New connections accepted from now on, but for the next `spare` of
    /// them, reach the target only after `delay` (live ones are untouched;
    /// `Duration::ZERO` ends the delay).
    pub fn delay_connects(&self, spare: usize, delay: Duration) {
        self.undelayed.store(spare, Ordering::Relaxed);
        self.connect_delay_ms.store(
            u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    /// Back to forwarding.
    pub fn on(&self) {
        self.set(ProxyMode::Forward);
    }

    /// The current mode.
    pub fn mode(&self) -> ProxyMode {
        *self.mode.borrow()
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.mode.send_replace(ProxyMode::Refuse);
        self.task.abort();
    }
}

/// `host:port` of a `redis://` or `postgres://` URL.
pub fn host_port(url: &str) -> String {
    let u = reqwest::Url::parse(url).expect("url");
    let port = u.port().unwrap_or(match u.scheme() {
        "redis" => 6379,
        _ => 5432,
    });
    format!("{}:{port}", u.host_str().expect("host"))
}
