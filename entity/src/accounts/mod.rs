//! Accounts: users and their roles, the profile, the avatar, and the reads of
//! an account (`GET /api/me`, the admin's list of users).

pub mod avatar;
pub mod profile;
pub mod reads;
pub mod roles;
pub mod users;
