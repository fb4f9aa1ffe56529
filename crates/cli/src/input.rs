//! Reading text the user points us at (`tokenize --file`, `--prompt-ids @FILE`): regular
//! files only, and never more than a cap, so `/dev/zero` or a FIFO cannot eat memory or
//! hang the process.

use std::io::Read;
use std::path::Path;

use anyhow::{bail, Context as _, Result};

/// Most bytes of text read from a file: 64 MiB, far beyond any context.
pub const MAX_TEXT_BYTES: u64 = 64 << 20;

/// Reads `path` as UTF-8 text, refusing anything but a regular file and anything over
/// [`MAX_TEXT_BYTES`].
pub fn read_text_file(path: &Path, what: &str) -> Result<String> {
    let meta = std::fs::metadata(path)
        .with_context(|| format!("cannot read {what} from {}", path.display()))?;
    if !meta.is_file() {
        bail!(
            "{what}: {} is not a regular file (devices, FIFOs and directories are refused)",
            path.display()
        );
    }
    if meta.len() > MAX_TEXT_BYTES {
        bail!(
            "{what}: {} is {} bytes, over the limit of {MAX_TEXT_BYTES} bytes",
            path.display(),
            meta.len()
        );
    }
    let file = std::fs::File::open(path)
        .with_context(|| format!("cannot read {what} from {}", path.display()))?;
    // the file may grow between the check and the read: read one byte past the cap
    let mut bytes = Vec::new();
    file.take(MAX_TEXT_BYTES + 1)
        .read_to_end(&mut bytes)
        .with_context(|| format!("cannot read {what} from {}", path.display()))?;
    if bytes.len() as u64 > MAX_TEXT_BYTES {
        bail!(
            "{what}: {} grew past the limit of {MAX_TEXT_BYTES} bytes",
            path.display()
        );
    }
    String::from_utf8(bytes)
        .with_context(|| format!("{what}: {} is not UTF-8 text", path.display()))
}
