//! Logging set up per command: `run` and `replay` from `[log]`, the tools plain.

use tidemark::config::{Config, LogFormat};

/// Logging for `run` and `replay`; returns the setter a reload uses for `[log] level`.
pub fn init_logging(cfg: &Config, format: Option<LogFormat>) -> tidemark::run::LogControl {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    // The embedded broker's own logs (every client connect and disconnect) stay off
    // unless RUST_LOG asks for them.
    let from_env = tracing_subscriber::EnvFilter::try_from_default_env().ok();
    let env_wins = from_env.is_some();
    let level = |l: &str| tracing_subscriber::EnvFilter::try_new(format!("{l},rumqttd=off"));
    let filter = from_env.unwrap_or_else(|| {
        level(&cfg.log.level).unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"))
    });
    let (filter, handle) = tracing_subscriber::reload::Layer::new(filter);
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let registry = tracing_subscriber::registry().with(filter);
    match format.unwrap_or(cfg.log.format) {
        LogFormat::Text => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_ansi(ansi)
                    .with_writer(std::io::stderr),
            )
            .init(),
        LogFormat::Json => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .with_writer(std::io::stderr),
            )
            .init(),
    }
    Box::new(move |l: &str| {
        if env_wins {
            tracing::info!("RUST_LOG is set and wins over log.level");
            return Ok(());
        }
        let f = level(l).map_err(|e| e.to_string())?;
        handle.reload(f).map_err(|e| e.to_string())
    })
}

/// Logging for commands without a config file.
pub fn init_plain_logging(format: Option<LogFormat>) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match format.unwrap_or(LogFormat::Text) {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
