//! The memory ceiling (docs/reference.md#memory): the gateway reads its cgroup's
//! `memory.max` (or `gateway.memory_max_mb`) and, near it, holds input (acks held:
//! the broker queues) until what is in flight has gone out, instead of growing
//! into the kernel's OOM killer.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};

use crate::model::Millis;
use crate::sys::memory;

/// Input is held above this share of the limit (percent) ...
const HOLD_PCT: u64 = 85;
/// ... and taken again below this one.
const RESUME_PCT: u64 = 80;
/// How often the resident set is read.
const LOOK_MS: Millis = 100;
/// Hold and release lines closer together than this are summed into the next one.
const REPORT_MS: Millis = 10_000;
/// Window results in memory and not yet delivered upstream at which a close burst's
/// next slice waits (each slice is ~1.5 MB of results).
pub const OUTPUT_BYTES: u64 = 4 << 20;

/// Where the limit comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum From {
    /// No limit: nothing is held.
    None = 0,
    /// `gateway.memory_max_mb`.
    Config = 1,
    /// The cgroup's `memory.max` (systemd's `MemoryMax=`).
    Cgroup = 2,
}

impl From {
    /// As the status API and the log name it.
    pub fn as_str(self) -> &'static str {
        match self {
            From::None => "none",
            From::Config => "gateway.memory_max_mb",
            From::Cgroup => "cgroup memory.max",
        }
    }
}

/// The ceiling's figures, for the status API, `/metrics` and `P/metrics`.
#[derive(Debug, Default)]
pub struct MemoryStat {
    /// Resident set at the last look, bytes.
    pub rss: AtomicU64,
    /// The limit, bytes (0: none).
    pub limit: AtomicU64,
    /// [`From`] as its number.
    pub from: AtomicU8,
    /// Input is held now (the source reads it).
    pub held: AtomicBool,
    /// Times input was held.
    pub holds: AtomicU64,
    /// Milliseconds input was held, in total (a hold in progress counts when it ends).
    pub held_ms: AtomicU64,
    /// Undelivered outputs in memory, bytes (the store thread).
    pub outputs_bytes: AtomicU64,
}

/// The ceiling as the status API, `/metrics` and `P/metrics` show it.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MemoryStatus {
    /// Resident set, bytes.
    pub rss_bytes: u64,
    /// The limit, bytes; absent: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_bytes: Option<u64>,
    /// `gateway.memory_max_mb`, `cgroup memory.max` or `none`.
    pub limit_from: String,
    /// Input is held now.
    pub held: bool,
    /// Times input was held since the gateway started.
    pub holds: u64,
    /// Milliseconds input was held, in total.
    pub held_ms: u64,
    /// Results in memory on their way upstream, bytes.
    pub outputs_bytes: u64,
}

impl MemoryStat {
    /// What the status shows.
    pub fn status(&self) -> MemoryStatus {
        let limit = self.limit.load(Ordering::Relaxed);
        MemoryStatus {
            rss_bytes: self.rss.load(Ordering::Relaxed),
            limit_bytes: (limit > 0).then_some(limit),
            limit_from: self.from().as_str().to_owned(),
            held: self.held.load(Ordering::Relaxed),
            holds: self.holds.load(Ordering::Relaxed),
            held_ms: self.held_ms.load(Ordering::Relaxed),
            outputs_bytes: self.outputs_bytes.load(Ordering::Relaxed),
        }
    }

    /// Where the limit comes from.
    pub fn from(&self) -> From {
        match self.from.load(Ordering::Relaxed) {
            1 => From::Config,
            2 => From::Cgroup,
            _ => From::None,
        }
    }
}

/// The core's side: looks at the resident set and decides holds.
#[derive(Debug)]
pub struct Ceiling {
    limit: Option<u64>,
    from: From,
    held_since: Option<Millis>,
    next_look: Millis,
    /// Holds begun since the last line about them.
    unreported: u64,
    last_line: Option<Millis>,
    /// Resident set at a hold released with nothing left in flight: the state itself is
    /// that large, and holding input would only stop the gateway. The next hold waits
    /// for growth past it.
    floor: Option<u64>,
}

impl Ceiling {
    /// `configured` bytes (0: the cgroup's limit, if any).
    pub fn new(configured: u64, stat: &MemoryStat) -> Self {
        let mut c = Self::unlimited();
        c.configure(configured, stat);
        c
    }

    /// No limit yet: nothing is held.
    fn unlimited() -> Self {
        Self {
            limit: None,
            from: From::None,
            held_since: None,
            next_look: 0,
            unreported: 0,
            last_line: None,
            floor: None,
        }
    }

    /// A reload's `memory_max_mb` (bytes).
    pub fn configure(&mut self, configured: u64, stat: &MemoryStat) {
        (self.limit, self.from) = if configured > 0 {
            (Some(configured), From::Config)
        } else {
            match memory::cgroup_limit() {
                Some(l) => (Some(l), From::Cgroup),
                None => (None, From::None),
            }
        };
        stat.limit.store(self.limit.unwrap_or(0), Ordering::Relaxed);
        stat.from.store(self.from as u8, Ordering::Relaxed);
        if let Some(l) = self.limit {
            tracing::info!(
                limit_mib = l >> 20,
                from = self.from.as_str(),
                hold_mib = (l / 100 * HOLD_PCT) >> 20,
                "memory ceiling"
            );
        }
    }

