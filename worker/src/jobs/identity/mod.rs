//! Identity jobs: the provider's mails (confirmation, magic link, recovery,
//! email change, reauthentication, password notice).

pub mod auth_email;
