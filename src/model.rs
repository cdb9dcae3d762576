//! Small value types shared by the decoder, the engine and the outputs.

/// A group, device or gateway id: at most 64 bytes, kept inline (no heap).
pub type Id = heapless::String<64>;

/// An optional time in 8 bytes where `Option<Millis>` takes 16 (held per device,
/// several times): `Millis::MIN` stands for none, and a time that far back (some
/// 292 million years) is kept as one millisecond later. Prints, serializes and
/// reads as the `Option`, so stored records are unchanged.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct OptMillis(Millis);

impl OptMillis {
    /// None.
    pub const NONE: Self = Self(Millis::MIN);

    /// The time, if any.
    pub const fn get(self) -> Option<Millis> {
        if self.0 == Millis::MIN {
            None
        } else {
            Some(self.0)
        }
    }

    /// `Some(t)`.
    pub const fn some(t: Millis) -> Self {
        Self(if t == Millis::MIN { Millis::MIN + 1 } else { t })
    }

    /// No time.
    pub const fn is_none(self) -> bool {
        self.0 == Millis::MIN
    }

    /// A time.
    pub const fn is_some(self) -> bool {
        !self.is_none()
    }
}

impl Default for OptMillis {
    fn default() -> Self {
        Self::NONE
    }
}

impl From<Option<Millis>> for OptMillis {
    fn from(v: Option<Millis>) -> Self {
        v.map_or(Self::NONE, Self::some)
    }
}

impl std::fmt::Debug for OptMillis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.get().fmt(f)
    }
}

impl serde::Serialize for OptMillis {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.get().serialize(s)
    }
}

impl<'de> serde::Deserialize<'de> for OptMillis {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Option::<Millis>::deserialize(d).map(Self::from)
    }
}

/// An id held once and shared: a device's group (one copy a group instead of a
/// 72-byte copy in every device). Reads, prints and serializes as the [`Id`].
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct SharedId(std::sync::Arc<Id>);

impl SharedId {
    /// Shares `id`.
    pub fn new(id: Id) -> Self {
        Self(std::sync::Arc::new(id))
    }
}

impl From<Id> for SharedId {
    fn from(id: Id) -> Self {
        Self::new(id)
    }
}

impl std::ops::Deref for SharedId {
    type Target = Id;
    fn deref(&self) -> &Id {
        &self.0
    }
}

impl std::fmt::Debug for SharedId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::fmt::Display for SharedId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl serde::Serialize for SharedId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl<'de> serde::Deserialize<'de> for SharedId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Id::deserialize(d).map(Self::new)
    }
}

/// A device id as its slot holds it: up to 22 bytes inline, a longer one on the
/// heap. 24 bytes a device instead of the 72 of an inline [`Id`] (4.6 MiB at
/// 100 000 devices); device ids are mostly short. Reads, compares, orders,
/// prints and serializes as the [`Id`].
#[derive(Clone)]
pub struct SlotId(SlotRepr);

#[derive(Clone)]
enum SlotRepr {
    Inline(heapless::String<22, u8>),
    Heap(Box<str>),
}

impl SlotId {
    /// The id's text.
    pub fn as_str(&self) -> &str {
        match &self.0 {
            SlotRepr::Inline(s) => s.as_str(),
            SlotRepr::Heap(s) => s,
        }
    }

    /// The id as an [`Id`] (an id is at most 64 bytes: it came from one).
    pub fn to_id(&self) -> Id {
        Id::try_from(self.as_str()).unwrap_or_default()
    }
}

impl From<&str> for SlotId {
    fn from(s: &str) -> Self {
        Self(match heapless::String::try_from(s) {
            Ok(inline) => SlotRepr::Inline(inline),
            Err(_) => SlotRepr::Heap(s.into()),
        })
    }
}

impl From<&Id> for SlotId {
    fn from(id: &Id) -> Self {
        Self::from(id.as_str())
    }
}

