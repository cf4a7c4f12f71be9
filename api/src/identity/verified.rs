//! A bounded memory of bearer tokens whose signature already verified.
//!
//! A JWT's signature, `aud` and `iss` never change, so once a token verified
//! against a key its claims can be reused: a hit only needs the `exp` check
//! again, which the caller does (the claims types differ). Checking an ES256
//! signature costs tens of microseconds; a lookup, well under one. A client
//! sends the same access token until it refreshes (an hour by default), so
//! nearly every request after the first is a hit.
//!
//! The map is cleared when it reaches its bound (no eviction order to keep).
//! Whoever owns a cache decides its lifetime: a JWKS fetch starts an empty one
//! so that a removed key stops counting.

use std::{
    collections::HashMap,
    sync::{PoisonError, RwLock},
};

/// Verified tokens (the whole compact JWT as the key) with their claims `T`.
#[derive(Debug)]
pub struct VerifiedTokens<T> {
    map: RwLock<HashMap<Box<str>, T>>,
    max: usize,
}

impl<T: Clone> VerifiedTokens<T> {
    /// An empty cache of at most `max` tokens.
    pub fn new(max: usize) -> Self {
        VerifiedTokens {
            map: RwLock::default(),
            max,
        }
    }

    /// The claims of `token` if it verified before (the caller re-checks `exp`).
    pub fn get(&self, token: &str) -> Option<T> {
        self.map
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(token)
            .cloned()
    }

    /// Remembers that `token` verified with these claims.
    pub fn insert(&self, token: &str, claims: &T) {
        let mut map = self.map.write().unwrap_or_else(PoisonError::into_inner);
        if map.len() >= self.max {
            map.clear();
        }
        map.insert(token.into(), claims.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_and_stays_bounded() {
        let c = VerifiedTokens::new(2);
        assert_eq!(c.get("a"), None::<u8>);
        c.insert("a", &1);
        c.insert("b", &2);
        assert_eq!((c.get("a"), c.get("b")), (Some(1), Some(2)));
        c.insert("c", &3); // full: starts over
        assert_eq!((c.get("a"), c.get("c")), (None, Some(3)));
    }
}
