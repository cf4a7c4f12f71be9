//! Billing mails rendered in one place: the minijinja templates of
//! `config/templates/billing/` (compiled into the binary, parsed when the
//! worker starts, so a broken template stops the start instead of a mail),
//! each kind with three files:
//!
//! * `<kind>.subject.txt`: the subject line (one line, whitespace trimmed);
//! * `<kind>.txt`: the plain-text part;
//! * `<kind>.html`: the HTML part (values HTML-escaped; it extends
//!   `layout.html`, which carries the product name and the page link).
//!
//! `<kind>` is [`BillingMailKind::as_str`]; the variables each kind gets are
//! listed on [`BillingMailKind`]. Every template also gets `app_name`
//! (`APP_NAME`), `app_url` (`APP_URL`), `api_url` (`API_EXTERNAL_URL`),
//! `time_zone` (`BILLING_TIME_ZONE`) and `email`. Undefined variables are
//! errors (strict mode): a template naming a variable its kind does not carry
//! fails its unit test, not a customer's mail.
//!
//! Filters: `plan_name` (a plan id → its catalogue name, `PLANS_FILE` or the
//! built-in catalogue; the id itself when the catalogue no longer has it),
//! `datetime` (RFC 3339 UTC text → `28 November 2026, 17:05 WIB
//! (Asia/Jakarta)`, in `BILLING_TIME_ZONE`), `duration` (seconds → `20 days,
//! 4 hours, 48 minutes`), `money(currency)` (whole units → `IDR 49,000`).

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use entity::{
    base::mail::OutgoingEmail,
    base::plans::Catalogue,
    billing::mail::{BillingMailJob, BillingMailKind},
    Settings,
};
use minijinja::{context, Environment, Error, ErrorKind, UndefinedBehavior, Value};

/// The built-in templates: (file name, text).
pub const TEMPLATES: &[(&str, &str)] = &[
    (
        "layout.html",
        include_str!("../../../config/templates/billing/layout.html"),
    ),
    (
        "receipt.subject.txt",
        include_str!("../../../config/templates/billing/receipt.subject.txt"),
    ),
    (
        "receipt.txt",
        include_str!("../../../config/templates/billing/receipt.txt"),
    ),
    (
        "receipt.html",
        include_str!("../../../config/templates/billing/receipt.html"),
    ),
    (
        "refund_notice.subject.txt",
        include_str!("../../../config/templates/billing/refund_notice.subject.txt"),
    ),
    (
        "refund_notice.txt",
        include_str!("../../../config/templates/billing/refund_notice.txt"),
    ),
    (
        "refund_notice.html",
        include_str!("../../../config/templates/billing/refund_notice.html"),
    ),
    (
        "renewal_reminder.subject.txt",
        include_str!("../../../config/templates/billing/renewal_reminder.subject.txt"),
    ),
    (
        "renewal_reminder.txt",
        include_str!("../../../config/templates/billing/renewal_reminder.txt"),
    ),
    (
        "renewal_reminder.html",
        include_str!("../../../config/templates/billing/renewal_reminder.html"),
    ),
    (
        "past_due.subject.txt",
        include_str!("../../../config/templates/billing/past_due.subject.txt"),
    ),
    (
        "past_due.txt",
        include_str!("../../../config/templates/billing/past_due.txt"),
    ),
    (
        "past_due.html",
        include_str!("../../../config/templates/billing/past_due.html"),
    ),
    (
        "lapsed.subject.txt",
        include_str!("../../../config/templates/billing/lapsed.subject.txt"),
    ),
    (
        "lapsed.txt",
        include_str!("../../../config/templates/billing/lapsed.txt"),
    ),
    (
        "lapsed.html",
        include_str!("../../../config/templates/billing/lapsed.html"),
    ),
    (
        "renewal_unavailable.subject.txt",
        include_str!("../../../config/templates/billing/renewal_unavailable.subject.txt"),
    ),
    (
        "renewal_unavailable.txt",
        include_str!("../../../config/templates/billing/renewal_unavailable.txt"),
    ),
    (
        "renewal_unavailable.html",
        include_str!("../../../config/templates/billing/renewal_unavailable.html"),
    ),
    (
        "price_change.subject.txt",
        include_str!("../../../config/templates/billing/price_change.subject.txt"),
    ),
    (
        "price_change.txt",
        include_str!("../../../config/templates/billing/price_change.txt"),
    ),
    (
        "price_change.html",
        include_str!("../../../config/templates/billing/price_change.html"),
    ),
];

