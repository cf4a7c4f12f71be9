//! The settings' rules, read from maps.

use std::collections::HashMap;

use super::*;

fn with(pairs: &[(&'static str, &'static str)]) -> Result<Settings, SettingsError> {
    let map: HashMap<&str, &str> = pairs.iter().copied().collect();
    Settings::from_source(&map)
}

#[test]
fn defaults_are_embedded_and_everything_enabled() {
    let s = with(&[]).unwrap();
    assert!(s.database_embedded);
    assert!(s.database_url.starts_with("sqlite://"));
    assert!(s.redis_url.is_none());
    assert_eq!(s.port, 8080);
    let t = s.toggles;
    assert!(t.auth && t.waitlist && t.contact && t.payments && t.admin && t.ai);
    assert_eq!(s.payment_provider, PaymentProvider::ProviderB);
}

#[test]
fn toggles_accept_the_documented_spellings() {
    for off in ["false", "0", "no", "off", "OFF", "False", " No "] {
        let map: HashMap<&str, &str> = [("NEXT_PUBLIC_ENABLE_CONTACT", off)].into();
        assert!(
            !Settings::from_source(&map).unwrap().toggles.contact,
            "{off}"
        );
    }
    for on in ["true", "1", "yes", "on", "TRUE", "Yes"] {
        let map: HashMap<&str, &str> = [("NEXT_PUBLIC_ENABLE_CONTACT", on)].into();
        assert!(Settings::from_source(&map).unwrap().toggles.contact, "{on}");
    }
}

#[test]
fn malformed_values_name_the_variable() {
    assert_eq!(with(&[("PORT", "eighty")]).unwrap_err().var, "PORT");
    assert_eq!(
        with(&[("NEXT_PUBLIC_ENABLE_AI", "maybe")]).unwrap_err().var,
        "NEXT_PUBLIC_ENABLE_AI"
    );
    assert_eq!(
        with(&[("DATABASE_URL", "mysql://x")]).unwrap_err().var,
        "DATABASE_URL"
    );
    assert_eq!(
        with(&[("PAYMENT_PROVIDER", "paypal")]).unwrap_err().var,
        "PAYMENT_PROVIDER"
    );
    assert_eq!(
        with(&[("EMAIL_FROM", "not-an-email")]).unwrap_err().var,
        "EMAIL_FROM"
    );
    assert_eq!(
        with(&[("WORKER_CONCURRENCY", "0")]).unwrap_err().var,
        "WORKER_CONCURRENCY"
    );
}

#[test]
fn mail_interval_defaults_to_60_s_and_may_be_off() {
    assert_eq!(with(&[]).unwrap().auth_mail_interval_secs, 60);
    assert_eq!(
        with(&[("AUTH_MAIL_INTERVAL_SECS", "0")])
            .unwrap()
            .auth_mail_interval_secs,
        0
    );
    for bad in ["-1", "86401", "soon"] {
        assert_eq!(
            with(&[("AUTH_MAIL_INTERVAL_SECS", bad)]).unwrap_err().var,
            "AUTH_MAIL_INTERVAL_SECS"
        );
    }
}

#[test]
fn billing_mails_name_the_product_and_a_real_time_zone() {
    let s = with(&[]).unwrap();
    assert_eq!(s.app_name, "App");
    assert_eq!(s.billing_time_zone, chrono_tz::Asia::Jakarta);
    let s = with(&[
        ("APP_NAME", " Acme Cloud "),
        ("BILLING_TIME_ZONE", "Europe/Berlin"),
    ])
    .unwrap();
    assert_eq!(s.app_name, "Acme Cloud");
    assert_eq!(s.billing_time_zone, chrono_tz::Europe::Berlin);
    for bad in ["Mars/Olympus", "Asia/Nowhere", "+07:00"] {
        assert_eq!(
            with(&[("BILLING_TIME_ZONE", bad)]).unwrap_err().var,
            "BILLING_TIME_ZONE"
        );
    }
    assert_eq!(
        with(&[("APP_NAME", "Acme\nCloud")]).unwrap_err().var,
        "APP_NAME"
    );
    let long: &'static str = Box::leak("x".repeat(101).into_boxed_str());
    assert_eq!(with(&[("APP_NAME", long)]).unwrap_err().var, "APP_NAME");
}

#[test]
fn secrets_have_a_minimum_length() {
    let short = "0123456789abcdef0123456789abcde"; // 31 bytes
    let long = "0123456789abcdef0123456789abcdef"; // 32 bytes
    for var in ["BACKEND_JWT_SECRET", "BACKEND_SERVICE_ROLE_KEY"] {
        assert_eq!(with(&[(var, short)]).unwrap_err().var, var);
        assert!(with(&[(var, long)]).is_ok(), "{var}");
    }
}

