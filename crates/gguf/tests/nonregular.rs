//! A model path that is not a regular file is refused at once (before:
//! opening a FIFO blocked forever, waiting for a writer).

use std::sync::mpsc;
use std::time::Duration;

use gguf::GgufFile;

/// Opens `path` on another thread; fails the test instead of hanging when it blocks.
fn open_within(path: std::path::PathBuf, limit: Duration) -> String {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(GgufFile::open(&path).map(|_| ()));
    });
    match rx.recv_timeout(limit) {
        Ok(Ok(())) => panic!("a non-regular file opened as a model"),
        Ok(Err(e)) => e.to_string(),
        Err(_) => panic!("GgufFile::open blocked for more than {limit:?}"),
    }
}

#[test]
fn a_fifo_is_refused_without_blocking() {
    let dir = std::env::temp_dir().join(format!("gguf-fifo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let fifo = dir.join("model.gguf");
    let _ = std::fs::remove_file(&fifo);
    let st = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo runs");
    assert!(st.success(), "mkfifo failed");
    let msg = open_within(fifo.clone(), Duration::from_secs(10));
    assert!(
        msg.contains("model.gguf") && msg.contains("a FIFO") && msg.contains("regular file"),
        "{msg}"
    );
    // A directory too.
    let msg = open_within(dir.clone(), Duration::from_secs(10));
    assert!(msg.contains("a directory"), "{msg}");
    let _ = std::fs::remove_file(&fifo);
    let _ = std::fs::remove_dir(&dir);
}
