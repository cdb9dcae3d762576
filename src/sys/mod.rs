//! What the gateway and the tools share with the operating system and the
//! network: the clocks (the only place that reads them), MQTT links, and the
//! embedded broker.

pub mod broker;
pub mod clock;
pub mod link;
pub mod memory;

/// Files and directories this process creates are its owner's only (0600 / 0700)
/// whatever umask it was started with: state, journal and keys are nobody else's.
pub fn private_files() {
    #[cfg(unix)]
    // SAFETY: umask only sets the process's file mode mask.
    unsafe {
        libc::umask(0o077);
    }
}

/// The gateway's own files in a state directory lose every permission of group
/// and others (written before [`private_files`], or by another tool); other files
/// and the directory itself are the operator's.
pub fn make_private(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    const OURS: [&str; 4] = ["tidemark.", "remote.toml", "sparkplug-bdseq", "pair-"];
    for e in std::fs::read_dir(dir)?.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if !e.file_type().is_ok_and(|t| t.is_file()) || !OURS.iter().any(|o| name.starts_with(o)) {
            continue;
        }
        let mode = e.metadata()?.permissions().mode();
        if mode & 0o077 != 0 {
            std::fs::set_permissions(e.path(), std::fs::Permissions::from_mode(mode & 0o700))?;
        }
    }
    Ok(())
}

/// SIGHUP, one item each (a reload). Installed when called: from then on the
/// signal no longer ends the process.
pub fn hangups() -> std::io::Result<tokio::sync::mpsc::UnboundedReceiver<()>> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut hup = signal(SignalKind::hangup())?;
        tokio::spawn(async move {
            while hup.recv().await.is_some() {
                if tx.send(()).is_err() {
                    return;
                }
            }
        });
    }
    #[cfg(not(unix))]
    drop(tx);
    Ok(rx)
}

/// SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let Ok(mut term) = signal(SignalKind::terminate()) else {
            let _ = tokio::signal::ctrl_c().await;
            return;
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
