//! Reading text the user points us at (`tokenize --file`, `--prompt-ids @FILE`): regular
//! files only, and never more than a cap, so `/dev/zero` or a FIFO cannot eat memory or
//! hang the process. And lines typed or piped into `chat`, each held only up to a bound.

use std::io::{BufRead, Read};
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

/// What [`read_line`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum LineRead {
    /// A line, without its `\n`, in the caller's buffer.
    Line,
    /// A line longer than the bound, read to its end and dropped; its length in bytes.
    TooLong(u64),
    /// End of input.
    Eof,
}

/// Reads one line into `buf` (cleared first), holding at most `max` bytes of it: a longer
/// line is read to its end and dropped as it comes, so its length costs no memory. The
/// last line may lack its `\n`.
pub fn read_line(r: &mut impl BufRead, max: usize, buf: &mut Vec<u8>) -> std::io::Result<LineRead> {
    buf.clear();
    let mut len: u64 = 0;
    let mut started = false;
    loop {
        let chunk = match r.fill_buf() {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if chunk.is_empty() {
            return Ok(match (started, len > max as u64) {
                (false, _) => LineRead::Eof,
                (true, true) => LineRead::TooLong(len),
                (true, false) => LineRead::Line,
            });
        }
        started = true;
        let newline = chunk.iter().position(|&b| b == b'\n');
        let part = &chunk[..newline.unwrap_or(chunk.len())];
        len += part.len() as u64;
        if len <= max as u64 {
            buf.extend_from_slice(part);
        } else {
            buf.clear();
        }
        let used = newline.map_or(chunk.len(), |i| i + 1);
        r.consume(used);
        if newline.is_some() {
            return Ok(if len > max as u64 {
                LineRead::TooLong(len)
            } else {
                LineRead::Line
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_held_up_to_the_bound_and_longer_ones_skipped() {
        // a reader that hands out 3 bytes at a time, as a pipe may
        let text = b"short\nmuch too long a line\n\nlast";
        let mut r = std::io::BufReader::with_capacity(3, &text[..]);
        let mut buf = Vec::new();
        let mut next = |buf: &mut Vec<u8>| read_line(&mut r, 8, buf).unwrap();
        assert_eq!(next(&mut buf), LineRead::Line);
        assert_eq!(buf, b"short");
        assert_eq!(next(&mut buf), LineRead::TooLong(20));
        assert!(buf.capacity() <= 16, "the long line was not held");
        assert_eq!(next(&mut buf), LineRead::Line);
        assert_eq!(buf, b"");
        assert_eq!(next(&mut buf), LineRead::Line);
        assert_eq!(buf, b"last");
        assert_eq!(next(&mut buf), LineRead::Eof);
    }
}
