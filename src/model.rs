//! Small value types shared by the decoder, the engine and the outputs.

/// A group, device or gateway id: at most 64 bytes, kept inline (no heap).
pub type Id = heapless::String<64>;

/// Epoch milliseconds.
pub type Millis = i64;

/// True when `s` is 1..64 chars of `[A-Za-z0-9_.:-]` (SPEC §3).
pub fn valid_id(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'-'))
}

/// Message kind, from the topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// A reading with metrics.
    Reading,
    /// A liveness heartbeat.
    Heartbeat,
}

/// Why an input was rejected (SPEC §8 `reason`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// Topic does not match the pattern.
    BadTopic,
    /// Payload is not a decodable object.
    DecodeError,
    /// Device timestamp invalid and `time.invalid = "reject"`.
    InvalidTimestamp,
    /// Event time too far in the future.
    Future,
    /// Event time older than `max_age_ms`.
    TooOld,
}

impl Reason {
    /// Every reason, in a stable order.
    pub const ALL: [Reason; 5] = [
        Reason::BadTopic,
        Reason::DecodeError,
        Reason::InvalidTimestamp,
        Reason::Future,
        Reason::TooOld,
    ];

    /// Position in [`Reason::ALL`] (the index of per-reason counters).
    pub fn index(self) -> usize {
        self as usize
    }

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::BadTopic => "bad_topic",
            Reason::DecodeError => "decode_error",
            Reason::InvalidTimestamp => "invalid_timestamp",
            Reason::Future => "future",
            Reason::TooOld => "too_old",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reason_index_is_its_position_in_all() {
        for (i, r) in Reason::ALL.iter().enumerate() {
            assert_eq!(r.index(), i, "{r:?}");
        }
    }

    #[test]
    fn ids_allow_the_spec_alphabet_only() {
        assert!(valid_id("dev-1_a.b:c"));
        assert!(valid_id(&"x".repeat(64)));
        assert!(!valid_id(&"x".repeat(65)));
        assert!(!valid_id(""));
        for bad in ["a/b", "a+b", "a#", "$sys", "a b", "a\u{1}", "é"] {
            assert!(!valid_id(bad), "{bad:?}");
        }
    }
}