#[test]
fn backend_url_is_https_or_loopback() {
    for ok in [
        "https://auth.example.com",
        "http://127.0.0.1:9",
        "http://localhost:54321",
        "http://[::1]:8000/x",
    ] {
        assert!(with(&[("NEXT_PUBLIC_BACKEND_URL", ok)]).is_ok(), "{ok}");
    }
    for bad in [
        "http://auth.example.com",
        "http://127.0.0.1.evil.com",
        "http://localhost.evil.com",
        "http://10.0.0.1",
    ] {
        assert_eq!(
            with(&[("NEXT_PUBLIC_BACKEND_URL", bad)]).unwrap_err().var,
            "NEXT_PUBLIC_BACKEND_URL",
            "{bad}"
        );
    }
}

#[test]
fn cors_origins_are_exact_origins() {
    assert!(with(&[]).unwrap().cors_allowed_origins.is_empty());
    let s = with(&[(
        "CORS_ALLOWED_ORIGINS",
        " https://App.Example.com , http://127.0.0.1:5173,https://app.example.com:443",
    )])
    .unwrap();
    assert_eq!(
        s.cors_allowed_origins,
        vec!["https://app.example.com", "http://127.0.0.1:5173"]
    );
    for bad in [
        "https://app.example.com/",
        "https://app.example.com/x",
        "*",
        "https://*.example.com",
        "ftp://x.example.com",
        "app.example.com",
    ] {
        assert_eq!(
            with(&[("CORS_ALLOWED_ORIGINS", bad)]).unwrap_err().var,
            "CORS_ALLOWED_ORIGINS",
            "{bad}"
        );
    }
}

#[test]
fn proxy_hops_and_admin_ids() {
    assert_eq!(with(&[]).unwrap().trust_proxy_hops, 0);
    assert_eq!(
        with(&[("TRUST_PROXY", "true")]).unwrap().trust_proxy_hops,
        1
    );
    let s = with(&[("TRUST_PROXY", "true"), ("TRUST_PROXY_HOPS", "2")]).unwrap();
    assert_eq!(s.trust_proxy_hops, 2);
    let id = "7f6c2c6e-1f0a-4c39-9d55-2a8f0f1b9a11";
    let s = with(&[("ADMIN_USER_IDS", " 7f6c2c6e-1f0a-4c39-9d55-2a8f0f1b9a11 ,")]).unwrap();
    assert_eq!(s.admin_user_ids, vec![uuid::Uuid::parse_str(id).unwrap()]);
    assert_eq!(
        with(&[("ADMIN_USER_IDS", "boss")]).unwrap_err().var,
        "ADMIN_USER_IDS"
    );
    assert!(!with(&[]).unwrap().auth_trust_email_claim);
}

#[test]
fn contact_inbox_falls_back_to_sender() {
    let s = with(&[("EMAIL_FROM", "team@example.com")]).unwrap();
    assert_eq!(s.contact_inbox(), Some("team@example.com"));
    let s = with(&[
        ("EMAIL_FROM", "team@example.com"),
        ("CONTACT_EMAIL", "in@example.com"),
    ])
    .unwrap();
    assert_eq!(s.contact_inbox(), Some("in@example.com"));
}

#[test]
fn sender_and_inbox_accept_an_rfc5322_mailbox() {
    for v in [
        "noreply@example.com",
        "Site <noreply@example.com>",
        "\"Site, Inc.\" <noreply@example.com>",
        "<noreply@example.com>",
        "Jane Q. Public <jane@example.org>",
    ] {
        let s = with(&[("EMAIL_FROM", v), ("CONTACT_EMAIL", v)])
            .unwrap_or_else(|e| panic!("{v:?}: {e}"));
        assert_eq!(s.email_from.as_deref(), Some(v), "kept as-is");
    }
    for v in [
        "Site <noreply@example.com",
        "Site <not-an-email>",
        "Site, Inc. <noreply@example.com>",
        "\"Site <noreply@example.com>",
        "Site <noreply@localhost>",
    ] {
        assert_eq!(
            with(&[("EMAIL_FROM", v)]).unwrap_err().var,
            "EMAIL_FROM",
            "{v:?}"
        );
        assert_eq!(
            with(&[("CONTACT_EMAIL", v)]).unwrap_err().var,
            "CONTACT_EMAIL",
            "{v:?}"
        );
    }
}

#[test]
fn smtp_credentials_need_tls_off_loopback() {
    let e = with(&[("SMTP_URL", "smtp://user:pass@mail.example.com:25")]).unwrap_err();
    assert_eq!(e.var, "SMTP_URL");
    assert!(e.message.contains("tls=required"), "{}", e.message);
    assert_eq!(
        with(&[(
            "SMTP_URL",
            "smtp://user@mail.example.com:587?tls=opportunistic"
        )])
        .unwrap_err()
        .var,
        "SMTP_URL"
    );
    for ok in [
        "smtp://user:pass@mail.example.com:587?tls=required",
        "smtps://user:pass@mail.example.com:465",
        "smtp://user:pass@localhost:25",
        "smtp://user:pass@127.0.0.1:2525",
        "smtp://user:pass@[::1]:2525",
        "smtp://mail.example.com:25",
    ] {
        assert!(with(&[("SMTP_URL", ok)]).is_ok(), "{ok}");
    }
}