    /// Since when input is held (monotonic ms), if it is.
    pub fn held_since(&self) -> Option<Millis> {
        self.held_since
    }

    /// Reads the resident set (at most every [`LOOK_MS`]) and holds or releases input;
    /// `in_flight`: results or a burst are still going out (what a hold waits for).
    pub fn look(&mut self, mono: Millis, stat: &MemoryStat, in_flight: bool) {
        self.look_with(mono, stat, in_flight, &mut memory::rss);
    }

    /// [`Ceiling::look`] with the resident set read by `rss` (called again after freed
    /// heap is handed back).
    fn look_with(
        &mut self,
        mono: Millis,
        stat: &MemoryStat,
        in_flight: bool,
        rss_now: &mut dyn FnMut() -> Option<u64>,
    ) {
        if mono < self.next_look {
            return;
        }
        self.next_look = mono.saturating_add(LOOK_MS);
        let Some(mut rss) = rss_now() else {
            return;
        };
        let Some(limit) = self.limit else {
            stat.rss.store(rss, Ordering::Relaxed);
            return;
        };
        let resume = limit / 100 * RESUME_PCT;
        let hold = (limit / 100 * HOLD_PCT).max(self.floor.map_or(0, |f| f + limit / 20));
        if rss >= hold || self.held_since.is_some() {
            // Heap freed by a burst that went out is not growth: hand it back first.
            memory::give_back();
            rss = rss_now().unwrap_or(rss);
        }
        stat.rss.store(rss, Ordering::Relaxed);
        if rss < resume {
            self.floor = None;
        }
        if let Some(since) = self.held_since
            && rss >= resume
            && !in_flight
            && mono.saturating_sub(since) >= LOOK_MS
        {
            self.floor = Some(rss);
            self.release(mono, since, rss, stat);
            tracing::warn!(
                rss_mib = rss >> 20,
                limit_mib = limit >> 20,
                "memory near its limit with nothing in flight: the state itself is this large; input resumed \
                 (raise the limit, or lower what each device keeps: window size, allowed lateness, aggregates)"
            );
            return;
        }
        match self.held_since {
            None if rss >= hold => {
                self.held_since = Some(mono);
                stat.held.store(true, Ordering::Relaxed);
                stat.holds.fetch_add(1, Ordering::Relaxed);
                self.unreported += 1;
                if self
                    .last_line
                    .is_none_or(|t| mono.saturating_sub(t) >= REPORT_MS)
                {
                    self.last_line = Some(mono);
                    tracing::warn!(
                        rss_mib = rss >> 20,
                        limit_mib = limit >> 20,
                        from = self.from.as_str(),
                        holds = std::mem::take(&mut self.unreported),
                        "memory near its limit: input held (the broker queues) until results in flight have gone out"
                    );
                }
            }
            Some(since) if rss < resume => self.release(mono, since, rss, stat),
            _ => {}
        }
    }

    fn release(&mut self, mono: Millis, since: Millis, rss: u64, stat: &MemoryStat) {
        self.held_since = None;
        let ms = u64::try_from(mono.saturating_sub(since)).unwrap_or(0);
        stat.held.store(false, Ordering::Relaxed);
        stat.held_ms.fetch_add(ms, Ordering::Relaxed);
        if self.unreported == 0 {
            tracing::info!(held_ms = ms, rss_mib = rss >> 20, "input resumed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    /// A ceiling of 100 MiB fed resident sets in turn, one look every 100 ms.
    fn run(rss: &[(u64, bool)]) -> (Ceiling, MemoryStat, Vec<bool>) {
        let stat = MemoryStat::default();
        let mut c = Ceiling::new(100 * MIB, &stat);
        let mut held = Vec::new();
        for (i, &(mib, in_flight)) in rss.iter().enumerate() {
            let mono = Millis::try_from(i).unwrap() * LOOK_MS;
            c.look_with(mono, &stat, in_flight, &mut || Some(mib * MIB));
            held.push(stat.held.load(Ordering::Relaxed));
        }
        (c, stat, held)
    }

    #[test]
    fn input_is_held_at_85_percent_and_taken_again_below_80() {
        let (_, stat, held) = run(&[
            (70, true),
            (84, true),
            (86, true),
            (83, true),
            (81, true),
            (79, true),
            (90, true),
        ]);
        assert_eq!(held, [false, false, true, true, true, false, true]);
        assert_eq!(stat.holds.load(Ordering::Relaxed), 2);
        assert_eq!(stat.held_ms.load(Ordering::Relaxed), 300);
        assert_eq!(stat.status().limit_from, "gateway.memory_max_mb");
    }

    #[test]
    fn with_nothing_in_flight_a_hold_ends_and_the_next_waits_for_growth() {
        // Nothing in flight: the state itself is 86 MiB; holding would only stop the gateway.
        let (c, _, held) = run(&[
            (86, true),
            (86, false),
            (86, false),
            (90, false),
            (91, false),
            (91, false),
            (79, false),
            (86, true),
        ]);
        assert_eq!(held, [true, false, false, false, true, false, false, true]);
        assert!(c.floor.is_none(), "below 80 % the floor is forgotten");
    }

    #[test]
    fn without_a_limit_nothing_is_held() {
        let stat = MemoryStat::default();
        let mut c = Ceiling::unlimited();
        c.look_with(0, &stat, true, &mut || Some(u64::MAX / 2));
        assert!(!stat.held.load(Ordering::Relaxed));
        assert_eq!(stat.status().limit_bytes, None);
    }
}
