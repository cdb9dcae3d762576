//! What the gateway and the tools share with the operating system and the
//! network: the clocks (the only place that reads them), MQTT links, and the
//! embedded broker.

pub mod broker;
pub mod clock;
pub mod link;
pub mod memory;

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
