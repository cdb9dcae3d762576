//! Only the pair moves the pair (docs/reference.md#standby--two-boards-one-gateway): every pair
//! message is sealed with the pair key (HMAC-SHA256 over its topic and all of its
//! bytes) and bound to its sender's session, so a forged message fails its tag and
//! a replayed one fails its session.
//!
//! A message is `MAGIC | node len | node | nonce | ctr | echo | body | tag`:
//! `nonce` names the sender's connection (new at each connect), `ctr` counts its
//! messages, `echo` is the newest nonce the sender has heard from the other
//! board. A receiver takes a session it does not know only when it echoes the
//! receiver's own current nonce (so it began after the receiver's session did),
//! never one it has retired, and within a session only rising counters. Retained
//! claims (`pair/state`) are checked by tag only: their order is the epoch's.

use std::collections::{HashMap, VecDeque};

use ring::hmac;

const MAGIC: &[u8; 4] = b"TMp1";
const TAG: usize = 32;
/// Sessions of one board remembered as retired (a replay of one is refused).
const RETIRED: usize = 64;
/// The counter of a session's will: the last word of its connection.
pub const WILL_CTR: u64 = u64::MAX;

/// The pair key(s): the first seals, each opens (two during a key change).
#[derive(Clone)]
pub struct Keys {
    keys: Vec<hmac::Key>,
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Keys({} keys)", self.keys.len())
    }
}

impl PartialEq for Keys {
    fn eq(&self, other: &Self) -> bool {
        // Two sets of keys are the same when each seals what the other opens.
        let probe = b"tidemark pair key probe";
        self.keys.len() == other.keys.len()
            && self
                .keys
                .iter()
                .zip(&other.keys)
                .all(|(a, b)| hmac::sign(a, probe).as_ref() == hmac::sign(b, probe).as_ref())
    }
}

impl Eq for Keys {}

impl Keys {
    /// Keys from a key file's text: one base64 line of 32 bytes each (`#` lines
    /// and blank ones skipped); the first seals.
    pub fn parse(text: &str) -> Result<Self, String> {
        use base64::Engine as _;
        let mut keys = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(line)
                .map_err(|e| format!("line {}: not base64: {e}", i + 1))?;
            if bytes.len() != 32 {
                return Err(format!(
                    "line {}: {} bytes, a pair key is 32 (`tidemark pair keygen --out FILE`)",
                    i + 1,
                    bytes.len()
                ));
            }
            keys.push(hmac::Key::new(hmac::HMAC_SHA256, &bytes));
        }
        if keys.is_empty() {
            return Err("no key in the file (`tidemark pair keygen --out FILE`)".into());
        }
        Ok(Self { keys })
    }

    /// A fresh key file's text: base64 of 32 random bytes and a newline.
    pub fn generate() -> Result<String, String> {
        use base64::Engine as _;
        let mut k = [0u8; 32];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut k)
            .map_err(|_| "no randomness from the operating system".to_string())?;
        Ok(format!(
            "{}\n",
            base64::engine::general_purpose::STANDARD.encode(k)
        ))
    }

    fn tag(&self, key: &hmac::Key, topic: &str, signed: &[u8]) -> hmac::Tag {
        let mut ctx = hmac::Context::with_key(key);
        ctx.update(&u32::try_from(topic.len()).unwrap_or(u32::MAX).to_be_bytes());
        ctx.update(topic.as_bytes());
        ctx.update(signed);
        let _ = self;
        ctx.sign()
    }
}

/// A random 64-bit number (a session nonce), never 0.
pub fn random_nonce() -> u64 {
    let mut b = [0u8; 8];
    let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b);
    u64::from_be_bytes(b) | 1
}

/// The sending side of one board: its key, name and current session.
#[derive(Debug)]
pub struct Sealer {
    keys: Keys,
    node: String,
    nonce: u64,
    ctr: u64,
    echo: u64,
}

impl Sealer {
    /// `node`'s sealer, on a first session `nonce`.
    pub fn new(keys: Keys, node: &str, nonce: u64) -> Self {
        Self {
            keys,
            node: node.to_owned(),
            nonce,
            ctr: 0,
            echo: 0,
        }
    }

    /// A new connection: a new session.
    pub fn new_session(&mut self, nonce: u64) {
        self.nonce = nonce;
        self.ctr = 0;
    }

    /// The current session's nonce.
    pub fn nonce(&self) -> u64 {
        self.nonce
    }

    /// The other board's newest session, echoed in what this board sends.
    pub fn heard(&mut self, nonce: u64) {
        self.echo = nonce;
    }

    /// `body` for `topic`, sealed as the session's next message.
    pub fn seal(&mut self, topic: &str, body: &[u8]) -> Vec<u8> {
        self.ctr = self.ctr.saturating_add(1).min(WILL_CTR - 1);
        self.seal_with(topic, body, self.ctr)
    }