/// The loaded templates and what every mail shares.
pub struct BillingTemplates {
    env: Environment<'static>,
    from: Option<String>,
    app_name: String,
    app_url: String,
    api_url: String,
    zone: Tz,
}

impl std::fmt::Debug for BillingTemplates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BillingTemplates")
            .field("zone", &self.zone)
            .finish_non_exhaustive()
    }
}

/// A template that does not parse, or a mail that does not render.
#[derive(Debug, thiserror::Error)]
#[error("billing mail template {template}: {message}")]
pub struct TemplateError {
    /// The template's file name.
    pub template: String,
    /// What was wrong (with the line where known).
    pub message: String,
}

fn template_error(template: &str, e: &Error) -> TemplateError {
    let mut message = e.to_string();
    if let Some(line) = e.line() {
        message = format!("line {line}: {message}");
    }
    TemplateError {
        template: template.to_string(),
        message,
    }
}

/// `seconds` as `20 days, 4 hours, 48 minutes` (zero parts left out; under a
/// minute: `less than a minute`).
pub fn human_duration(seconds: i64) -> String {
    let s = seconds.max(0);
    let (d, h, m) = (s / 86_400, s % 86_400 / 3_600, s % 3_600 / 60);
    let part = |n: i64, unit: &str| match n {
        0 => None,
        1 => Some(format!("1 {unit}")),
        n => Some(format!("{n} {unit}s")),
    };
    let parts: Vec<String> = [part(d, "day"), part(h, "hour"), part(m, "minute")]
        .into_iter()
        .flatten()
        .collect();
    if parts.is_empty() {
        "less than a minute".to_string()
    } else {
        parts.join(", ")
    }
}

/// `amount` whole units of `currency` as `IDR 49,000`.
pub fn money(amount: i64, currency: &str) -> String {
    let digits = amount.unsigned_abs().to_string();
    let mut grouped = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            grouped.push(',');
        }
        grouped.push(c);
    }
    let sign = if amount < 0 { "-" } else { "" };
    format!("{currency} {sign}{grouped}")
}

/// An RFC 3339 time written in `zone`, with the zone named:
/// `28 November 2026, 17:05 WIB (Asia/Jakarta)`.
pub fn local_time(t: DateTime<Utc>, zone: Tz) -> String {
    format!(
        "{} ({})",
        t.with_timezone(&zone).format("%-d %B %Y, %H:%M %Z"),
        zone.name()
    )
}

impl BillingTemplates {
    /// Parses the built-in templates with the settings' product name, links,
    /// sender and time zone. A template that does not parse is an error (the
    /// worker does not start).
    pub fn load(settings: &Settings) -> Result<Self, TemplateError> {
        let catalogue =
            Catalogue::load_or_built_in(settings.plans_file.as_deref()).map_err(|e| {
                TemplateError {
                    template: "PLANS_FILE".into(),
                    message: e.to_string(),
                }
            })?;
        Self::with(
            &catalogue,
            settings.email_from.clone(),
            settings.app_name.clone(),
            settings.app_url.clone(),
            settings.api_external_url.clone(),
            settings.billing_time_zone,
        )
    }

    /// [`Self::load`] from explicit values.
    pub fn with(
        catalogue: &Catalogue,
        from: Option<String>,
        app_name: String,
        app_url: String,
        api_url: String,
        zone: Tz,
    ) -> Result<Self, TemplateError> {
        let mut env = Environment::new();
        env.set_undefined_behavior(UndefinedBehavior::Strict);
        for (name, text) in TEMPLATES {
            env.add_template(name, text)
                .map_err(|e| template_error(name, &e))?;
        }
        env.add_filter("datetime", move |v: String| -> Result<String, Error> {
            let t = DateTime::parse_from_rfc3339(&v).map_err(|e| {
                Error::new(
                    ErrorKind::InvalidOperation,
                    format!("datetime: {v:?} is not RFC 3339: {e}"),
                )
            })?;
            Ok(local_time(t.with_timezone(&Utc), zone))
        });
        let names: std::collections::HashMap<String, String> = catalogue
            .plans
            .iter()
            .map(|p| (p.id.clone(), p.name.clone()))
            .collect();
        env.add_filter("plan_name", move |id: String| {
            names.get(&id).cloned().unwrap_or(id)
        });
        env.add_filter("duration", |v: i64| human_duration(v));
        env.add_filter("money", |v: i64, currency: String| money(v, &currency));
        Ok(BillingTemplates {
            env,
            from,
            app_name,
            app_url: app_url.trim_end_matches('/').to_string(),
            api_url: api_url.trim_end_matches('/').to_string(),
            zone,
        })
    }

