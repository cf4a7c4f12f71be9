//! What every personal read shares: `Cache-Control: private, no-store`
//! answers ([`crate::private_ok`]) and the lists' `cursor` and `limit`.

use entity::base::page::{self, Cursor};

use crate::problem::ApiError;

/// `Cache-Control` of every personal read.
pub const PRIVATE: &str = "private, no-store";

/// Declares a 200 answer with `Cache-Control: private, no-store`.
#[macro_export]
macro_rules! private_ok {
    ($(#[$meta:meta])* $name:ident, $payload:ty, $desc:literal) => {
        $(#[$meta])*
        #[derive(Debug, poem_openapi::ApiResponse)]
        pub enum $name {
            #[doc = $desc]
            #[oai(status = 200)]
            Ok(
                poem_openapi::payload::Json<$payload>,
                /// `private, no-store`: personal data, never cached by a shared cache.
                #[oai(header = "Cache-Control")]
                String,
            ),
        }

        impl $name {
            /// The answer with `Cache-Control: private, no-store`.
            pub fn private(body: $payload) -> Self {
                $name::Ok(poem_openapi::payload::Json(body), $crate::routes::page::PRIVATE.to_string())
            }
        }
    };
}

/// The `cursor` of the read API's lists: [`page::CURSOR_PATTERN`] in the
/// schema, so a cursor the schema admits is a position (or empty: the first
/// page); another is 400 naming `cursor`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListCursor;

impl crate::pattern::Pattern for ListCursor {
    const PATTERN: &'static str = page::CURSOR_PATTERN;
    fn regex() -> &'static regex::Regex {
        static RE: std::sync::LazyLock<&'static regex::Regex> = std::sync::LazyLock::new(|| {
            crate::pattern::compiled(page::CURSOR_PATTERN).expect("the cursor pattern compiles")
        });
        *RE
    }
}

/// Parses the `cursor` and `limit` of a list (400 naming the one at fault);
/// an empty cursor is the first page.
pub fn page_params(
    cursor: Option<&str>,
    limit: Option<u64>,
) -> Result<(Option<Cursor>, u64), ApiError> {
    let cursor = cursor.map(Cursor::decode).transpose()?.flatten();
    Ok((cursor, page::limit(limit)?))
}
