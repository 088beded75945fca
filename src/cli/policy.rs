//! `tiergate policy`: `check` reads a policy directory here; the rest (`diff`, `apply`,
//! `history`, `rollback`) goes to a running gateway's admin API ([`super::admin`]).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Subcommand;
use tiergate::policy::Policy;

use super::admin;

/// `tiergate policy`'s subcommands.
#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Validate every *.toml file in DIR as one policy; print every problem with its
    /// file and path, and exit non-zero if there is any.
    Check {
        /// The policy directory.
        dir: PathBuf,
    },
    #[command(flatten)]
    Admin(admin::PolicyOps),
}

/// Runs `tiergate policy`.
pub fn run(command: PolicyCommand) -> anyhow::Result<ExitCode> {
    match command {
        PolicyCommand::Check { dir } => Ok(check(&dir)),
        PolicyCommand::Admin(command) => super::runtime(1)?.block_on(admin::policy(command)),
    }
}

/// `tiergate policy check DIR`: every problem with its file and path, and a note for
/// each table its flag leaves inert.
fn check(dir: &Path) -> ExitCode {
    if dir.is_file() {
        eprintln!(
            "{} is a file: tiergate policy check takes the policy directory (such as {}), and checks every .toml \
             file in it together",
            dir.display(),
            dir.parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new("."))
                .display()
        );
        return ExitCode::FAILURE;
    }
    match Policy::load_dir(dir) {
        Ok(policy) => {
            println!("{}: ok, {} routes", dir.display(), policy.routes().len());
            // A table whose flag is off does nothing: valid, but maybe not what was meant.
            for route in policy.routes() {
                let inert = [
                    ("cache", route.cache.is_some() && !route.flags.cache),
                    ("shadow", route.shadow.is_some() && !route.flags.shadow),
                ];
                for (table, off) in inert {
                    if off {
                        println!(
                            "note: {}: routes.{}.{table} is inert while the {table} flag is off \
                             (tiergate flags set {} {table} on)",
                            route.file.display(),
                            route.name,
                            route.name
                        );
                    }
                }
            }
            ExitCode::SUCCESS
        }
        Err(problems) => {
            eprintln!("{problems}");
            eprintln!("{} problem(s) in {}", problems.0.len(), dir.display());
            ExitCode::FAILURE
        }
    }
}