    fn render(&self, name: &str, job: &BillingMailJob) -> Result<String, TemplateError> {
        let tmpl = self
            .env
            .get_template(name)
            .map_err(|e| template_error(name, &e))?;
        let vars = Value::from_serialize(&job.vars);
        let ctx = context! {
            app_name => &self.app_name,
            app_url => &self.app_url,
            api_url => &self.api_url,
            time_zone => self.zone.name(),
            email => &job.to,
            ..vars
        };
        tmpl.render(ctx).map_err(|e| template_error(name, &e))
    }

    /// Whether a sender (`EMAIL_FROM`) is configured.
    pub fn has_sender(&self) -> bool {
        self.from.is_some()
    }

    /// The mail of `job`: subject, text and HTML parts from its kind's
    /// templates. Errors: no sender (`EMAIL_FROM`) or a variable the kind's
    /// templates need is missing.
    pub fn build(&self, job: &BillingMailJob) -> Result<OutgoingEmail, TemplateError> {
        let kind = job.kind.as_str();
        let from = self.from.clone().ok_or_else(|| TemplateError {
            template: kind.to_string(),
            message: "no sender: EMAIL_FROM is not set".into(),
        })?;
        let subject = self.render(&format!("{kind}.subject.txt"), job)?;
        let subject = subject.split_whitespace().collect::<Vec<_>>().join(" ");
        Ok(OutgoingEmail {
            from,
            to: vec![job.to.clone()],
            reply_to: None,
            subject,
            text: self.render(&format!("{kind}.txt"), job)?,
            html: Some(self.render(&format!("{kind}.html"), job)?),
        })
    }