    /// The session's will: sealed once, with the last counter.
    pub fn seal_will(&self, topic: &str, body: &[u8]) -> Vec<u8> {
        self.seal_with(topic, body, WILL_CTR)
    }

    fn seal_with(&self, topic: &str, body: &[u8], ctr: u64) -> Vec<u8> {
        let node = self.node.as_bytes();
        let mut out = Vec::with_capacity(4 + 1 + node.len() + 24 + body.len() + TAG);
        out.extend_from_slice(MAGIC);
        out.push(u8::try_from(node.len()).unwrap_or(u8::MAX));
        out.extend_from_slice(&node[..node.len().min(255)]);
        out.extend_from_slice(&self.nonce.to_be_bytes());
        out.extend_from_slice(&ctr.to_be_bytes());
        out.extend_from_slice(&self.echo.to_be_bytes());
        out.extend_from_slice(body);
        let tag = self.keys.tag(&self.keys.keys[0], topic, &out);
        out.extend_from_slice(tag.as_ref());
        out
    }
}

/// A message whose tag is good.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opened<'a> {
    /// The sending board.
    pub node: &'a str,
    /// Its session.
    pub nonce: u64,
    /// The message's number in that session.
    pub ctr: u64,
    /// The newest session of the receiving side the sender had heard.
    pub echo: u64,
    /// The body.
    pub body: &'a [u8],
}

/// Why a message was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Not a sealed pair message, or its tag does not match any pair key.
    Forged,
    /// Over `max_frame_mib`.
    TooLarge,
    /// A session retired or not known to be newer than this board's own, or a
    /// counter that does not rise: a replay.
    Replayed,
}

impl Refusal {
    /// For the log.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::Forged => "forged (bad tag)",
            Refusal::TooLarge => "over max_frame_mib",
            Refusal::Replayed => "replayed (stale session or counter)",
        }
    }
}

/// Checks the tag of `bytes` received on `topic`.
pub fn open<'a>(keys: &Keys, topic: &str, bytes: &'a [u8]) -> Result<Opened<'a>, Refusal> {
    let min = 4 + 1 + 24 + TAG;
    if bytes.len() < min || &bytes[..4] != MAGIC {
        return Err(Refusal::Forged);
    }
    let node_len = usize::from(bytes[4]);
    if bytes.len() < min + node_len {
        return Err(Refusal::Forged);
    }
    let (signed, tag) = bytes.split_at(bytes.len() - TAG);
    let good = keys
        .keys
        .iter()
        .any(|k| hmac::verify(k, &tagged(topic, signed), tag).is_ok());
    if !good {
        return Err(Refusal::Forged);
    }
    let node = std::str::from_utf8(&signed[5..5 + node_len]).map_err(|_| Refusal::Forged)?;
    let at = 5 + node_len;
    let num = |i: usize| {
        let b: [u8; 8] = signed[at + i * 8..at + i * 8 + 8]
            .try_into()
            .unwrap_or([0; 8]);
        u64::from_be_bytes(b)
    };
    Ok(Opened {
        node,
        nonce: num(0),
        ctr: num(1),
        echo: num(2),
        body: &signed[at + 24..],
    })
}

/// The bytes a tag covers, as [`Keys::tag`] feeds them.
fn tagged(topic: &str, signed: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(4 + topic.len() + signed.len());
    v.extend_from_slice(&u32::try_from(topic.len()).unwrap_or(u32::MAX).to_be_bytes());
    v.extend_from_slice(topic.as_bytes());
    v.extend_from_slice(signed);
    v
}

#[derive(Debug, Default)]
struct Peer {
    nonce: u64,
    ctr: u64,
    retired: VecDeque<u64>,
}

/// The receiving side: which session of each board is current.
#[derive(Debug, Default)]
pub struct Sessions {
    mine: u64,
    peers: HashMap<String, Peer>,
}

impl Sessions {
    /// This board's current session (what a new session of another must echo).
    pub fn set_mine(&mut self, nonce: u64) {
        self.mine = nonce;
    }

