//! Public forms: the contact form and the waitlist.

pub mod contact;
pub mod waitlist;
