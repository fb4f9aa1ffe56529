//! `vkdecode run` (placeholder until its issue lands).

/// Arguments of `run`.
#[derive(clap::Args, Debug)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("`run` is not built yet")
}
