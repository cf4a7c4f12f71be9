//! Toggles + readiness gates → one [`FeatureStatus`] per feature.
//!
//! Computed once from [`Settings`] at start; routes answer 503 from it and
//! `GET /api/health` reports it, so both always agree.

use serde::Serialize;

use crate::base::settings::{EmailTransport, PaymentProvider, Settings};

/// A product feature as reported by health (`features.<key>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Feature {
    /// Sessions, auth callback, avatar upload.
    Auth,
    /// `POST /api/waitlist`.
    Waitlist,
    /// `POST /api/contact`.
    Contact,
    /// Subscription management (`POST /api/subscription`).
    Billing,
    /// Checkout (`POST /api/payments`) and provider webhooks.
    Payments,
    /// `POST /api/admin/users/role`.
    Admin,
    /// AI chat and generation.
    Ai,
}

impl Feature {
    /// Every feature, in the order health lists them.
    pub const ALL: [Feature; 7] = [
        Feature::Auth,
        Feature::Waitlist,
        Feature::Contact,
        Feature::Billing,
        Feature::Payments,
        Feature::Admin,
        Feature::Ai,
    ];

    /// The key used in health's `features` map.
    pub fn key(self) -> &'static str {
        match self {
            Feature::Auth => "auth",
            Feature::Waitlist => "waitlist",
            Feature::Contact => "contact",
            Feature::Billing => "billing",
            Feature::Payments => "payments",
            Feature::Admin => "admin",
            Feature::Ai => "ai",
        }
    }

    /// The toggle that switches this feature.
    pub fn toggle(self) -> &'static str {
        match self {
            Feature::Auth => "NEXT_PUBLIC_ENABLE_AUTH",
            Feature::Waitlist => "NEXT_PUBLIC_ENABLE_WAITLIST",
            Feature::Contact => "NEXT_PUBLIC_ENABLE_CONTACT",
            Feature::Billing | Feature::Payments => "NEXT_PUBLIC_ENABLE_PAYMENTS",
            Feature::Admin => "NEXT_PUBLIC_ENABLE_ADMIN",
            Feature::Ai => "NEXT_PUBLIC_ENABLE_AI",
        }
    }
}

/// Readiness of one feature: `{enabled, disabled_by_flag, missing_env, message}`.
///
/// `enabled` is true only when the toggle is on *and* nothing is missing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FeatureStatus {
    /// Toggle on and every required setting present.
    pub enabled: bool,
    /// The toggle turned the feature off on purpose.
    pub disabled_by_flag: bool,
    /// Environment variables the feature needs and lacks (empty when ready).
    pub missing_env: Vec<&'static str>,
    /// One sentence for humans.
    pub message: String,
}

impl FeatureStatus {
    fn new(feature: Feature, toggled_on: bool, missing_env: Vec<&'static str>) -> Self {
        let (enabled, message) = if !toggled_on {
            (false, format!("disabled by {}", feature.toggle()))
        } else if !missing_env.is_empty() {
            (
                false,
                format!("not configured: set {}", missing_env.join(", ")),
            )
        } else {
            (true, "ready".to_string())
        };
        FeatureStatus {
            enabled,
            disabled_by_flag: !toggled_on,
            missing_env,
            message,
        }
    }

    /// Whether requests to this feature should be served.
    pub fn ready(&self) -> bool {
        self.enabled
    }
}

/// Readiness of every feature plus the interface's `checks` booleans.
#[derive(Debug, Clone)]
pub struct Features {
    statuses: Vec<(Feature, FeatureStatus)>,
    /// `checks.backend_public`: backend URL and publishable key set.
    pub backend_public: bool,
    /// `checks.backend_service_role`: `BACKEND_SERVICE_ROLE_KEY` set.
    pub backend_service_role: bool,
    /// `checks.email_provider`: an email transport (HTTP API or SMTP) is configured.
    pub email_provider: bool,
}

impl Features {
    /// Applies the toggles and readiness gates of the interface to `s`.
    pub fn compute(s: &Settings) -> Self {
        let mut backend_public_missing = Vec::new();
        if s.backend_url.is_none() {
            backend_public_missing.push("NEXT_PUBLIC_BACKEND_URL");
        }
        if s.backend_publishable_key.is_none() {
            backend_public_missing.push("NEXT_PUBLIC_BACKEND_PUBLISHABLE_KEY");
        }
        let service_role_missing: Vec<&'static str> = if s.backend_service_role_key.is_none() {
            vec!["BACKEND_SERVICE_ROLE_KEY"]
        } else {
            vec![]
        };

        // The embedded default (no DATABASE_URL, no REDIS_URL, no transport)
        // delivers to the outbox directory: contact is ready, but
        // `checks.email_provider` stays false (no real transport).
        let outbox = s.email_transport() == EmailTransport::Outbox;
        let mut email_missing = Vec::new();
        let http_api = s.email_provider_api_key.is_some();
        if !http_api && s.smtp_url.is_none() && !outbox {
            email_missing.push("EMAIL_PROVIDER_API_KEY");
        }
        if http_api && s.smtp_url.is_none() && s.email_provider_base_url.is_none() {
            email_missing.push("EMAIL_PROVIDER_BASE_URL");
        }
        let email_provider = email_missing.is_empty() && !outbox;
        if s.email_from.is_none() {
            email_missing.push("EMAIL_FROM");
        }

