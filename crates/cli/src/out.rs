//! Standard output that a closed pipe (`| head -1`) ends quietly: std's `println!`
//! panics on EPIPE, so every subcommand prints through [`out!`]/[`outln!`] (defined in
//! main.rs), and `main` treats a broken-pipe error as a quiet end.

use std::io::Write;

/// Writes to stdout; when the reader has gone away, exits at once with status 0 (nothing
/// more can be shown, and that is not an error). Other write errors are reported.
pub fn write_stdout(args: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_fmt(args).and_then(|()| out.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("error: writing to stdout: {e}");
        std::process::exit(1);
    }
}

/// True when `err`'s chain holds a broken pipe (stdout closed by its reader).
pub fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
