//! `vkdecode inspect` (placeholder until its issue lands).

/// Arguments of `inspect`.
#[derive(clap::Args, Debug)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("`inspect` is not built yet")
}
