//! A deadline timer armed lazily: one registered sleep, moved only when the
//! deadline comes earlier or after it fired, so a task that looks at its
//! deadline on every event (each message, each PUBACK) costs no timer work per event.

use std::pin::Pin;

use tokio::time::Sleep;

use crate::model::Millis;
use crate::sys::clock::SystemClock;

/// A timer for a deadline on the monotonic clock.
pub struct Alarm {
    clock: SystemClock,
    sleep: Pin<Box<Sleep>>,
    armed: Option<Millis>,
}

impl Alarm {
    pub fn new(clock: SystemClock) -> Self {
        Self {
            clock,
            sleep: Box::pin(tokio::time::sleep_until(tokio::time::Instant::from_std(
                clock.instant(0),
            ))),
            armed: None,
        }
    }

    /// Wants a wake-up at `at` (None: none). A later deadline than the armed one
    /// leaves the timer where it is: the caller looks again when it fires.
    pub fn want(&mut self, at: Option<Millis>) {
        match (at, self.armed) {
            (None, _) => self.armed = None,
            (Some(t), Some(a)) if a <= t => {}
            (Some(t), _) => {
                self.armed = Some(t);
                self.sleep
                    .as_mut()
                    .reset(tokio::time::Instant::from_std(self.clock.instant(t)));
            }
        }
    }

    /// Whether a wake-up is wanted.
    pub fn is_armed(&self) -> bool {
        self.armed.is_some()
    }

    /// Completes at the armed deadline (never while unarmed); then unarmed.
    pub async fn fired(&mut self) {
        if self.armed.is_none() {
            std::future::pending::<()>().await;
        }
        self.sleep.as_mut().await;
        self.armed = None;
    }
}
