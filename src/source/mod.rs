//! Where a revision's manifest files come from. Today: a directory on disk (`validate`,
//! `plan` on a checkout); the git source for the agent lands beside it.
//! `git`: the agent's bare gix mirror, manifests read from the fetched commit's tree.

pub mod directory;
pub mod git;
#[cfg(test)]
pub(crate) mod test_repo;
