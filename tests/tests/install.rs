//! The binaries run from any working directory: the plan catalogue is compiled
//! in, and `PLANS_FILE` only overrides it.

use tests::{get, EnvMap, Proc, TempDir};

/// A release-like install: the binary started in an empty directory, with no
/// `PLANS_FILE`, no database and no Redis configured.
#[tokio::test(flavor = "multi_thread")]
async fn api_starts_outside_the_source_tree_with_the_built_in_catalogue() {
    let dir = TempDir::new();
    let env = EnvMap::default().with("PORT", "0");
    let api = Proc::api(&env, &[], dir.path()).await;
    let r = get(&api.url("/api/health")).await;
    assert!(
        r.status == 200 || r.status == 503,
        "health answers: {} {}",
        r.status,
        r.text
    );
    assert!(
        r.json["features"]["waitlist"]["enabled"].as_bool().unwrap(),
        "{}",
        r.text
    );
    assert!(
        dir.path().join("data").is_dir(),
        "the embedded data directory is created under the working directory"
    );
}

/// A `PLANS_FILE` that cannot be read stops the process with a message naming
/// the variable and the file, instead of silently using the built-in catalogue.
#[tokio::test(flavor = "multi_thread")]
async fn an_unreadable_plans_file_stops_the_api_naming_it() {
    let dir = TempDir::new();
    let missing = dir.path().join("no-such-plans.toml");
    let env = EnvMap::default()
        .with("PORT", "0")
        .with("PLANS_FILE", missing.display().to_string());
    let mut api = Proc::spawn("api", &[], &env, dir.path());
    let status = api
        .wait_exit(std::time::Duration::from_secs(30))
        .await
        .expect("the api exits on a bad PLANS_FILE");
    assert!(!status.success());
    let err = api.stderr();
    assert!(err.contains("PLANS_FILE"), "{err}");
    assert!(err.contains("no-such-plans.toml"), "{err}");
}
