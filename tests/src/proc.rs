//! Processes: a spawned binary with captured output ([`Proc`]).

use super::*;

/// A spawned binary with captured stdout/stderr; SIGKILLed on drop.
pub struct Proc {
    /// `api` or `worker`.
    pub name: String,
    child: Child,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
    /// `http://127.0.0.1:PORT` for an api.
    pub base_url: String,
}

pub(crate) fn capture<R: Read + Send + 'static>(r: R, buf: Arc<Mutex<String>>) {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(r);
        let mut line = Vec::new();
        loop {
            line.clear();
            match reader.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {
                    let s = String::from_utf8_lossy(&line);
                    buf.lock().expect("capture lock").push_str(&s);
                }
            }
        }
    });
}

impl Proc {
    /// Spawns `target/debug/<name> <args>` with a clean environment (`PATH`
    /// plus `env`) in `cwd`.
    pub fn spawn(name: &str, args: &[&str], env: &EnvMap, cwd: &Path) -> Proc {
        let mut cmd = Command::new(bin(name));
        cmd.args(args)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .envs(&env.0)
            .current_dir(cwd)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {name}: {e}"));
        let stdout = Arc::new(Mutex::new(String::new()));
        let stderr = Arc::new(Mutex::new(String::new()));
        capture(child.stdout.take().expect("stdout"), stdout.clone());
        capture(child.stderr.take().expect("stderr"), stderr.clone());
        Proc {
            name: name.to_string(),
            child,
            stdout,
            stderr,
            base_url: String::new(),
        }
    }

    /// Spawns `api <args>` and waits (30 s) for `api listening on http://…` on stdout.
    pub async fn api(env: &EnvMap, args: &[&str], cwd: &Path) -> Proc {
        let mut p = Proc::spawn("api", args, env, cwd);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(url) = p.stdout().lines().find_map(|l| {
                l.trim()
                    .strip_prefix("api listening on ")
                    .map(str::to_string)
            }) {
                p.base_url = url.trim_end_matches('/').to_string();
                return p;
            }
            if let Ok(Some(status)) = p.child.try_wait() {
                tokio::time::sleep(Duration::from_millis(200)).await;
                panic!(
                    "api exited ({status}) before listening; stderr:\n{}",
                    p.stderr()
                );
            }
            if Instant::now() >= deadline {
                panic!(
                    "api did not print its listening line within 30 s; stderr:\n{}",
                    p.stderr()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `base_url + path`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url)
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Everything printed on stdout so far.
    pub fn stdout(&self) -> String {
        self.stdout.lock().expect("lock").clone()
    }

    /// Everything printed on stderr so far (JSON log lines).
    pub fn stderr(&self) -> String {
        self.stderr.lock().expect("lock").clone()
    }

    /// Waits until stderr contains `needle`; panics with stderr after `timeout`.
    pub async fn wait_stderr(&self, needle: &str, timeout: Duration) {
        let ok = wait_until(timeout, || async { self.stderr().contains(needle) }).await;
        assert!(
            ok,
            "{} did not log {needle:?} within {timeout:?}; stderr:\n{}",
            self.name,
            self.stderr()
        );
    }

    /// Sends SIGTERM.
    pub fn term(&self) {
        self.signal("TERM");
    }

    /// Sends a signal by name (`TERM`, `INT`, `KILL`, …) with `kill(1)`.
    pub fn signal(&self, name: &str) {
        let _ = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.child.id().to_string())
            .status();
    }

    /// Sends SIGKILL and reaps the process.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits up to `timeout` for the process to exit.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(s)) = self.child.try_wait() {
                return Some(s);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The worker's own HTTP address (`WORKER_HTTP_PORT`), from its `worker http
/// listening on …` line (20 s at most).
pub async fn worker_http(worker: &Proc) -> String {
    let ok = crate::wait_until(std::time::Duration::from_secs(20), || async {
        worker.stdout().contains("worker http listening on ")
    })
    .await;
    assert!(ok, "no worker http line; stderr:\n{}", worker.stderr());
    worker
        .stdout()
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("worker http listening on ")
                .map(str::to_string)
        })
        .expect("address")
}
