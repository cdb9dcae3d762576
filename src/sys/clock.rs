//! The gateway's clocks: the one place that reads them (see `clippy.toml`).

use std::sync::atomic::{AtomicI64, Ordering};
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

    /// Both clocks, read once, and the kernel's NTP state (asked at most once a second).
    #[allow(clippy::disallowed_methods)]
    pub fn now(&self) -> Now {
        let wall = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| {
            Millis::try_from(d.as_millis()).unwrap_or(Millis::MAX)
        });
        let mono = Millis::try_from(self.origin.elapsed().as_millis()).unwrap_or(Millis::MAX);
        Now {
            wall,
            mono,
            synced: synced_cached(mono),
        }
    }

    /// The instant of monotonic reading `mono` (for timers; reads no clock).
    pub fn instant(&self, mono: Millis) -> Instant {
        self.origin + std::time::Duration::from_millis(mono.max(0).unsigned_abs())
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

/// The kernel's view of the wall clock (adjtimex).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelClock {
    /// `STA_UNSYNC` is clear: NTP (or another discipline) keeps the clock.
    pub synced: bool,
    /// Maximum error the kernel reports, µs.
    pub maxerror_us: i64,
}

/// What an unsynchronized kernel reports as its maximum error (16 s, `NTP_PHASE_LIMIT`).
const UNSYNC_MAXERROR_US: i64 = 16_000_000;

/// Asks the kernel (adjtimex, read only). Where it cannot be asked (a sandbox
/// denies adjtimex) the clock counts as unsynchronized, with one warning: a
/// gateway that cannot know must not trust itself over its fleet
/// (docs/reference.md#time).
pub fn kernel_clock() -> KernelClock {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: a zeroed `timex` with `modes` 0 only reads the kernel's state.
        let mut t: libc::timex = unsafe { std::mem::zeroed() };
        let rc = unsafe { libc::adjtimex(&mut t) };
        if rc >= 0 {
            return KernelClock {
                synced: t.status & libc::STA_UNSYNC == 0,
                // `c_long` is 32 bits on armv7 boards.
                #[allow(clippy::useless_conversion)]
                maxerror_us: i64::from(t.maxerror),
            };
        }
        unreadable(&std::io::Error::last_os_error().to_string());
    }
    #[cfg(not(target_os = "linux"))]
    unreadable("adjtimex is Linux only");
    KernelClock {
        synced: false,
        maxerror_us: UNSYNC_MAXERROR_US,
    }
}

/// Says once per process why the kernel's clock state is unknown.
fn unreadable(why: &str) {
    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !WARNED.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            error = why,
            "the kernel's clock state cannot be read (adjtimex denied: under systemd, \
             ProtectClock=yes or a SystemCallFilter without adjtimex does this); the gateway \
             clock counts as unsynchronized, so a fleet that agrees against it is followed"
        );
    }
}

/// Process-wide cache of the kernel's sync flag: (second of the monotonic clock << 1) | synced.
static SYNCED: AtomicI64 = AtomicI64::new(-1);

/// The kernel's sync flag, asked at most once per second of `mono` (no second clock read).
fn synced_cached(mono: Millis) -> bool {
    let sec = mono.max(0) / 1000;
    let v = SYNCED.load(Ordering::Relaxed);
    if v >= 0 && v >> 1 == sec {
        return v & 1 == 1;
    }
    let synced = kernel_clock().synced;
    SYNCED.store((sec << 1) | i64::from(synced), Ordering::Relaxed);
    synced
}
