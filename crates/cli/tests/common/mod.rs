//! Shared by the CLI tests that run crafted copies of the default model: the binary, the
//! model, and copies with one thing changed (written to a temporary directory; the
//! shared model file is never touched).
#![allow(dead_code)]

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use gguf::{GgmlType, Gguf, GgufWriter, Value};

pub fn q8() -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models/SmolLM2-135M-Instruct.Q8_0.gguf");
    assert!(
        path.exists(),
        "{} is missing: run models/fetch to download the default model",
        path.display()
    );
    path
}

pub fn vkdecode(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vkdecode"))
        .args(args)
        .output()
        .expect("run vkdecode")
}

/// A fresh directory under the system's temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!(
            "vkdecode-{tag}-{}-{:?}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Rewrites the default model with one metadata value changed, reusing the tensors.
pub struct Mutator {
    writer: GgufWriter,
    pub metadata: Vec<(String, Value)>,
    /// The original file's bytes.
    pub bytes: Vec<u8>,
}

impl Mutator {
    pub fn new(path: &Path) -> Mutator {
        let bytes = std::fs::read(path).unwrap();
        let g = Gguf::parse(&bytes).unwrap();
        let mut writer = GgufWriter::new(g.alignment);
        for (k, v) in &g.metadata {
            writer.add_metadata(k.clone(), v.clone());
        }
        for t in &g.tensors {
            let data = g.tensor_data(&bytes, t).to_vec();
            writer
                .add_tensor(t.name.clone(), t.ty, &t.shape, data)
                .unwrap();
        }
        Mutator {
            writer,
            metadata: g.metadata.clone(),
            bytes,
        }
    }

    /// Writes the model with `key` set to `value` to `out` (then restores the key).
    pub fn write_with(&mut self, key: &str, value: Value, out: &Path) {
        let mut f = std::io::BufWriter::new(std::fs::File::create(out).unwrap());
        self.write_into(key, value, &mut f).unwrap();
    }

    /// Writes the model with `key` set to `value` into `w` (then restores the key).
    pub fn write_into(&mut self, key: &str, value: Value, w: &mut impl Write) -> io::Result<()> {
        let original = self
            .metadata
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("no key {key}"));
        self.writer.add_metadata(key, value);
        let written = self.writer.write_to(w);
        self.writer.add_metadata(key, original);
        written
    }
}

/// Writes `src` into `w` with the key `key` (a 4-byte scalar in the file) given the type
/// tag `tag` and the 4 bytes `value`, in place (the header keeps its size). For keys the
/// writer rewrites itself (`general.alignment`).
pub fn patch_u32_slot(
    src: &[u8],
    key: &str,
    tag: u32,
    value: [u8; 4],
    w: &mut impl Write,
) -> io::Result<()> {
    let needle: Vec<u8> = (key.len() as u64)
        .to_le_bytes()
        .into_iter()
        .chain(key.bytes())
        .collect();
    let at = src
        .windows(needle.len())
        .position(|w| w == needle.as_slice())
        .unwrap_or_else(|| panic!("{key} not in the header"));
    let tag_at = at + needle.len();
    w.write_all(&src[..tag_at])?;
    w.write_all(&tag.to_le_bytes())?;
    w.write_all(&value)?;
    w.write_all(&src[tag_at + 8..])
}

/// A file that holds a copy of `base` and takes one variant of it after another, writing
/// only the 64 KiB blocks in which the variant differs from `base` (and putting back the
/// blocks the previous variant changed). A model with one metadata value changed differs
/// in its header alone, unless the header's growth moves the tensor data: rewriting the
/// whole 145 MB file for each of mutation_cli's 167 variants cost more system time than
/// the runs themselves.
pub struct Rewriter<'a> {
    base: &'a [u8],
    file: std::fs::File,
    /// The blocks where the file differs from `base`.
    dirty: Vec<usize>,
}

const BLOCK: usize = 64 << 10;

impl<'a> Rewriter<'a> {
    /// Writes `base` to `path`.
    pub fn new(base: &'a [u8], path: &Path) -> Rewriter<'a> {
        std::fs::write(path, base).unwrap();
        let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
        Rewriter {
            base,
            file,
            dirty: Vec::new(),
        }
    }

    /// Makes the file the bytes that `produce` writes.
    pub fn write(&mut self, produce: impl FnOnce(&mut BlockSink) -> io::Result<()>) {
        use std::os::unix::fs::FileExt;
        for b in self.dirty.drain(..) {
            let start = b * BLOCK;
            if start < self.base.len() {
                let end = (start + BLOCK).min(self.base.len());
                self.file
                    .write_all_at(&self.base[start..end], start as u64)
                    .unwrap();
            }
        }
        let mut sink = BlockSink {
            base: self.base,
            file: &self.file,
            dirty: &mut self.dirty,
            block: Vec::with_capacity(BLOCK),
            index: 0,
        };
        produce(&mut sink).unwrap();
        sink.flush().unwrap();
        let len = sink.index * BLOCK + sink.block.len();
        self.file.set_len(len as u64).unwrap();
        // a variant shorter than `base` cut off the blocks after its end
        self.dirty
            .extend(len / BLOCK..self.base.len().div_ceil(BLOCK));
    }
}

/// What [`Rewriter::write`] hands its producer: bytes in order, gathered into blocks.
pub struct BlockSink<'a, 'b> {
    base: &'a [u8],
    file: &'b std::fs::File,
    dirty: &'b mut Vec<usize>,
    block: Vec<u8>,
    /// The index of the block being gathered.
    index: usize,
}

impl BlockSink<'_, '_> {
    /// Writes the gathered block unless the file holds the same bytes there already.
    fn write_block(&mut self) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        let start = self.index * BLOCK;
        let same = self.base.get(start..start + self.block.len()) == Some(self.block.as_slice());
        if !same {
            self.file.write_all_at(&self.block, start as u64)?;
            self.dirty.push(self.index);
        }
        Ok(())
    }
}

