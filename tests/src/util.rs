//! Small helpers: random names, waiting for a condition, the HTTP client, the built binaries, scratch directories.

use super::*;

// ---------------------------------------------------------------------------

/// A short random lowercase hex string (`len` ≤ 32).
pub fn rand_hex(len: usize) -> String {
    let s = uuid::Uuid::new_v4().simple().to_string();
    s[..len.min(32)].to_string()
}

/// Polls `f` every 100 ms until it returns true or `timeout` passes.
/// Returns whether it became true.
pub async fn wait_until<F, Fut>(timeout: Duration, f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    poll_every(Duration::from_millis(100), timeout, f, |done| *done).await
}

/// Calls `f` every 20 ms until `done` holds for its answer or `timeout`
/// passes; the last answer either way (the caller asserts on it).
pub async fn poll_until<T, F, Fut>(timeout: Duration, f: F, done: impl Fn(&T) -> bool) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = T>,
{
    poll_every(Duration::from_millis(20), timeout, f, done).await
}

/// The loop of [`wait_until`] and [`poll_until`]: `f` every `interval`.
async fn poll_every<T, F, Fut>(
    interval: Duration,
    timeout: Duration,
    mut f: F,
    done: impl Fn(&T) -> bool,
) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = T>,
{
    let deadline = Instant::now() + timeout;
    loop {
        let v = f().await;
        if done(&v) || Instant::now() >= deadline {
            return v;
        }
        tokio::time::sleep(interval).await;
    }
}

/// Prints a line on the real stderr, bypassing libtest's output capture, so
/// timings of heavy tests show in every run (not only with `--nocapture`).
pub fn report(line: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// The HTTP client of the tests: no proxy, 15 s overall timeout.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(15))
        .build()
        .expect("reqwest client")
}

/// [`client`] that does not follow redirects (the test reads each
/// `Location`), with a 30 s timeout.
pub fn no_redirects() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(30))
        .build()
        .expect("reqwest client")
}

/// `target/<profile>/` holding the binaries (from the test executable's path,
/// `target/<profile>/deps/<test>-<hash>`; `CARGO_TARGET_DIR` is honoured).
pub fn bin_dir() -> PathBuf {
    if let Ok(exe) = std::env::current_exe() {
        if let Some(dir) = exe.parent().and_then(Path::parent) {
            if dir.join(bin_name("api")).exists() {
                return dir.to_path_buf();
            }
        }
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    target.join("debug")
}

pub(crate) fn bin_name(name: &str) -> String {
    format!("{name}{}", std::env::consts::EXE_SUFFIX)
}

/// Path of one of the workspace binaries (`api`, `worker`, `migration`).
pub fn bin(name: &str) -> PathBuf {
    let p = bin_dir().join(bin_name(name));
    assert!(
        p.exists(),
        "{} not found: run `cargo build --workspace --bins` first",
        p.display()
    );
    p
}

/// Absolute path of the plan catalogue.
pub fn plans_file() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/plans.toml")
}

/// A scratch directory, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    /// Creates `<tmp>/bbt-<random>`.
    pub fn new() -> Self {
        let p = std::env::temp_dir().join(format!("bbt-{}", rand_hex(16)));
        std::fs::create_dir_all(&p).expect("create temp dir");
        TempDir(p)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Default for TempDir {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `fut` to completion on a fresh runtime in a fresh thread (usable from
/// `Drop` inside an async test).
pub(crate) fn block_on_thread<F>(fut: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    let _ = std::thread::spawn(move || {
        if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            rt.block_on(fut);
        }
    })
    .join();
}

/// The last `n` bytes (about) of `s`, for failure messages.
pub fn tail(s: &str, n: usize) -> &str {
    let start = s.len().saturating_sub(n);
    let start = (start..s.len())
        .find(|i| s.is_char_boundary(*i))
        .unwrap_or(s.len());
    &s[start..]
}
