//! The plan catalogue (`config/plans.toml`): prices and AI limits per plan.

use std::path::Path;

use sea_orm::{ConnectionTrait, DbErr, EntityTrait};
use serde::Deserialize;
use uuid::Uuid;

use crate::entities::subscriptions;

/// The plan every user starts on; it cannot be bought.
pub const FREE: &str = "FREE";

/// One plan of the catalogue.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    /// Identifier used on the wire and in the database, upper case (`PRO`).
    pub id: String,
    /// Display name.
    pub name: String,
    /// Monthly price in whole units of the catalogue currency; 0 for FREE.
    pub price: i64,
    /// Whether `POST /api/payments` accepts this plan.
    pub purchasable: bool,
    /// AI requests allowed per 5-minute window.
    pub ai_requests_per_5min: u32,
    /// AI tokens (input + output) per calendar month (UTC); `None` = unlimited.
    #[serde(default)]
    pub ai_tokens_per_month: Option<u64>,
    /// Most output tokens one AI request may ask for (sent upstream as
    /// `max_completion_tokens` / `max_tokens`, lowered to what is left of the
    /// month's tokens); omitted = [`DEFAULT_MAX_OUTPUT_TOKENS`].
    #[serde(default)]
    pub ai_max_output_tokens: Option<u32>,
}

/// A plan's output cap per AI request when the catalogue names none.
pub const DEFAULT_MAX_OUTPUT_TOKENS: u32 = 4096;

impl Plan {
    /// The plan's output cap per AI request (`ai_max_output_tokens`, else
    /// [`DEFAULT_MAX_OUTPUT_TOKENS`]).
    pub fn max_output_tokens(&self) -> u32 {
        self.ai_max_output_tokens
            .unwrap_or(DEFAULT_MAX_OUTPUT_TOKENS)
    }
}

/// The whole catalogue.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Catalogue {
    /// ISO 4217 currency of every price (`IDR`).
    pub currency: String,
    /// The plans, FREE included.
    pub plans: Vec<Plan>,
}

/// Why a catalogue was refused.
#[derive(Debug, thiserror::Error)]
pub enum CatalogueError {
    /// The file could not be read.
    #[error("cannot read plan catalogue {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not valid TOML of the expected shape.
    #[error("plan catalogue is malformed: {0}")]
    Parse(#[from] toml::de::Error),
    /// The content breaks a rule of the catalogue.
    #[error("plan catalogue is invalid: {0}")]
    Invalid(String),
}

/// The catalogue compiled into the binaries: `config/plans.toml` of the source
/// tree (decisions.md, "Plans"), so an installed binary runs from any directory.
pub const BUILT_IN: &str = include_str!("../../../config/plans.toml");

impl Catalogue {
    /// The built-in catalogue ([`BUILT_IN`]), or the file at `path` when one is
    /// given (`PLANS_FILE`). Errors name what was wrong with the file.
    pub fn load_or_built_in(path: Option<&Path>) -> Result<Self, CatalogueError> {
        match path {
            Some(p) => Self::load(p),
            None => Self::parse(BUILT_IN),
        }
    }

    /// Reads and validates the catalogue at `path`.
    pub fn load(path: &Path) -> Result<Self, CatalogueError> {
        let text = std::fs::read_to_string(path).map_err(|source| CatalogueError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&text)
    }

    /// Parses and validates catalogue text.
    pub fn parse(text: &str) -> Result<Self, CatalogueError> {
        let c: Catalogue = toml::from_str(text)?;
        c.validate()?;
        Ok(c)
    }

    fn validate(&self) -> Result<(), CatalogueError> {
        let bad = |m: String| Err(CatalogueError::Invalid(m));
        if self.currency.len() != 3 || !self.currency.chars().all(|c| c.is_ascii_uppercase()) {
            return bad(format!(
                "currency {:?} is not an ISO 4217 code",
                self.currency
            ));
        }
        let mut seen = std::collections::HashSet::new();
        for p in &self.plans {
            if p.id.is_empty()
                || !p
                    .id
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
            {
                return bad(format!(
                    "plan id {:?} must be upper-case letters, digits or _",
                    p.id
                ));
            }
            if !seen.insert(p.id.as_str()) {
                return bad(format!("plan {} is listed twice", p.id));
            }
            if p.purchasable && p.price <= 0 {
                return bad(format!("purchasable plan {} needs a positive price", p.id));
            }
            if p.price < 0 {
                return bad(format!("plan {} has a negative price", p.id));
            }
            if p.ai_max_output_tokens == Some(0) {
                return bad(format!(
                    "plan {} allows no AI output; use 1 or more, or omit ai_max_output_tokens",
                    p.id
                ));
            }
            if p.ai_requests_per_5min == 0 {
                return bad(format!(
                    "plan {} allows no AI requests; use 1 or more",
                    p.id
                ));
            }
        }
        match self.get(FREE) {
            None => bad("the FREE plan is missing".into()),
            Some(free) if free.purchasable => bad("the FREE plan cannot be purchasable".into()),
            Some(_) => Ok(()),
        }
    }