    /// Every kind with a sample of its variables (the documented ones), for
    /// tests and for checking templates at start.
    pub fn sample(kind: BillingMailKind) -> serde_json::Map<String, serde_json::Value> {
        let v = match kind {
            BillingMailKind::Receipt => serde_json::json!({
                "order_id": "ORD-1764320700000-K3Q9ZP2A", "plan": "BASIC",
                "amount": 49000, "currency": "IDR", "provider": "provider_a",
                "paid_at": "2026-11-28T10:05:00Z", "period_start": "2026-11-28T10:05:00Z",
                "period_end": "2027-01-17T15:01:00Z", "from_plan": "PRO",
                "carried_seconds": 1_745_760, "granted_plan": "BASIC",
            }),
            BillingMailKind::RefundNotice => serde_json::json!({
                "order_id": "ORD-1764320700000-K3Q9ZP2A", "plan": "BASIC",
                "amount": 49000, "currency": "IDR", "provider": "provider_b",
                "refunded_at": "2026-11-29T10:05:00Z", "subscription_plan": "PRO",
                "subscription_period_end": "2026-12-08T10:05:00Z",
                "taken_back": true, "past_due_since": null,
            }),
            BillingMailKind::RenewalReminder => serde_json::json!({
                "current_plan": "PRO", "plan": "PRO", "amount": 99000, "currency": "IDR",
                "due_at": "2026-12-28T10:05:00Z", "seconds_left": 604_800,
                "pay_url": "https://api.example.com/api/payments/pay/TOKEN",
            }),
            BillingMailKind::PastDue => serde_json::json!({
                "plan": "PRO", "amount": 99000, "currency": "IDR",
                "period_end": "2026-12-28T10:05:00Z", "grace_end": "2026-12-31T10:05:00Z",
                "pay_url": "https://api.example.com/api/payments/pay/TOKEN",
            }),
            BillingMailKind::Lapsed => serde_json::json!({
                "plan": "PRO", "period_end": "2026-12-28T10:05:00Z",
                "lapsed_at": "2026-12-31T10:05:00Z",
            }),
            BillingMailKind::RenewalUnavailable => serde_json::json!({
                "plan": "LEGACY", "period_end": "2026-12-28T10:05:00Z",
            }),
            BillingMailKind::PriceChange => serde_json::json!({
                "plan": "PRO", "old_amount": 99000, "amount": 129000, "currency": "IDR",
                "noticed_at": "2026-12-21T10:05:00Z", "applies_after": "2027-01-20T10:05:00Z",
                "next_due_at": "2026-12-28T10:05:00Z", "next_amount": 99000,
            }),
        };
        match v {
            serde_json::Value::Object(m) => m,
            _ => unreachable!("samples are objects"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use uuid::Uuid;

    fn templates() -> BillingTemplates {
        BillingTemplates::with(
            &Catalogue::parse(entity::base::plans::BUILT_IN).unwrap(),
            Some("billing@example.com".into()),
            "Acme <AI>".into(),
            "https://app.example.com/".into(),
            "https://api.example.com".into(),
            chrono_tz::Asia::Jakarta,
        )
        .expect("the built-in templates parse")
    }

    fn job(kind: BillingMailKind) -> BillingMailJob {
        BillingMailJob {
            kind,
            key: format!("{}:test", kind.as_str()),
            user_id: Uuid::nil(),
            to: "ann@example.com".into(),
            vars: BillingTemplates::sample(kind),
        }
    }

    #[test]
    fn every_kind_renders_subject_text_and_html() {
        let t = templates();
        for kind in BillingMailKind::ALL {
            let m = t
                .build(&job(kind))
                .unwrap_or_else(|e| panic!("{kind:?}: {e}"));
            assert!(
                !m.subject.is_empty() && !m.subject.contains('\n'),
                "{kind:?}"
            );
            assert!(m.subject.contains("Acme <AI>"), "{kind:?}: {}", m.subject);
            assert!(
                m.text.contains("https://app.example.com"),
                "{kind:?}: {}",
                m.text
            );
            let html = m.html.unwrap();
            assert!(html.contains("Acme &lt;AI&gt;"), "{kind:?}: html escapes");
            assert!(html.contains("<html"), "{kind:?}: the layout");
            assert_eq!(m.to, vec!["ann@example.com".to_string()]);
        }
    }

    #[test]
    fn a_reminder_after_a_change_names_the_plan_in_force_and_the_next_one() {
        let mut j = job(BillingMailKind::RenewalReminder);
        j.vars.insert("plan".into(), "BASIC".into());
        j.vars.insert("amount".into(), 49_000.into());
        let m = templates().build(&j).unwrap();
        assert!(
            m.subject
                .contains("your Pro plan renews as Basic in 7 days"),
            "{}",
            m.subject
        );
        assert!(
            m.text
                .starts_with("Your Acme <AI> Pro plan ends on 28 December 2026")
                && m.text.contains("As you chose, it continues as Basic.")
                && m.text.contains("To continue on Basic, pay IDR 49,000"),
            "{}",
            m.text
        );
        // The same plan, or an older job without the variable: as before.
        for current in [Some("BASIC"), None] {
            let mut j = job(BillingMailKind::RenewalReminder);
            j.vars.insert("plan".into(), "BASIC".into());
            match current {
                Some(c) => j.vars.insert("current_plan".into(), c.into()),
                None => j.vars.remove("current_plan"),
            };
            let m = templates().build(&j).unwrap();
            assert!(
                m.subject.contains("your Basic plan renews in 7 days"),
                "{}",
                m.subject
            );
            assert!(m.text.contains("To keep it, pay"), "{}", m.text);
        }
    }

    #[test]
    fn a_refund_notice_says_what_was_taken_back_and_names_plans() {
        let m = templates()
            .build(&job(BillingMailKind::RefundNotice))
            .unwrap();
        assert!(
            m.text
                .contains("the time it bought that was still to come was taken back")
                && m.text
                    .contains("Your plan is now Pro until 8 December 2026"),
            "{}",
            m.text
        );
        // In grace, nothing taken: says so, and no date past as running.
        let mut j = job(BillingMailKind::RefundNotice);
        j.vars.insert("taken_back".into(), false.into());
        j.vars
            .insert("subscription_period_end".into(), serde_json::Value::Null);
        j.vars
            .insert("past_due_since".into(), "2026-11-28T10:05:00Z".into());
        let m = templates().build(&j).unwrap();
        assert!(
            m.text.contains("No time was taken back")
                && m.text.contains(
                    "Your Pro plan's period ended on 28 November 2026, 17:05 WIB (Asia/Jakarta): it is past due"
                )
                && !m.text.contains("Your plan is now"),
            "{}",
            m.text
        );
        // An older job without the new variables reads as before.
        let mut j = job(BillingMailKind::RefundNotice);
        j.vars.remove("taken_back");
        j.vars.remove("past_due_since");
        let m = templates().build(&j).unwrap();
        assert!(m.text.contains("was taken back"), "{}", m.text);
    }

    #[test]
    fn a_receipt_whose_money_went_to_another_plan_says_so() {
        let mut j = job(BillingMailKind::Receipt);
        j.vars.insert("granted_plan".into(), "PRO".into());
        j.vars.insert("carried_seconds".into(), 0.into());
        let m = templates().build(&j).unwrap();
        assert!(
            m.text
                .contains("Applied to:   your Pro plan, in force when it was paid"),
            "{}",
            m.text
        );
        assert!(m.html.unwrap().contains("your Pro plan, in force"));
        // Its own plan, or an older job without the variable: no such line.
        for granted in [Some("BASIC"), None] {
            let mut j = job(BillingMailKind::Receipt);
            match granted {
                Some(g) => j.vars.insert("granted_plan".into(), g.into()),
                None => j.vars.remove("granted_plan"),
            };
            let m = templates().build(&j).unwrap();
            assert!(!m.text.contains("Applied to"), "{}", m.text);
        }
    }

    #[test]
    fn a_receipt_states_its_number_when_the_job_carries_it() {
        let mut j = job(BillingMailKind::Receipt);
        j.vars.insert("receipt_number".into(), 1042.into());
        let m = templates().build(&j).unwrap();
        assert!(m.text.contains("Receipt:      no. 1042"), "{}", m.text);
        assert!(m.html.unwrap().contains("no. 1042"));
        // An older job without it: no such line.
        let m = templates().build(&job(BillingMailKind::Receipt)).unwrap();
        assert!(!m.text.contains("Receipt:"), "{}", m.text);
    }

    #[test]
    fn the_receipt_names_everything_in_the_billing_zone() {
        let m = templates().build(&job(BillingMailKind::Receipt)).unwrap();
        for want in [
            "ORD-1764320700000-K3Q9ZP2A",
            "Basic",
            "IDR 49,000",
            "provider_a",
            "28 November 2026, 17:05 WIB (Asia/Jakarta)",
            "17 January 2027, 22:01 WIB (Asia/Jakarta)",
            "20 days, 4 hours, 56 minutes",
            "Pro plan",
        ] {
            assert!(m.text.contains(want), "text lacks {want:?}:\n{}", m.text);
            // HTML escaping writes `/` as `&#x2f;`; a mail client shows `/`.
            let html = m.html.as_deref().unwrap().replace("&#x2f;", "/");
            assert!(html.contains(want), "html lacks {want:?}");
        }
    }

    #[test]
    fn a_past_due_mail_without_a_renewal_points_to_the_plans() {
        let mut j = job(BillingMailKind::PastDue);
        for k in ["amount", "currency", "pay_url"] {
            j.vars.insert(k.into(), serde_json::Value::Null);
        }
        let m = templates().build(&j).unwrap();
        assert!(
            m.text.contains("https://app.example.com/billing"),
            "{}",
            m.text
        );
        assert!(!m.text.contains("pay/TOKEN"), "{}", m.text);
    }

    #[test]
    fn a_missing_variable_is_an_error_not_an_empty_field() {
        let mut j = job(BillingMailKind::Receipt);
        j.vars.remove("order_id");
        let e = templates().build(&j).unwrap_err();
        assert!(e.template.starts_with("receipt"), "{e}");
    }

    #[test]
    fn helpers() {
        assert_eq!(money(49_000, "IDR"), "IDR 49,000");
        assert_eq!(money(1_234_567, "IDR"), "IDR 1,234,567");
        assert_eq!(money(999, "IDR"), "IDR 999");
        assert_eq!(human_duration(0), "less than a minute");
        assert_eq!(human_duration(86_400 + 60), "1 day, 1 minute");
        assert_eq!(human_duration(2 * 3_600), "2 hours");
    }
}
