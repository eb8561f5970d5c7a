//! Logging: `tracing` to stderr (journald reads stderr), filtered by `RUST_LOG` or `-v`.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// Installs the global subscriber. `verbosity` 0 = warn, 1 = info, 2 = debug, 3+ = trace;
/// `RUST_LOG` wins when set.
pub fn init(verbosity: u8) {
    let default = match verbosity {
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    // A second init (tests calling run twice) is harmless: keep the first subscriber.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour only for a person at a terminal: journald and log files get plain text.
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .try_init();
}