    /// The plan with this id (exact, upper case).
    pub fn get(&self, id: &str) -> Option<&Plan> {
        self.plans.iter().find(|p| p.id == id)
    }

    /// A plan that `POST /api/payments` may sell.
    pub fn purchasable(&self, id: &str) -> Option<&Plan> {
        self.get(id).filter(|p| p.purchasable)
    }
}

/// The plan in force for `user_id`: the subscription's plan while it is
/// `active` (also when cancelled at period end) or `past_due` (in grace), else FREE.
pub async fn plan_of<C: ConnectionTrait>(db: &C, user_id: Uuid) -> Result<String, DbErr> {
    let sub = subscriptions::Entity::find_by_id(user_id).one(db).await?;
    Ok(plan_in_force(sub.map(|s| (s.plan, s.status))))
}

/// The rule of [`plan_of`] on a loaded subscription row (`None`: no row):
/// its `plan` while its status is `active` or `past_due` (the renewal's
/// grace keeps the plan and its limits), else FREE.
pub fn plan_in_force(sub: Option<(String, subscriptions::SubscriptionStatus)>) -> String {
    use subscriptions::SubscriptionStatus::{Active, PastDue};
    match sub {
        Some((plan, Active | PastDue)) => plan,
        _ => FREE.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_catalogue_is_valid() {
        let c = Catalogue::load(Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../config/plans.toml"
        )))
        .unwrap();
        assert_eq!(c.currency, "IDR");
        assert_eq!(c.purchasable("PRO").unwrap().price, 99_000);
        assert!(c.purchasable(FREE).is_none());
        assert_eq!(c.get("ULTIMATE").unwrap().ai_tokens_per_month, None);
        assert_eq!(c.get(FREE).unwrap().ai_tokens_per_month, Some(20_000));
        assert_eq!(c.get(FREE).unwrap().max_output_tokens(), 2048);
    }

    #[test]
    fn an_omitted_output_cap_is_the_default_and_zero_is_refused() {
        let free = |extra: &str| {
            format!(
                "currency = \"IDR\"\n[[plans]]\nid = \"FREE\"\nname = \"Free\"\nprice = 0\npurchasable = false\nai_requests_per_5min = 1\n{extra}"
            )
        };
        let c = Catalogue::parse(&free("")).unwrap();
        assert_eq!(
            c.get(FREE).unwrap().max_output_tokens(),
            DEFAULT_MAX_OUTPUT_TOKENS
        );
        let c = Catalogue::parse(&free("ai_max_output_tokens = 100")).unwrap();
        assert_eq!(c.get(FREE).unwrap().max_output_tokens(), 100);
        assert!(Catalogue::parse(&free("ai_max_output_tokens = 0")).is_err());
    }

    #[test]
    fn the_built_in_catalogue_is_the_shipped_file() {
        let shipped = Catalogue::load(Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../config/plans.toml"
        )))
        .unwrap();
        assert_eq!(Catalogue::load_or_built_in(None).unwrap(), shipped);
    }

    #[test]
    fn a_missing_override_file_is_an_error_naming_it() {
        let e =
            Catalogue::load_or_built_in(Some(Path::new("/nonexistent/plans.toml"))).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/plans.toml"), "{e}");
    }

    #[test]
    fn broken_catalogues_are_refused() {
        assert!(Catalogue::parse("currency = \"IDR\"\nplans = []").is_err());
        let dup = r#"currency = "IDR"
[[plans]]
id = "FREE"
name = "Free"
price = 0
purchasable = false
ai_requests_per_5min = 1
[[plans]]
id = "FREE"
name = "Free"
price = 0
purchasable = false
ai_requests_per_5min = 1
"#;
        assert!(matches!(
            Catalogue::parse(dup),
            Err(CatalogueError::Invalid(_))
        ));
    }
}
