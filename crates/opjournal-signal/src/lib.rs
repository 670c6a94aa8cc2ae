//! When a process of the workspace is asked to stop: on SIGTERM (an orchestrator, `kill`)
//! or SIGINT (Ctrl-C). Every binary — the server, the reconcile worker, the sandbox
//! provider, the benchmark and the fault-injection suite — waits on [`stop_signal`].

/// Resolves when the process is asked to stop, naming the signal (`"SIGTERM"` or
/// `"SIGINT"`). Where SIGTERM cannot be listened for (not Unix, or the handler cannot be
/// installed), on SIGINT alone; where neither can, never.
///
/// Must be called within a Tokio runtime.
pub async fn stop_signal() -> &'static str {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        if let Ok(mut terminate) = signal(SignalKind::terminate()) {
            return tokio::select! {
                _ = terminate.recv() => "SIGTERM",
                interrupt = tokio::signal::ctrl_c() => match interrupt {
                    Ok(()) => "SIGINT",
                    Err(_) => { terminate.recv().await; "SIGTERM" }
                },
            };
        }
    }
    match tokio::signal::ctrl_c().await {
        Ok(()) => "SIGINT",
        Err(_) => std::future::pending().await,
    }
}
