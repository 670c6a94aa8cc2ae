//! `opjournal dev`: the built binary starts the server, the reconcile worker, the sandbox
//! provider and the review console in one process on port 0s and a temporary data directory;
//! the README's Python example and `opjournal demo --against` run against what it prints; the
//! printed token signs in to the console and another token does not; SIGTERM stops every part
//! with exit code 0; the journal outlives a restart unless `--fresh` is given.
//! The Python client comes from `OPJOURNAL_TEST_CLIENT_PYTHON` or the virtual environment
//! `./scripts/test` prepares (`scripts/client-envs python`).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use opjournal::client::proto::OperationStatus;
use opjournal::client::{ErrorReason, JournalClient};
use tokio::io::{AsyncBufReadExt as _, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

/// The key of the README's example.
const README_KEY: &str = "payment:order-815:intent-01";

/// A guard against a hung child, not a measurement.
const PATIENCE: Duration = Duration::from_secs(60);

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The interpreter with clients/python installed.
fn python() -> PathBuf {
    if let Ok(path) = std::env::var("OPJOURNAL_TEST_CLIENT_PYTHON") {
        return path.into();
    }
    let prepared = repo().join("target/python-client-venv/bin/python");
    if prepared.exists() {
        prepared
    } else {
        "python3".into()
    }
}

/// The Python code of a `.venv/bin/python - <<'PY'` heredoc in `text` (the first one).
fn heredoc(text: &str) -> String {
    let start = text.find("<<'PY'\n").expect("no <<'PY' heredoc") + "<<'PY'\n".len();
    let end = text[start..].find("\nPY\n").expect("unterminated heredoc") + start;
    text[start..end].to_owned()
}

/// A running `opjournal dev` and what it printed.
struct Dev {
    child: Child,
    _stdout: Lines<BufReader<ChildStdout>>,
    banner: String,
    grpc: String,
    sandbox_url: String,
    console_url: String,
    token: String,
}

impl Dev {
    async fn start(data_dir: &Path, extra: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_opjournal"))
            .arg("dev")
            .args(["--listen", "127.0.0.1:0", "--sandbox-listen", "127.0.0.1:0"])
            .args(["--console-listen", "127.0.0.1:0"])
            .arg("--data-dir")
            .arg(data_dir)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut banner = String::new();
        tokio::time::timeout(PATIENCE, async {
            while let Some(line) = stdout.next_line().await.unwrap() {
                banner.push_str(&line);
                banner.push('\n');
                if line.starts_with("opjournal dev ready") {
                    return;
                }
            }
            panic!("opjournal dev exited before it was ready:\n{banner}");
        })
        .await
        .unwrap_or_else(|_| panic!("opjournal dev not ready:\n{banner}"));
        let field = |label: &str| {
            banner
                .lines()
                .find_map(|line| line.trim_start().strip_prefix(label))
                .and_then(|rest| rest.split_whitespace().next())
                .unwrap_or_else(|| panic!("no {label} line in:\n{banner}"))
                .to_owned()
        };
        let grpc = field("gRPC API ");
        let sandbox_url = field("sandbox ");
        let console_url = field("console ");
        let token = field("token ");
        Self {
            child,
            _stdout: stdout,
            banner,
            grpc,
            sandbox_url,
            console_url,
            token,
        }
    }

    async fn client(&self) -> JournalClient {
        JournalClient::connect(&format!("http://{}", self.grpc))
            .await
            .unwrap()
    }

    /// SIGTERM; returns whether it exited with code 0.
    async fn terminate(mut self) -> bool {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id().unwrap()).unwrap());
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        let status = tokio::time::timeout(PATIENCE, self.child.wait())
            .await
            .expect("opjournal dev did not stop on SIGTERM")
            .unwrap();
        status.code() == Some(0)
    }
}

