//! `vkdecode info` (placeholder until its issue lands).

/// Arguments of `info`.
#[derive(clap::Args, Debug)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("`info` is not built yet")
}
