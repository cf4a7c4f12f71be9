//! Account jobs: deleting an avatar a profile save left unreferenced.

pub mod avatar_cleanup;
