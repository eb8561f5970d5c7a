//! End-to-end tests: the built `proxops` binary on example and fixture repositories.
//!
//! One test binary (STYLE H10) with a module per area.

mod cli_validate;
mod readme;
mod support;