    /// Whether `m` is fresh: of the sender's current session with a rising
    /// counter, or a new session that echoes this board's own. Messages of this
    /// board itself are fresh only in its current session.
    pub fn accept(&mut self, own: &str, m: &Opened<'_>) -> Result<(), Refusal> {
        let p = self.peers.entry(m.node.to_owned()).or_default();
        if m.node == own {
            if m.nonce != self.mine {
                return Err(Refusal::Replayed);
            }
        } else if m.nonce != p.nonce {
            if p.retired.contains(&m.nonce) || m.echo != self.mine || self.mine == 0 {
                return Err(Refusal::Replayed);
            }
            if p.nonce != 0 {
                if p.retired.len() >= RETIRED {
                    p.retired.pop_front();
                }
                p.retired.push_back(p.nonce);
            }
            p.nonce = m.nonce;
            p.ctr = m.ctr;
            return Ok(());
        }
        if m.node == own && p.nonce != m.nonce {
            p.nonce = m.nonce;
            p.ctr = 0;
        }
        if m.ctr <= p.ctr {
            return Err(Refusal::Replayed);
        }
        p.ctr = m.ctr;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> Keys {
        Keys::parse(&Keys::generate().unwrap()).unwrap()
    }

    #[test]
    fn a_sealed_message_opens_only_with_its_key_topic_and_bytes() {
        let k = keys();
        let mut s = Sealer::new(k.clone(), "a", 7);
        s.heard(9);
        let m = s.seal("t/beat/a", b"hello");
        let o = open(&k, "t/beat/a", &m).unwrap();
        assert_eq!(
            (o.node, o.nonce, o.ctr, o.echo, o.body),
            ("a", 7, 1, 9, &b"hello"[..])
        );
        assert_eq!(
            open(&k, "t/beat/b", &m),
            Err(Refusal::Forged),
            "another topic"
        );
        assert_eq!(
            open(&keys(), "t/beat/a", &m),
            Err(Refusal::Forged),
            "another key"
        );
        for i in 0..m.len() {
            let mut bad = m.clone();
            bad[i] ^= 1;
            assert_eq!(open(&k, "t/beat/a", &bad), Err(Refusal::Forged), "byte {i}");
        }
        assert_eq!(open(&k, "t", b"{\"node\":\"a\"}"), Err(Refusal::Forged));
        assert_eq!(open(&k, "t", &[]), Err(Refusal::Forged));
        // During a key change the old key still opens.
        let two = Keys::parse(&format!(
            "{}{}",
            Keys::generate().unwrap(),
            Keys::generate().unwrap()
        ))
        .unwrap();
        let mut old = Sealer::new(
            Keys {
                keys: vec![two.keys[1].clone()],
            },
            "a",
            1,
        );
        assert!(open(&two, "t", &old.seal("t", b"x")).is_ok());
        assert!(Keys::parse("c2hvcnQ=\n").is_err() && Keys::parse("\n# none\n").is_err());
    }

    #[test]
    fn sessions_take_rising_counters_and_new_sessions_that_echo_ours_only() {
        let k = keys();
        let mut rx = Sessions::default();
        rx.set_mine(100);
        let mut a = Sealer::new(k.clone(), "a", 1);
        let m1 = a.seal("t", b"1");
        // A new session that does not echo ours: it may be from before our session.
        assert_eq!(
            rx.accept("b", &open(&k, "t", &m1).unwrap()),
            Err(Refusal::Replayed)
        );
        a.heard(100);
        let m2 = a.seal("t", b"2");
        let m3 = a.seal("t", b"3");
        assert_eq!(rx.accept("b", &open(&k, "t", &m2).unwrap()), Ok(()));
        assert_eq!(rx.accept("b", &open(&k, "t", &m3).unwrap()), Ok(()));
        assert_eq!(
            rx.accept("b", &open(&k, "t", &m2).unwrap()),
            Err(Refusal::Replayed)
        );
        let will = a.seal_will("t", b"dead");
        // a reconnects: its old session is retired, a replay of it refused.
        a.new_session(2);
        let n1 = a.seal("t", b"4");
        assert_eq!(rx.accept("b", &open(&k, "t", &n1).unwrap()), Ok(()));
        assert_eq!(
            rx.accept("b", &open(&k, "t", &m3).unwrap()),
            Err(Refusal::Replayed)
        );
        assert_eq!(
            rx.accept("b", &open(&k, "t", &will).unwrap()),
            Err(Refusal::Replayed)
        );
        // A will of the current session is taken once.
        let will2 = a.seal_will("t", b"dead");
        assert_eq!(rx.accept("b", &open(&k, "t", &will2).unwrap()), Ok(()));
        assert_eq!(
            rx.accept("b", &open(&k, "t", &will2).unwrap()),
            Err(Refusal::Replayed)
        );
        // After our own restart, a's messages must echo our new session.
        rx.set_mine(200);
        a.new_session(3);
        let stale = a.seal("t", b"5");
        assert_eq!(
            rx.accept("b", &open(&k, "t", &stale).unwrap()),
            Err(Refusal::Replayed)
        );
        a.heard(200);
        let fresh = a.seal("t", b"6");
        assert_eq!(rx.accept("b", &open(&k, "t", &fresh).unwrap()), Ok(()));
        // Our own messages count only in our current session.
        let mut me = Sealer::new(k.clone(), "b", 200);
        let own = me.seal("t", b"beat");
        assert_eq!(rx.accept("b", &open(&k, "t", &own).unwrap()), Ok(()));
        me.new_session(300);
        let own_new = me.seal("t", b"beat");
        assert_eq!(
            rx.accept("b", &open(&k, "t", &own_new).unwrap()),
            Err(Refusal::Replayed)
        );
    }
}
