//! Fencing by the pair's claim (docs/reference.md#standby--two-boards-one-gateway): a board acks,
//! connects its source or sink and publishes only while it holds a fresh proof
//! that the claim names it in the current epoch. The proof is a monotonic
//! deadline the pair task moves on; a board without a pair always holds it.

use tokio::sync::watch;

use crate::model::Millis;
use crate::sys::clock::SystemClock;

/// Read side: whether this board may act now.
#[derive(Debug, Clone)]
pub struct Fence {
    until: watch::Receiver<Millis>,
    clock: SystemClock,
}

/// Write side, held by the pair task.
#[derive(Debug)]
pub struct Proof {
    until: watch::Sender<Millis>,
}

impl Fence {
    /// A board on its own: never fenced.
    pub fn open(clock: SystemClock) -> Self {
        let (_tx, until) = watch::channel(Millis::MAX);
        Self { until, clock }
    }

    /// A board of a pair: fenced until its pair task proves the claim.
    pub fn paired(clock: SystemClock) -> (Proof, Self) {
        let (tx, until) = watch::channel(0);
        (Proof { until: tx }, Self { until, clock })
    }

    /// The proof is fresh now.
    pub fn holds(&self) -> bool {
        self.clock.mono() < *self.until.borrow()
    }
}

impl Proof {
    /// The claim was proven (by a message sent at monotonic `sent`): it holds
    /// until `sent + valid_ms`; a later proof never moves the deadline back.
    pub fn proven(&self, sent: Millis, valid_ms: Millis) {
        let until = sent.saturating_add(valid_ms);
        self.until.send_if_modified(|u| {
            let later = until > *u;
            if later {
                *u = until;
            }
            later
        });
    }

    /// Deposed or stopping: nothing is proven from now on.
    pub fn revoke(&self) {
        self.until.send_replace(0);
    }

    /// The proof is fresh at `mono`.
    pub fn holds_at(&self, mono: Millis) -> bool {
        mono < *self.until.borrow()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_proof_holds_until_its_deadline_and_a_revocation_ends_it() {
        let clock = SystemClock::new();
        assert!(Fence::open(clock).holds());
        let (proof, fence) = Fence::paired(clock);
        assert!(!fence.holds(), "a pair's board starts fenced");
        let now = clock.mono();
        proof.proven(now, 60_000);
        assert!(fence.holds() && proof.holds_at(now + 59_999));
        assert!(!proof.holds_at(now + 60_000));
        proof.proven(now - 10_000, 1_000);
        assert!(fence.holds(), "an older proof does not shorten a newer one");
        proof.revoke();
        assert!(!fence.holds());
    }
}
