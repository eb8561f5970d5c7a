//! Where a revision's manifest files come from. Today: a directory on disk (`validate`,
//! `plan` on a checkout); the git source for the agent lands beside it.

pub mod directory;
