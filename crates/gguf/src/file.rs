//! A GGUF file mapped into memory: the one place this crate uses `unsafe`.

use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::error::GgufError;
use crate::reader::{Gguf, TensorInfo};

/// A GGUF file mapped read-only and shared (`MAP_SHARED`, `PROT_READ`), with its parsed
/// header. Tensor data is read straight from the mapping: the bytes are the page cache.
#[derive(Debug)]
pub struct GgufFile {
    gguf: Gguf,
    mmap: Mmap,
    path: PathBuf,
}

impl GgufFile {
    /// Maps `path` and parses its header.
    ///
    /// The file must not be truncated or modified while the `GgufFile` (or any
    /// borrow of its bytes, or any GPU import of its pages) lives: a shrunken file makes
    /// later reads of the mapping fault (SIGBUS), and a modified one changes the bytes
    /// under the parsed header. Replace model files by writing a new file and renaming
    /// it over the old one, which leaves existing mappings intact.
    #[allow(unsafe_code)]
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        let path = path.as_ref().to_path_buf();
        let io_err = |err| GgufError::Io {
            path: path.clone(),
            err,
        };
        // Check the type before opening: opening a FIFO for reading blocks until a
        // writer appears (forever, for a model path), and a device can be endless.
        let not_regular = |meta: &std::fs::Metadata| {
            io_err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "not a regular file (it is {}); a model must be a regular file",
                    file_kind(meta)
                ),
            ))
        };
        let meta = std::fs::metadata(&path).map_err(io_err)?;
        if !meta.is_file() {
            return Err(not_regular(&meta));
        }
        let file = File::open(&path).map_err(io_err)?;
        // The path may have been replaced between the two calls: check what was opened.
        let meta = file.metadata().map_err(io_err)?;
        if !meta.is_file() {
            return Err(not_regular(&meta));
        }
        // SAFETY: memmap2 maps the file read-only and shared. The mapping is sound as
        // long as no one truncates or writes the file while it is mapped; that contract
        // is documented on this function and in models/README.md (files are replaced by
        // rename, never rewritten in place). The map is never exposed mutably.
        let mmap = unsafe { Mmap::map(&file) }.map_err(io_err)?;
        let _span =
            tracing::debug_span!("gguf_open", path = %path.display(), bytes = mmap.len()).entered();
        let gguf = Gguf::parse(&mmap).map_err(|e| e.context(path.display().to_string()))?;
        tracing::debug!(
            tensors = gguf.tensors.len(),
            metadata = gguf.metadata.len(),
            data_offset = gguf.data_offset,
            "parsed GGUF header"
        );
        Ok(GgufFile { gguf, mmap, path })
    }

    /// The parsed header.
    pub fn gguf(&self) -> &Gguf {
        &self.gguf
    }

    /// The whole file.
    pub fn bytes(&self) -> &[u8] {
        &self.mmap
    }

    /// The mapping itself (for importing its pages into a GPU).
    pub fn mmap(&self) -> &Mmap {
        &self.mmap
    }

    /// The path it was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A tensor's bytes, borrowed from the mapping.
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        self.gguf.tensor_data(&self.mmap, t)
    }
}

/// What a non-regular file is, in words.
fn file_kind(meta: &std::fs::Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    }
}