#[test]
fn the_transport_follows_the_configuration() {
    let t = |pairs: &[(&'static str, &'static str)]| with(pairs).unwrap().email_transport();
    assert_eq!(t(&[]), EmailTransport::Outbox);
    assert_eq!(
        t(&[("REDIS_URL", "redis://127.0.0.1:6379")]),
        EmailTransport::None
    );
    assert_eq!(
        t(&[("DATABASE_URL", "postgres://localhost/app")]),
        EmailTransport::None
    );
    assert_eq!(
        t(&[("SMTP_URL", "smtp://localhost:2525")]),
        EmailTransport::Smtp
    );
    assert_eq!(
        t(&[
            ("EMAIL_PROVIDER_API_KEY", "k"),
            ("EMAIL_PROVIDER_BASE_URL", "https://api.example.com")
        ]),
        EmailTransport::Api
    );
    // A key without its base URL is a broken configuration, not the outbox.
    assert_eq!(t(&[("EMAIL_PROVIDER_API_KEY", "k")]), EmailTransport::None);
}

#[test]
fn the_outbox_has_a_default_sender() {
    let s = with(&[]).unwrap();
    assert_eq!(s.email_from.as_deref(), Some(OUTBOX_DEFAULT_FROM));
    let s = with(&[("REDIS_URL", "redis://127.0.0.1:6379")]).unwrap();
    assert_eq!(s.email_from, None, "production has no default sender");
}

#[test]
fn redis_tls_settings_are_checked() {
    let dir = std::env::temp_dir().join(format!("redis-ca-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let ca = dir.join("ca.pem");
    std::fs::write(
        &ca,
        "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    let not_pem = dir.join("key.txt");
    std::fs::write(&not_pem, "hello").unwrap();
    let ca_s: &'static str = ca.display().to_string().leak();
    let s = with(&[
        ("REDIS_URL", "rediss://cache.example.com:6380"),
        ("REDIS_CA_FILE", ca_s),
    ])
    .unwrap();
    assert_eq!(s.redis_ca_file.as_deref(), Some(ca.as_path()));
    assert_eq!(
        with(&[("REDIS_URL", "rediss://h:6380")])
            .unwrap()
            .redis_ca_file,
        None
    );
    for (pairs, var) in [
        (
            vec![("REDIS_URL", "redis://h:6379"), ("REDIS_CA_FILE", ca_s)],
            "REDIS_CA_FILE",
        ),
        (vec![("REDIS_CA_FILE", ca_s)], "REDIS_CA_FILE"),
        (
            vec![
                ("REDIS_URL", "rediss://h:6380"),
                ("REDIS_CA_FILE", "/nonexistent/ca.pem"),
            ],
            "REDIS_CA_FILE",
        ),
        (
            vec![("REDIS_URL", "rediss://h:6380/#insecure")],
            "REDIS_URL",
        ),
    ] {
        assert_eq!(with(&pairs).unwrap_err().var, var, "{pairs:?}");
    }
    let not_pem_s: &'static str = not_pem.display().to_string().leak();
    let e = with(&[
        ("REDIS_URL", "rediss://h:6380"),
        ("REDIS_CA_FILE", not_pem_s),
    ])
    .unwrap_err();
    assert!(e.message.contains("no PEM certificate"), "{}", e.message);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn retry_settings_have_defaults_and_bounds() {
    let s = with(&[]).unwrap();
    assert_eq!(s.job_retry_base, Duration::from_secs(10));
    assert_eq!(s.job_retry_max_delay, Duration::from_secs(3600));
    assert_eq!(s.job_retry_horizon, Duration::from_secs(86_400));
    assert_eq!(s.dead_letter_retention, Duration::from_secs(1_209_600));
    assert_eq!(s.worker_heartbeat, Duration::from_millis(5000));
    assert_eq!(s.job_timeout, Duration::from_secs(300));
    assert_eq!(s.worker_shutdown_timeout, Duration::from_secs(25));
    assert_eq!(s.worker_test_panic_marker, None);
    assert_eq!(
        with(&[("WORKER_SHUTDOWN_TIMEOUT_SECS", "0")])
            .unwrap()
            .worker_shutdown_timeout,
        Duration::ZERO
    );
    assert_eq!(
        with(&[("WORKER_SHUTDOWN_TIMEOUT_SECS", "3601")])
            .unwrap_err()
            .var,
        "WORKER_SHUTDOWN_TIMEOUT_SECS"
    );
    for var in [
        "JOB_RETRY_BASE_SECS",
        "JOB_RETRY_MAX_DELAY_SECS",
        "WORKER_HEARTBEAT_MS",
        "JOB_TIMEOUT_SECS",
    ] {
        assert_eq!(with(&[(var, "0")]).unwrap_err().var, var);
    }
}
