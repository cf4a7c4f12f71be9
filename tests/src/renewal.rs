//! The renewal loop seen from outside: its scheduler ticks, counted in the
//! workers' logs, so a test waits for ticks that happened instead of for a
//! time that load can eat.

use super::*;

/// How many scheduler ticks `w` has logged (idle ticks included).
pub fn ticks(w: &Proc) -> usize {
    w.stderr().matches("scheduler tick").count()
}

/// Waits (up to 60 s) until `workers` have logged `n` more scheduler ticks
/// between them (one worker takes each tick's lock).
pub async fn more_ticks(workers: &[&Proc], n: usize) {
    let all = || workers.iter().map(|w| ticks(w)).sum::<usize>();
    let seen = all();
    assert!(
        wait_until(Duration::from_secs(60), || async { all() >= seen + n }).await,
        "the schedulers tick; stderr of the first:\n{}",
        workers.first().map(|w| w.stderr()).unwrap_or_default()
    );
}
