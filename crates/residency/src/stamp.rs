//! Has the model file been rewritten since it was mapped? A cheap check (one `fstat`)
//! that a generation loop can run between tokens.
//!
//! A file rewritten in place keeps its inode but changes its size or modification time;
//! the mapping then shows the new bytes (wrong weights, silently) or faults where the
//! file shrank (see [`super::sigbus`]). A file replaced by rename is harmless: the mapping
//! keeps the old inode's pages. So the check looks at the inode that is mapped, through
//! a descriptor opened when the weights were loaded, not at whatever the path names now.
//! The window between the header being mapped and this descriptor being opened is not
//! covered (a rename in that window goes unseen).
#![forbid(unsafe_code)]

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The model file changed while mapped.
#[derive(Debug, thiserror::Error)]
#[error(
    "the model file {path} changed while mapped ({what}); replace model files by rename, \
     never rewrite them in place"
)]
pub struct FileChanged {
    /// The model file.
    pub path: PathBuf,
    /// What differs, e.g. `size 98362432 -> 50000000`.
    pub what: String,
}

/// Size and modification time of the mapped inode, and a descriptor to look again.
#[derive(Debug)]
pub struct FileStamp {
    path: PathBuf,
    file: File,
    len: u64,
    mtime: (i64, i64),
    ino: u64,
}

impl FileStamp {
    /// Opens `path` and records what it is now.
    pub fn take(path: &Path) -> std::io::Result<FileStamp> {
        let file = File::open(path)?;
        let m = file.metadata()?;
        Ok(FileStamp {
            path: path.to_path_buf(),
            file,
            len: m.len(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ino: m.ino(),
        })
    }

    /// The size recorded.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the recorded size is zero.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// `Err` when the inode's size or modification time differs from the recording.
    pub fn check(&self) -> Result<(), FileChanged> {
        let changed = |what: String| FileChanged {
            path: self.path.clone(),
            what,
        };
        let m = self
            .file
            .metadata()
            .map_err(|e| changed(format!("cannot stat it: {e}")))?;
        debug_assert_eq!(m.ino(), self.ino, "fstat of the same descriptor");
        if m.len() != self.len {
            return Err(changed(format!("size {} -> {}", self.len, m.len())));
        }
        let mtime = (m.mtime(), m.mtime_nsec());
        if mtime != self.mtime {
            return Err(changed(format!(
                "modified at {}.{:09} s, loaded at {}.{:09} s",
                mtime.0, mtime.1, self.mtime.0, self.mtime.1
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("vkdecode-stamp-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("model.gguf");
        std::fs::write(&p, vec![7u8; 10_000]).unwrap();
        p
    }

    #[test]
    fn unchanged_file_passes() {
        let p = scratch("same");
        let s = FileStamp::take(&p).unwrap();
        assert_eq!(s.len(), 10_000);
        s.check().unwrap();
        std::fs::remove_dir_all(p.parent().unwrap()).ok();
    }

    #[test]
    fn truncation_and_rewrite_in_place_are_caught() {
        let p = scratch("inplace");
        let s = FileStamp::take(&p).unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&p)
            .unwrap()
            .set_len(4096)
            .unwrap();
        let e = s.check().unwrap_err().to_string();
        assert!(e.contains("size 10000 -> 4096"), "{e}");
        assert!(e.contains(&p.display().to_string()), "{e}");

        // same size, new bytes (`cp other.gguf model.gguf` of an equal-sized file)
        let p2 = scratch("rewrite");
        let s = FileStamp::take(&p2).unwrap();
        let old = std::fs::metadata(&p2).unwrap().modified().unwrap();
        let mut f = std::fs::OpenOptions::new().write(true).open(&p2).unwrap();
        f.write_all(&[9u8; 100]).unwrap();
        // a coarse clock could give the same mtime: set a different one explicitly
        f.set_modified(old + std::time::Duration::from_secs(5))
            .unwrap();
        drop(f);
        let e = s.check().unwrap_err().to_string();
        assert!(e.contains("modified at"), "{e}");
        std::fs::remove_dir_all(p.parent().unwrap()).ok();
        std::fs::remove_dir_all(p2.parent().unwrap()).ok();
    }

    #[test]
    fn replacement_by_rename_is_not_a_change() {
        let p = scratch("rename");
        let s = FileStamp::take(&p).unwrap();
        let tmp = p.with_extension("new");
        std::fs::write(&tmp, vec![1u8; 123]).unwrap();
        std::fs::rename(&tmp, &p).unwrap();
        s.check().unwrap();
        std::fs::remove_dir_all(p.parent().unwrap()).ok();
    }
}
