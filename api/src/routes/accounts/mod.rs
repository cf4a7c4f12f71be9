//! Accounts: the caller's account (`/api/me`), profile, avatar uploads and
//! files (`/storage/v1`), the admin's role switch and list of users.

pub mod admin;
pub mod avatar;
pub mod me;
pub mod profile;
pub mod storage;
pub mod users;