        let mut payments_missing = service_role_missing.clone();
        match s.payment_provider {
            PaymentProvider::ProviderA => {
                if s.provider_a_server_key.is_none() {
                    payments_missing.push("PROVIDER_A_SERVER_KEY");
                }
            }
            PaymentProvider::ProviderB => {
                if s.provider_b_client_id.is_none() {
                    payments_missing.push("PROVIDER_B_CLIENT_ID");
                }
                if s.provider_b_secret_key.is_none() {
                    payments_missing.push("PROVIDER_B_SECRET_KEY");
                }
            }
        }

        let mut session_missing = Vec::new();
        if s.backend_jwt_secret.is_none()
            && s.backend_url.is_none()
            && s.auth_provider != crate::base::settings::AuthProvider::Builtin
        {
            // Without either key source no session token can be verified.
            session_missing.push("BACKEND_JWT_SECRET");
        }

        let mut auth_missing = backend_public_missing.clone();
        auth_missing.extend(session_missing.iter().copied());
        auth_missing.dedup();
        if s.auth_provider == crate::base::settings::AuthProvider::Builtin {
            // The built-in identity provider needs no external platform.
            auth_missing.clear();
        }

        let mut admin_missing = service_role_missing.clone();
        admin_missing.extend(session_missing.iter().copied());

        let ai_missing: Vec<&'static str> = match s.ai_default_provider.as_str() {
            "anthropic" if s.anthropic_api_key.is_none() => vec!["ANTHROPIC_API_KEY"],
            "openai_compatible" if s.openai_compatible_base_url.is_none() => {
                vec!["OPENAI_COMPATIBLE_BASE_URL"]
            }
            "openai" if s.openai_api_key.is_none() => vec!["OPENAI_API_KEY"],
            _ => vec![],
        };

        let mut billing_missing = service_role_missing.clone();
        billing_missing.extend(session_missing.iter().copied());

        let t = s.toggles;
        let statuses = vec![
            (
                Feature::Auth,
                FeatureStatus::new(Feature::Auth, t.auth, auth_missing),
            ),
            (
                Feature::Waitlist,
                FeatureStatus::new(Feature::Waitlist, t.waitlist, vec![]),
            ),
            (
                Feature::Contact,
                FeatureStatus::new(Feature::Contact, t.contact, email_missing),
            ),
            (
                Feature::Billing,
                FeatureStatus::new(Feature::Billing, t.payments, billing_missing),
            ),
            (
                Feature::Payments,
                FeatureStatus::new(Feature::Payments, t.payments, payments_missing),
            ),
            (
                Feature::Admin,
                FeatureStatus::new(Feature::Admin, t.admin, admin_missing),
            ),
            (
                Feature::Ai,
                FeatureStatus::new(Feature::Ai, t.ai, ai_missing),
            ),
        ];
        Features {
            statuses,
            backend_public: backend_public_missing.is_empty(),
            backend_service_role: service_role_missing.is_empty(),
            email_provider,
        }
    }

    /// The status of one feature.
    pub fn get(&self, feature: Feature) -> &FeatureStatus {
        &self
            .statuses
            .iter()
            .find(|(f, _)| *f == feature)
            .expect("every feature is computed")
            .1
    }

    /// Every feature with its status, in [`Feature::ALL`] order.
    pub fn iter(&self) -> impl Iterator<Item = (Feature, &FeatureStatus)> {
        self.statuses.iter().map(|(f, s)| (*f, s))
    }

    /// True when every feature that is toggled on has its configuration.
    pub fn all_enabled_ready(&self) -> bool {
        self.statuses
            .iter()
            .all(|(_, s)| s.disabled_by_flag || s.missing_env.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn features(pairs: &[(&str, &str)]) -> Features {
        let map: HashMap<&str, &str> = pairs.iter().copied().collect();
        Features::compute(&Settings::from_source(&map).unwrap())
    }

    #[test]
    fn embedded_default_sends_contact_mail_to_the_outbox() {
        let f = features(&[]);
        let c = f.get(Feature::Contact);
        assert!(c.enabled, "{c:?}");
        assert!(c.missing_env.is_empty());
        assert!(!f.email_provider, "the outbox is not an email provider");
    }

    #[test]
    fn contact_needs_a_transport_and_a_sender() {
        let f = features(&[("REDIS_URL", "redis://127.0.0.1:6379")]);
        let c = f.get(Feature::Contact);
        assert!(!c.enabled && !c.disabled_by_flag);
        assert_eq!(c.missing_env, vec!["EMAIL_PROVIDER_API_KEY", "EMAIL_FROM"]);
        assert!(!f.email_provider);

        let f = features(&[("DATABASE_URL", "postgres://localhost/app")]);
        assert_eq!(
            f.get(Feature::Contact).missing_env,
            vec!["EMAIL_PROVIDER_API_KEY", "EMAIL_FROM"],
            "PostgreSQL alone is production: a real transport is required"
        );

        let f = features(&[
            ("SMTP_URL", "smtp://localhost:2525"),
            ("EMAIL_FROM", "a@example.com"),
        ]);
        assert!(f.get(Feature::Contact).enabled);
        assert!(f.email_provider);
    }

    #[test]
    fn toggle_off_wins_over_configuration() {
        let f = features(&[("NEXT_PUBLIC_ENABLE_WAITLIST", "off")]);
        let w = f.get(Feature::Waitlist);
        assert!(!w.enabled && w.disabled_by_flag);
        assert!(w.message.contains("NEXT_PUBLIC_ENABLE_WAITLIST"));
    }

    #[test]
    fn payments_name_the_selected_provider_credentials() {
        let f = features(&[("PAYMENT_PROVIDER", "provider_a")]);
        assert_eq!(
            f.get(Feature::Payments).missing_env,
            vec!["BACKEND_SERVICE_ROLE_KEY", "PROVIDER_A_SERVER_KEY"]
        );
    }
}
