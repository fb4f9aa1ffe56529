//! Standard output that a closed pipe (`| head -1`) ends quietly, and standard error that
//! never panics: std's `println!` panics on EPIPE and `eprintln!` on any write error
//! (`2>/dev/full`), so every subcommand prints through [`out!`]/[`outln!`] and
//! [`errln!`]/[`errprint!`] (defined in main.rs), and `main` treats a broken-pipe error
//! as a quiet end.

use std::io::Write;

/// Writes to stdout; when the reader has gone away, exits at once with status 0 (nothing
/// more can be shown, and that is not an error). Other write errors are reported.
pub fn write_stdout(args: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_fmt(args).and_then(|()| out.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        write_stderr(format_args!("error: writing to stdout: {e}\n"));
        std::process::exit(1);
    }
}

/// Writes to stderr, losing the message when stderr cannot take it (closed, full): there
/// is nowhere else to report that, and it must not end the command.
pub fn write_stderr(args: std::fmt::Arguments<'_>) {
    let _ = std::io::stderr().lock().write_fmt(args);
}

/// True when `err`'s chain holds a broken pipe (stdout closed by its reader).
pub fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
