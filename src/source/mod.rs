//! Where a revision's manifest files come from:
//! - [`directory`]: a checkout on disk (`validate`, `plan`, `apply`, `check`);
//! - [`git`]: the agent's bare gix mirror, manifests read from the fetched commit's tree.

pub mod directory;
pub mod git;
#[cfg(test)]
pub(crate) mod test_repo;
pub mod verify;
