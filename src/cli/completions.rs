//! `proxops completions <shell>` and `proxops man`: shell completions and manual pages
//! generated from the clap definition, so they never disagree with `--help`. Both are hidden
//! (they are for packagers); `packaging/build-deb.sh` runs them to put the files in the .deb.

use std::io::Write as _;
use std::path::PathBuf;

use anyhow::Context as _;
use clap::CommandFactory as _;

use crate::cli::{Cli, Exit};

/// Arguments of `proxops completions`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The shell to write completions for.
    shell: clap_complete::Shell,
}

/// Arguments of `proxops man`.
#[derive(Debug, clap::Args)]
pub struct ManArgs {
    /// Write one page per subcommand (proxops.1, proxops-agent.1, …) into this directory
    /// instead of proxops.1 on stdout.
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
}

/// Writes the completion script for `args.shell` on stdout.
pub fn run(args: &Args) -> anyhow::Result<Exit> {
    let mut command = Cli::command();
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut command, "proxops", &mut script);
    write_stdout(&script)?;
    Ok(Exit::Success)
}

/// Writes the manual page(s).
pub fn man(args: &ManArgs) -> anyhow::Result<Exit> {
    let command = Cli::command();
    if let Some(dir) = &args.dir {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        clap_mangen::generate_to(command, dir)
            .with_context(|| format!("writing manual pages into {}", dir.display()))?;
    } else {
        let mut page = Vec::new();
        clap_mangen::Man::new(command).render(&mut page)?;
        write_stdout(&page)?;
    }
    Ok(Exit::Success)
}

fn write_stdout(bytes: &[u8]) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(bytes)?;
    stdout.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shell_gets_a_completion_script_naming_the_subcommands() {
        for shell in [
            clap_complete::Shell::Bash,
            clap_complete::Shell::Zsh,
            clap_complete::Shell::Fish,
        ] {
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "proxops", &mut script);
            let script = String::from_utf8(script).unwrap();
            assert!(script.contains("agent"), "{shell}: {script}");
            assert!(script.contains("validate"), "{shell}");
        }
    }

    #[test]
    fn man_pages_cover_each_visible_subcommand_and_not_the_hidden_ones() {
        let dir = tempfile::tempdir().unwrap();
        man(&ManArgs {
            dir: Some(dir.path().to_path_buf()),
        })
        .unwrap();
        let mut names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert!(names.contains(&"proxops.1".to_owned()), "{names:?}");
        assert!(names.contains(&"proxops-agent.1".to_owned()), "{names:?}");
        assert!(
            !names.iter().any(|n| n.contains("completions")),
            "{names:?}"
        );
        assert!(!names.iter().any(|n| n == "proxops-man.1"), "{names:?}");
    }
}
