//! `tiergate auth`: data-plane API keys, made here and let in by the keys file's line.

use std::process::ExitCode;

use clap::Subcommand;

/// `tiergate auth`'s subcommands.
#[derive(Debug, Subcommand)]
pub enum AuthCommand {
    /// Print a new random API key for TENANT, and the line for the keys file (which
    /// holds only the key's SHA-256, never the key).
    NewKey {
        /// The tenant the key lets in: 1 to 64 letters, digits, '.', '_' or '-'.
        tenant: String,
    },
}

/// Runs `tiergate auth`.
pub fn run(command: AuthCommand) -> anyhow::Result<ExitCode> {
    match command {
        AuthCommand::NewKey { tenant } => new_key(&tenant),
    }
}

/// `tiergate auth new-key TENANT`: a key of 32 random bytes (hex, `tg_` first) and its
/// keys-file line.
fn new_key(tenant: &str) -> anyhow::Result<ExitCode> {
    if !tiergate::front::auth::valid_tenant(tenant) {
        anyhow::bail!("the tenant must be 1 to 64 letters, digits, '.', '_' or '-', got {tenant:?}");
    }
    let key: String = (0..32).map(|_| format!("{:02x}", rand::random::<u8>())).collect();
    let key = format!("tg_{key}");
    println!("key (give it to the tenant; it is not kept anywhere): {key}");
    println!("line for auth.keys_file: {}", tiergate::front::auth::line(tenant, &key));
    Ok(ExitCode::SUCCESS)
}
