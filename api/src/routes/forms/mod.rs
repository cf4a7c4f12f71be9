//! Public forms: contact and waitlist.

pub mod contact;
pub mod waitlist;
