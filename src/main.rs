//! The `proxops` binary: parse the command line, set up logging, run, map to an exit code.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = proxops::cli::Cli::parse();
    proxops::telemetry::init(cli.verbosity());
    match proxops::cli::run(cli) {
        Ok(code) => code.into(),
        Err(error) => {
            proxops::output::print_error(&error);
            proxops::cli::Exit::Failure.into()
        }
    }
}
