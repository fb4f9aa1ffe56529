//! `vkdecode tokenize` (placeholder until its issue lands).

/// Arguments of `tokenize`.
#[derive(clap::Args, Debug)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("`tokenize` is not built yet")
}
