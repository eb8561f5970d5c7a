//! Where a revision's manifest files come from:
//! - [`directory`]: a checkout on disk (`validate`, `plan`, `apply`, `check`);
//! - [`git`]: the agent's bare gix mirror, manifests read from the fetched commit's tree;
//! - [`pull`]: a pull request's head, for a plan preview, in a mirror of its own.

pub mod directory;
pub mod git;
pub mod pull;
#[cfg(test)]
pub(crate) mod test_repo;
pub mod verify;