impl std::ops::Deref for SlotId {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl PartialEq for SlotId {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for SlotId {}

impl PartialEq<Id> for SlotId {
    fn eq(&self, other: &Id) -> bool {
        self.as_str() == other.as_str()
    }
}

impl PartialOrd for SlotId {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for SlotId {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_str().cmp(other.as_str())
    }
}

impl std::fmt::Debug for SlotId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.as_str().fmt(f)
    }
}

impl std::fmt::Display for SlotId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl serde::Serialize for SlotId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> serde::Deserialize<'de> for SlotId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Id::deserialize(d).map(|id| Self::from(&id))
    }
}

/// Epoch milliseconds.
pub type Millis = i64;

/// True when `s` is 1..64 chars of `[A-Za-z0-9_.:-]` (docs/reference.md#input).
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

/// Why an input was rejected (docs/reference.md#topics-and-payloads-upstream `reason`).
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

/// The outputs that read the outbox (docs/reference.md#sinkpostgres-and-sinkinflux).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OutputKind {
    /// The upstream MQTT sink's plain topics.
    Mqtt,
    /// The Sparkplug B edge node.
    Sparkplug,
    /// `[sink.postgres]`.
    Postgres,
    /// `[sink.influx]`.
    Influx,
}

impl OutputKind {
    /// Every output, in index order.
    pub const ALL: [OutputKind; 4] = [
        OutputKind::Mqtt,
        OutputKind::Sparkplug,
        OutputKind::Postgres,
        OutputKind::Influx,
    ];

    /// The output at `i` of [`OutputKind::ALL`].
    pub fn from_index(i: u8) -> Option<Self> {
        Self::ALL.get(usize::from(i)).copied()
    }

    /// The name in the status API and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            OutputKind::Mqtt => "mqtt",
            OutputKind::Sparkplug => "sparkplug",
            OutputKind::Postgres => "postgres",
            OutputKind::Influx => "influx",
        }
    }
}

/// Where an output is in the outbox, and what it did, since the state was created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct OutputMark {
    /// One past the highest outbox number it confirmed (all below are done).
    pub upto: u64,
    /// Entries written.
    pub written: u64,
    /// Entries the database refused (set aside).
    pub refused: u64,
}

impl OutputMark {
    /// Each field the higher of the two: a mark never moves back.
    pub fn max(self, o: Self) -> Self {
        Self {
            upto: self.upto.max(o.upto),
            written: self.written.max(o.written),
            refused: self.refused.max(o.refused),
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

    /// Ids of every length a device may have: a slot's id reads, orders and
    /// stores exactly as the inline id it replaced (short ones inline, long ones boxed).
    #[test]
    fn a_slot_id_is_the_id_in_24_bytes() {
        assert_eq!(std::mem::size_of::<SlotId>(), 24);
        let ids: Vec<Id> = (1..=64)
            .flat_map(|n| [format!("{:z<n$}", "a"), format!("{:0>n$}", "b")])
            .map(|s| Id::try_from(s.as_str()).unwrap())
            .collect();
        for a in &ids {
            let sa = SlotId::from(a);
            assert_eq!(sa.as_str(), a.as_str());
            assert_eq!(sa.to_id(), *a);
            assert_eq!(sa.to_string(), a.to_string());
            assert_eq!(format!("{sa:?}"), format!("{a:?}"));
            let mut cbor = Vec::new();
            ciborium::ser::into_writer(&sa, &mut cbor).unwrap();
            let mut plain = Vec::new();
            ciborium::ser::into_writer(a, &mut plain).unwrap();
            assert_eq!(cbor, plain, "{a}");
            let back: SlotId = ciborium::de::from_reader(plain.as_slice()).unwrap();
            assert_eq!(back, sa);
            for b in &ids {
                assert_eq!(sa.cmp(&SlotId::from(b)), a.cmp(b), "{a} {b}");
                assert_eq!(sa == *b, a == b);
            }
        }
        // Longer than an id: refused, as the inline id refused it.
        let mut long = Vec::new();
        ciborium::ser::into_writer(&"x".repeat(65), &mut long).unwrap();
        assert!(ciborium::de::from_reader::<SlotId, _>(long.as_slice()).is_err());
    }
}
