//! The gateway's clocks: the one place that reads them (see `clippy.toml`).

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::engine::Now;
use crate::model::Millis;

/// Wall clock for arrival stamps, monotonic clock for idleness and timers.
#[derive(Debug, Clone, Copy)]
pub struct SystemClock {
    origin: Instant,
}

impl SystemClock {
    /// A clock whose monotonic reading starts near zero now.
    #[allow(clippy::disallowed_methods)]
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
        }
    }

    /// Both clocks, read once.
    #[allow(clippy::disallowed_methods)]
    pub fn now(&self) -> Now {
        let wall = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| {
            Millis::try_from(d.as_millis()).unwrap_or(Millis::MAX)
        });
        let mono = Millis::try_from(self.origin.elapsed().as_millis()).unwrap_or(Millis::MAX);
        Now { wall, mono }
    }

    /// Monotonic milliseconds since the clock was made.
    pub fn mono(&self) -> Millis {
        Millis::try_from(self.origin.elapsed().as_millis()).unwrap_or(Millis::MAX)
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

/// Capped exponential backoff with jitter, for reconnects.
#[derive(Debug)]
pub struct Backoff {
    attempt: u32,
    seed: u64,
}

impl Backoff {
    /// A fresh backoff; `seed` varies the jitter between processes.
    pub fn new(seed: u64) -> Self {
        Self {
            attempt: 0,
            seed: seed | 1,
        }
    }

    /// Connected: the next failure starts from the shortest delay again.
    pub fn reset(&mut self) {
        self.attempt = 0;
    }

    /// The delay before the next attempt: 200 ms doubling up to 15 s, ±25 % jitter.
    pub fn next_delay(&mut self) -> std::time::Duration {
        let base: u64 = (200u64 << self.attempt.min(8)).min(15_000);
        self.attempt = self.attempt.saturating_add(1);
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        let jitter = self.seed % (base / 2 + 1);
        std::time::Duration::from_millis(base - base / 4 + jitter)
    }
}
