//! `vkdecode convert` (placeholder until its issue lands).

/// Arguments of `convert`.
#[derive(clap::Args, Debug)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("`convert` is not built yet")
}