/// Runs `code` with the client's interpreter; returns its standard output.
async fn run_python(code: &str) -> String {
    let mut child = Command::new(python())
        .arg("-")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    {
        use tokio::io::AsyncWriteExt as _;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(code.as_bytes()).await.unwrap();
    }
    let output = tokio::time::timeout(PATIENCE, child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "the Python example failed (the client comes from OPJOURNAL_TEST_CLIENT_PYTHON or \
         scripts/client-envs python):\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

async fn sandbox_stats(sandbox_url: &str) -> serde_json::Value {
    reqwest::get(format!("{sandbox_url}/v1/stats"))
        .await
        .unwrap()
        .error_for_status()
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// Signs in to the console with `token`; returns the answer's status and, on success, the
/// page `/queue` then shows. The double-submit value is the test's own, in cookie and form.
async fn console_sign_in(console_url: &str, token: &str) -> (u16, Option<String>) {
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let csrf = "0123456789abcdef0123456789abcdef";
    let answer = http
        .post(format!("{console_url}sign-in"))
        .header("cookie", format!("opjournal_console_sign_in={csrf}"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("csrf={csrf}&token={token}"))
        .send()
        .await
        .unwrap();
    let status = answer.status().as_u16();
    let session = answer
        .headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .filter_map(|v| v.split(';').next())
        .find(|pair| !pair.starts_with("opjournal_console_sign_in=") && !pair.ends_with('='))
        .map(str::to_owned);
    let Some(session) = session else {
        return (status, None);
    };
    let queue = http
        .get(format!("{console_url}queue"))
        .header("cookie", session)
        .send()
        .await
        .unwrap();
    assert_eq!(queue.status().as_u16(), 200);
    (status, Some(queue.text().await.unwrap()))
}

async fn listening(address: &str) -> bool {
    tokio::net::TcpStream::connect(address).await.is_ok()
}

#[tokio::test]
async fn dev_runs_the_readme_example_and_the_demo_then_stops_on_sigterm() {
    opjournal::app::install_crypto_provider();
    let data = tempfile::tempdir().unwrap();
    let dev = Dev::start(data.path(), &[]).await;

    // The README's example, pointed at this stand: one call, one replay, one conflict.
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let example = heredoc(&readme).replace("127.0.0.1:50051", &dev.grpc);
    assert_ne!(
        example,
        heredoc(&readme),
        "the README's example names no address"
    );
    let stdout = run_python(&example).await;
    assert_eq!(
        stdout.lines().collect::<Vec<_>>(),
        [
            "{'id': 'pay_1', 'status': 'succeeded'}",
            "{'id': 'pay_1', 'status': 'succeeded'}",
            "IDEMPOTENCY_KEY_REUSED",
            "provider calls: 1",
        ]
    );
    let operation = dev.client().await.get("", README_KEY).await.unwrap();
    assert_eq!(operation.status, OperationStatus::Succeeded as i32);
    assert_eq!(operation.attempt_count, 1);

    // The snippet dev prints is the README's, and the journal remembers the call.
    assert_eq!(heredoc(&dev.banner), example, "{}", dev.banner);
    let stdout = run_python(&heredoc(&dev.banner)).await;
    assert!(
        stdout.ends_with("provider calls: 0\n"),
        "a second run must replay:\n{stdout}"
    );

    // The printed demo command, run as printed (the binary for `cargo run --release --`).
    let printed = format!(
        "demo --against {} --sandbox-url {}",
        dev.grpc, dev.sandbox_url
    );
    assert!(dev.banner.contains(&printed), "{}", dev.banner);
    assert_eq!(sandbox_stats(&dev.sandbox_url).await["effects"], 0);
    let demo = Command::new(env!("CARGO_BIN_EXE_opjournal"))
        .args(printed.split_whitespace())
        .output()
        .await
        .unwrap();
    let demo_stdout = String::from_utf8_lossy(&demo.stdout);
    assert_eq!(demo.status.code(), Some(0), "{demo_stdout}");
    assert!(
        demo_stdout.contains("All seven steps hold."),
        "{demo_stdout}"
    );
    let stats = sandbox_stats(&dev.sandbox_url).await;
    assert_eq!(stats["effects"], 1, "{stats}");
    assert_eq!(stats["requests"], 1, "{stats}");
    assert!(
        stats["lookups"].as_u64().unwrap() >= 1,
        "the worker looked the payment up: {stats}"
    );

    // The console signs in with the printed token only.
    assert!(
        dev.console_url.starts_with("http://127.0.0.1:"),
        "{}",
        dev.banner
    );
    assert_eq!(dev.token.len(), 64, "{}", dev.banner);
    let (status, queue) = console_sign_in(&dev.console_url, &dev.token).await;
    assert_eq!(status, 303, "the printed token must sign in");
    assert!(queue.unwrap().contains("dev-reviewer"));
    let (status, queue) = console_sign_in(&dev.console_url, &"0".repeat(64)).await;
    assert_eq!(status, 401);
    assert!(queue.is_none());

    // SIGTERM stops every part: exit 0, nothing left listening.
    let (grpc, sandbox, console) = (
        dev.grpc.clone(),
        dev.sandbox_url.trim_start_matches("http://").to_owned(),
        dev.console_url
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_owned(),
    );
    assert!(listening(&grpc).await && listening(&sandbox).await && listening(&console).await);
    assert!(dev.terminate().await, "opjournal dev did not exit with 0");
    assert!(!listening(&grpc).await, "gRPC still listening");
    assert!(!listening(&sandbox).await, "sandbox still listening");
    assert!(!listening(&console).await, "console still listening");

    // The journal outlives a restart ...
    let dev = Dev::start(data.path(), &[]).await;
    let operation = dev.client().await.get("", README_KEY).await.unwrap();
    assert_eq!(operation.status, OperationStatus::Succeeded as i32);
    assert!(dev.terminate().await);

    // ... unless --fresh.
    let dev = Dev::start(data.path(), &["--fresh"]).await;
    let error = dev.client().await.get("", README_KEY).await.unwrap_err();
    assert_eq!(error.code, tonic::Code::NotFound);
    assert_eq!(error.reason, ErrorReason::OperationNotFound);
    assert!(dev.terminate().await);
}

#[tokio::test]
async fn dev_refuses_addresses_other_hosts_can_reach() {
    let data = tempfile::tempdir().unwrap();
    let flags = ["--listen", "--sandbox-listen", "--console-listen"];
    for flag in flags {
        let mut args = vec![flag, "0.0.0.0:0"];
        for other in flags.iter().filter(|other| **other != flag) {
            args.extend([*other, "127.0.0.1:0"]);
        }
        let output = Command::new(env!("CARGO_BIN_EXE_opjournal"))
            .arg("dev")
            .arg("--data-dir")
            .arg(data.path())
            .args(args)
            .env("RUST_LIB_BACKTRACE", "0")
            .output()
            .await
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{flag}: {stderr}");
        assert!(
            stderr.contains(&format!("{flag} 0.0.0.0:0")) && stderr.contains("loopback"),
            "{flag}: {stderr}"
        );
        assert!(output.stdout.is_empty(), "nothing may start: {flag}");
    }
    assert!(
        !data.path().join("journal.db").exists(),
        "a refused start must not create the journal"
    );
}
