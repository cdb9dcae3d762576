//! `tidemark capture`: records live traffic as a `replay` input, one JSON line
//! per message (`{"arrival", "mono", "synced", "topic", "payload"}`, or
//! `"payload_b64"` when the payload is not JSON), flushed line by line so a
//! killed capture stays usable. `mono` and `synced` let `replay` see steps of
//! the wall clock and the kernel's NTP state as `run` saw them (docs/reference.md#time).

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use crate::config::{Endpoint, parse_url};
use crate::sys::clock::{Backoff, SystemClock};
use crate::sys::link::{self, Event, LinkOptions};

/// What to record.
pub struct CaptureOptions<'a> {
    /// Broker URL.
    pub url: &'a str,
    /// Topic filters.
    pub topics: &'a [String],
    /// Output file (appended to); standard output when None.
    pub output: Option<&'a Path>,
    /// Stop after this many messages.
    pub count: Option<u64>,
    /// Stop after this many seconds.
    pub duration_s: Option<u64>,
}

/// Capture failures (exit 1; a bad URL is exit 2 in the CLI).
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// The URL does not parse.
    #[error("--url: {0}")]
    Url(String),
    /// A topic filter is invalid.
    #[error("--topic {0}")]
    Topic(String),
    /// Writing failed.
    #[error("writing the capture: {0}")]
    Io(#[from] std::io::Error),
    /// The link could not be built.
    #[error(transparent)]
    Link(#[from] link::LinkError),
}

/// Records until SIGINT/SIGTERM, `count` messages or `duration_s`.
pub fn run(o: &CaptureOptions<'_>) -> Result<u64, CaptureError> {
    let (tls, host, port) = parse_url(o.url).map_err(CaptureError::Url)?;
    for t in o.topics {
        crate::topic::validate_filter(t).map_err(|e| CaptureError::Topic(format!("{t:?}: {e}")))?;
    }
    let clock = SystemClock::new();
    let endpoint = Endpoint::plain(
        tls,
        host,
        port,
        format!("tidemark-capture-{}", std::process::id()),
        1,
    );
    let (client, mut lp) = link::build(&LinkOptions::tool(&endpoint, 100))?;
    let mut out: Box<dyn Write> = match o.output {
        Some(p) => Box::new(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)?,
        ),
        None => Box::new(std::io::stdout().lock()),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let topics = o.topics.to_vec();
    rt.block_on(async move {
        let mut n = 0u64;
        let mut backoff = Backoff::new(u64::from(std::process::id()));
        let limit = o.duration_s.map_or(Duration::MAX, Duration::from_secs);
        let deadline = tokio::time::sleep(limit.min(Duration::from_secs(100 * 365 * 86_400)));
        tokio::pin!(deadline);
        let stop = crate::sys::shutdown_signal();
        tokio::pin!(stop);
        loop {
            tokio::select! {
                ev = lp.poll() => match ev {
                    Ok(Event::Connected { .. }) => {
                        backoff.reset();
                        tracing::info!(url = o.url, topics = ?topics, "capture connected");
                        let _ = client.subscribe(&topics, 1);
                    }
                    Ok(Event::Subscribed { refused }) => {
                        tracing::info!(refused, "capture subscribed");
                    }
                    Ok(Event::Message { topic, payload, .. }) => {
                        let l = crate::replay::Record::of(clock.now(), &topic, &payload).to_line();
                        writeln!(out, "{l}")?;
                        out.flush()?;
                        n += 1;
                        if o.count.is_some_and(|c| n >= c) {
                            break;
                        }
                    }
                    Ok(_) => {}
                    Err(e) => {
                        let delay = backoff.next_delay();
                        tracing::warn!(url = o.url, cause = %e, retry_in_ms = delay.as_millis() as u64, "capture disconnected");
                        tokio::time::sleep(delay).await;
                    }
                },
                () = &mut deadline => break,
                () = &mut stop => break,
            }
        }
        let _ = client.disconnect();
        tracing::info!(messages = n, "capture finished");
        Ok(n)
    })
}
