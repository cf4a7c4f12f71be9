//! String fields with a `pattern`, each regular expression compiled once per
//! process.
//!
//! poem-openapi's `validator(pattern = …)` compiles its regular expression on
//! every check, which cost a request more than everything else it does. A
//! field of type [`Matching<P>`] states `P::PATTERN` in its schema exactly as
//! that validator did (`type: string`, `pattern`; `minLength`/`maxLength`
//! validators on the field still add theirs) and checks values with the regex
//! [`compiled`] keeps. [`crate::payload::JsonBody`] reads each field's pattern
//! from the schema and checks it first with that same compiled regex, so a
//! mismatch in a JSON body is a 400 `invalid_format` naming the field.
//!
//! A pattern is declared with [`string_pattern!`](crate::string_pattern).

use std::{
    borrow::Cow,
    collections::HashMap,
    marker::PhantomData,
    ops::Deref,
    sync::{LazyLock, RwLock},
};

use poem_openapi::{
    registry::{MetaSchema, MetaSchemaRef},
    types::{ParseError, ParseFromJSON, ParseFromParameter, ParseResult, ToJSON, Type},
};
use regex::Regex;
use serde_json::Value;

/// `pattern` compiled, once per process and pattern (the compiled regex then
/// lives as long as the process; patterns come from the code, so they are
/// few). `None` when it does not compile: such a pattern matches nothing.
pub fn compiled(pattern: &str) -> Option<&'static Regex> {
    static CACHE: LazyLock<RwLock<HashMap<String, Option<&'static Regex>>>> =
        LazyLock::new(Default::default);
    if let Some(re) = CACHE.read().expect("pattern cache poisoned").get(pattern) {
        return *re;
    }
    *CACHE
        .write()
        .expect("pattern cache poisoned")
        .entry(pattern.to_string())
        .or_insert_with(|| Regex::new(pattern).ok().map(|re| &*Box::leak(Box::new(re))))
}

/// A regular expression a string field must match (declare one with
/// [`string_pattern!`](crate::string_pattern)).
pub trait Pattern: Send + Sync + 'static {
    /// The expression as the schema states it (Rust `regex` syntax, which
    /// reads the ECMAScript subset these patterns use the same way).
    const PATTERN: &'static str;
    /// [`Self::PATTERN`] compiled (once per process, by [`compiled`]).
    fn regex() -> &'static Regex;
}

/// Declares a [`Pattern`]: a unit type whose regex is compiled at its first
/// use and kept.
///
/// ```ignore
/// api::string_pattern!(
///     /// No NUL.
///     NoNul = r"^[^\u0000]*$"
/// );
/// ```
#[macro_export]
macro_rules! string_pattern {
    ($(#[$meta:meta])* $vis:vis $name:ident = $pattern:literal) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        $vis struct $name;

        impl $crate::pattern::Pattern for $name {
            const PATTERN: &'static str = $pattern;
            fn regex() -> &'static ::regex::Regex {
                static RE: ::std::sync::LazyLock<&'static ::regex::Regex> =
                    ::std::sync::LazyLock::new(|| {
                        $crate::pattern::compiled($pattern)
                            .expect(concat!("the pattern of ", stringify!($name), " compiles"))
                    });
                *RE
            }
        }
    };
}

string_pattern!(
    /// Any text without U+0000 (NUL), which no text field may hold.
    pub NoNul = r"^[^\u0000]*$"
);

/// A string that matches `P` (`type: string, pattern: P::PATTERN` in the
/// schema). Parsing refuses any other; in a JSON body [`crate::payload::JsonBody`]
/// has refused it already, naming the field.
pub struct Matching<P>(String, PhantomData<fn() -> P>);

impl<P: Pattern> Matching<P> {
    /// `value` when it matches `P`.
    pub fn new(value: impl Into<String>) -> Option<Self> {
        let value = value.into();
        P::regex()
            .is_match(&value)
            .then_some(Matching(value, PhantomData))
    }

    /// The string.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The string, owned.
    pub fn into_string(self) -> String {
        self.0
    }
}

impl<P> Clone for Matching<P> {
    fn clone(&self) -> Self {
        Matching(self.0.clone(), PhantomData)
    }
}

impl<P> std::fmt::Debug for Matching<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl<P> PartialEq for Matching<P> {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}

impl<P> Eq for Matching<P> {}

impl<P> Deref for Matching<P> {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl<P> AsRef<str> for Matching<P> {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl<P: Pattern> Type for Matching<P> {
    const IS_REQUIRED: bool = true;
    type RawValueType = Self;
    type RawElementValueType = Self;

    fn name() -> Cow<'static, str> {
        // As a `String` with a pattern validator is named in parse errors.
        "string".into()
    }

    fn schema_ref() -> MetaSchemaRef {
        let mut schema = MetaSchema::new("string");
        schema.pattern = Some(P::PATTERN.to_string());
        MetaSchemaRef::Inline(Box::new(schema))
    }

    fn as_raw_value(&self) -> Option<&Self> {
        Some(self)
    }

    fn raw_element_iter<'a>(&'a self) -> Box<dyn Iterator<Item = &'a Self> + 'a> {
        Box::new(self.as_raw_value().into_iter())
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// What poem-openapi's pattern validator said of a value that does not match.
fn mismatch<P: Pattern>() -> ParseError<Matching<P>> {
    ParseError::custom(format!("verification failed. pattern(\"{}\")", P::PATTERN))
}

impl<P: Pattern> ParseFromJSON for Matching<P> {
    fn parse_from_json(value: Option<Value>) -> ParseResult<Self> {
        let s = String::parse_from_json(value).map_err(ParseError::propagate)?;
        Matching::new(s).ok_or_else(mismatch::<P>)
    }
}

impl<P: Pattern> ParseFromParameter for Matching<P> {
    fn parse_from_parameter(value: &str) -> ParseResult<Self> {
        Matching::new(value).ok_or_else(mismatch::<P>)
    }
}

impl<P: Pattern> ToJSON for Matching<P> {
    fn to_json(&self) -> Option<Value> {
        Some(Value::String(self.0.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compiles_each_pattern_once() {
        let a = compiled(r"^a+$").unwrap();
        let b = compiled(r"^a+$").unwrap();
        assert!(std::ptr::eq(a, b));
        assert!(std::ptr::eq(
            NoNul::regex(),
            compiled(NoNul::PATTERN).unwrap()
        ));
        assert!(compiled("(").is_none());
    }

    #[test]
    fn parses_only_matching_strings() {
        assert!(Matching::<NoNul>::parse_from_json(Some(Value::from("Ann"))).is_ok());
        assert!(Matching::<NoNul>::parse_from_json(Some(Value::from("A\0nn"))).is_err());
        assert!(Matching::<NoNul>::parse_from_parameter("a\0").is_err());
        let MetaSchemaRef::Inline(s) = Matching::<NoNul>::schema_ref() else {
            panic!("inline schema expected");
        };
        assert_eq!(
            (s.ty, s.pattern.as_deref()),
            ("string", Some(NoNul::PATTERN))
        );
    }
}