impl Write for BlockSink<'_, '_> {
    fn write(&mut self, mut buf: &[u8]) -> io::Result<usize> {
        let n = buf.len();
        while !buf.is_empty() {
            let take = (BLOCK - self.block.len()).min(buf.len());
            self.block.extend_from_slice(&buf[..take]);
            buf = &buf[take..];
            if self.block.len() == BLOCK {
                self.write_block()?;
                self.block.clear();
                self.index += 1;
            }
        }
        Ok(n)
    }

    /// Writes the last, partial block (the end of the file).
    fn flush(&mut self) -> io::Result<()> {
        if !self.block.is_empty() {
            self.write_block()?;
        }
        Ok(())
    }
}

/// Copies `src` to `out` with every element of the f32 tensor `name` set to NaN.
pub fn nan_tensor(src: &Path, name: &str, out: &Path) {
    let mut bytes = std::fs::read(src).unwrap();
    let g = Gguf::parse(&bytes).unwrap();
    let t = g.tensor(name).unwrap();
    assert_eq!(t.ty, GgmlType::F32, "{name} is not f32");
    let range = g.tensor_range(t);
    for chunk in bytes[range.start as usize..range.end as usize].chunks_exact_mut(4) {
        chunk.copy_from_slice(&f32::NAN.to_le_bytes());
    }
    std::fs::write(out, bytes).unwrap();
}

/// The environment variable that marks every process a test starts (and, through
/// inheritance, every process those start), so the test can find them all in /proc,
/// whoever they were reparented to.
pub const TAG_ENV: &str = "VKDECODE_TEST_TAG";

/// A tag unique to this test process and `name`; the guard kills every process that
/// carries it when dropped, so a failing test leaves none behind.
pub struct Tag(pub String);

impl Tag {
    pub fn new(name: &str) -> Tag {
        Tag(format!("{name}-{}-{}", std::process::id(), nanos()))
    }

    /// Live processes (zombies aside) whose environment carries this tag, with their
    /// command lines.
    pub fn processes(&self) -> Vec<(u32, String)> {
        let needle = format!("{TAG_ENV}={}", self.0);
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        let mut found = Vec::new();
        for entry in dir.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u32>().ok())
            else {
                continue;
            };
            let Ok(env) = std::fs::read(entry.path().join("environ")) else {
                continue;
            };
            if !env.split(|&b| b == 0).any(|v| v == needle.as_bytes()) {
                continue;
            }
            let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
            // the state follows the parenthesised command name: skip zombies and the dead
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, r)| r.trim().chars().next());
            if matches!(state, Some('Z') | Some('X') | None) {
                continue;
            }
            let cmd = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            found.push((pid, cmd));
        }
        found
    }

    /// Waits up to `limit` for every tagged process to be gone; returns those left.
    pub fn wait_gone(&self, limit: std::time::Duration) -> Vec<(u32, String)> {
        let start = std::time::Instant::now();
        loop {
            let left = self.processes();
            if left.is_empty() || start.elapsed() > limit {
                return left;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

impl Drop for Tag {
    fn drop(&mut self) {
        for (pid, _) in self.processes() {
            let _ = signal(pid, "KILL");
        }
    }
}

/// Sends `kill -SIG pid` through kill(1) (no unsafe code in the tests).
pub fn signal(pid: u32, sig: &str) -> bool {
    Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// Collects a child's output stream into a shared string as it arrives.
pub fn collect(
    mut r: impl std::io::Read + Send + 'static,
) -> std::sync::Arc<std::sync::Mutex<String>> {
    let buf = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let b = buf.clone();
    std::thread::spawn(move || {
        let mut chunk = [0u8; 4096];
        while let Ok(n) = r.read(&mut chunk) {
            if n == 0 {
                break;
            }
            b.lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&chunk[..n]));
        }
    });
    buf
}

/// Waits up to a minute for `cond` to hold of what `buf` has collected.
pub fn wait_for(what: &str, buf: &std::sync::Mutex<String>, cond: impl Fn(&str) -> bool) {
    let start = std::time::Instant::now();
    while !cond(&buf.lock().unwrap()) {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(60),
            "waited a minute for {what}: {:?}",
            buf.lock().unwrap()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Whether process `pid` holds a descriptor of a file in `dir`, named or not (a file
/// opened with O_TMPFILE shows as `dir/#inode (deleted)`): how a test sees that a writer
/// has begun its output.
pub fn writes_into(pid: u32, dir: &Path) -> bool {
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten().any(|e| {
        std::fs::read_link(e.path()).is_ok_and(|target| target.parent() == Some(dir.as_path()))
    })
}
