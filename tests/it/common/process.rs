//! The built binaries as child processes: started with their standard output read line by
//! line, their announced addresses read, stopped with a signal.

use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt as _, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

/// A child's standard output, line by line.
pub type Stdout = Lines<BufReader<ChildStdout>>;

/// How long a binary may take to announce itself.
const ANNOUNCE: Duration = Duration::from_secs(30);

/// How long a binary may take to stop on a signal.
const STOP: Duration = Duration::from_secs(15);

/// The test build of `opjournal` or `opjournal-reconciler`.
pub fn binary(name: &str) -> &'static str {
    match name {
        "opjournal" => env!("CARGO_BIN_EXE_opjournal"),
        "opjournal-reconciler" => env!("CARGO_BIN_EXE_opjournal-reconciler"),
        other => panic!("no binary {other}"),
    }
}

/// Starts `command` with its standard output piped (killed when dropped); returns it and
/// that output.
pub fn spawn_piped(command: &mut Command) -> (Child, Stdout) {
    let mut child = command
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {:?}: {e}", command.as_std().get_program()));
    let stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    (child, stdout)
}

/// The next line of `stdout`, within 30 seconds; it must contain `marker`. Returns its last
/// word: the address (or URL) the process announced.
pub async fn announced(stdout: &mut Stdout, marker: &str) -> String {
    let line = tokio::time::timeout(ANNOUNCE, stdout.next_line())
        .await
        .unwrap_or_else(|_| panic!("no '{marker}' line within {ANNOUNCE:?}"))
        .unwrap()
        .unwrap_or_else(|| panic!("the process exited before printing '{marker}'"));
    assert!(line.contains(marker), "{line}");
    line.rsplit(' ').next().unwrap().to_owned()
}

/// Reads `stdout` until every one of `markers` was on a line, in any order, each line within
/// `patience`; returns the last word of each one's line, in the order of `markers`.
pub async fn announced_all(
    stdout: &mut Stdout,
    markers: &[&str],
    patience: Duration,
) -> Vec<String> {
    let mut found = vec![None; markers.len()];
    while found.iter().any(Option::is_none) {
        let line = tokio::time::timeout(patience, stdout.next_line())
            .await
            .expect("the process printed its addresses")
            .unwrap()
            .expect("the process exited before printing its addresses");
        for (marker, slot) in markers.iter().zip(&mut found) {
            if line.contains(marker) {
                *slot = Some(line.rsplit(' ').next().unwrap().to_owned());
            }
        }
    }
    found.into_iter().map(Option::unwrap).collect()
}

/// [`spawn_piped`], then [`announced`]: the child and the address of its first line.
pub async fn spawn_announcing(command: &mut Command, marker: &str) -> (Child, String) {
    let (child, mut stdout) = spawn_piped(command);
    let address = announced(&mut stdout, marker).await;
    (child, address)
}

/// Sends `signal` (`-TERM`, `-KILL`, …) to `child` and waits up to 15 seconds for it to exit.
pub async fn stop(mut child: Child, signal: &str) -> ExitStatus {
    let pid = child.id().expect("the process is running").to_string();
    let killed = Command::new("kill")
        .args([signal, &pid])
        .status()
        .await
        .unwrap();
    assert!(killed.success());
    tokio::time::timeout(STOP, child.wait())
        .await
        .unwrap_or_else(|_| panic!("the process stops on {signal}"))
        .unwrap()
}

/// Stops `child` with SIGTERM; it must exit successfully.
pub async fn terminate(child: Child) {
    let status = stop(child, "-TERM").await;
    assert!(status.success(), "exit status {status}");
}
