//! Signed remote configuration (docs/reference.md#remote-configuration-fleet), the pure half: Ed25519 keys as the
//! PEM files OpenSSL writes, the `P/config/set` document and its signature, the
//! `P/config/result` payload, and the remote layer as it is kept on disk.

use std::io::Write;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use crate::model::Millis;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// DER of an Ed25519 SubjectPublicKeyInfo before its 32 key bytes (RFC 8410).
const SPKI_PREFIX: [u8; 12] = [
    0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
];
/// DER of a PKCS#8 v1 Ed25519 private key before its 32-byte seed, as
/// `openssl genpkey -algorithm ed25519` writes it.
const PKCS8_PREFIX: [u8; 16] = [
    0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20,
];

/// A key file that is not what it should be.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// Reading or writing the file.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// Not PEM, or not an Ed25519 key of the expected kind.
    #[error("{0}")]
    Format(String),
}

/// An Ed25519 public key (32 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PublicKey(pub [u8; 32]);

impl PublicKey {
    /// Reads a `PUBLIC KEY` PEM file (SubjectPublicKeyInfo, as `openssl pkey -pubout` writes).
    pub fn read(path: &Path) -> Result<Self, KeyError> {
        let der = pem_body(&std::fs::read_to_string(path)?, "PUBLIC KEY")?;
        der.strip_prefix(&SPKI_PREFIX[..])
            .and_then(|k| <[u8; 32]>::try_from(k).ok())
            .map(Self)
            .ok_or_else(|| KeyError::Format("not an Ed25519 public key".into()))
    }

    /// The PEM text of this key.
    pub fn pem(&self) -> String {
        let mut der = SPKI_PREFIX.to_vec();
        der.extend_from_slice(&self.0);
        pem("PUBLIC KEY", &der)
    }

    /// Base64 of the 32 key bytes (the `key` field of a document).
    pub fn b64(&self) -> String {
        B64.encode(self.0)
    }

    /// Whether `sig` is this key's signature of `msg`.
    pub fn verifies(&self, msg: &[u8], sig: &[u8]) -> bool {
        ring::signature::UnparsedPublicKey::new(&ring::signature::ED25519, self.0)
            .verify(msg, sig)
            .is_ok()
    }
}

/// An Ed25519 private key.
pub struct PrivateKey {
    seed: [u8; 32],
    pair: ring::signature::Ed25519KeyPair,
}

impl PrivateKey {
    /// A new random key.
    pub fn generate() -> Result<Self, KeyError> {
        let mut seed = [0u8; 32];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut seed)
            .map_err(|_| KeyError::Format("no randomness from the system".into()))?;
        Self::from_seed(seed)
    }

    fn from_seed(seed: [u8; 32]) -> Result<Self, KeyError> {
        let pair = ring::signature::Ed25519KeyPair::from_seed_unchecked(&seed)
            .map_err(|e| KeyError::Format(format!("bad Ed25519 seed: {e}")))?;
        Ok(Self { seed, pair })
    }

    /// Reads a `PRIVATE KEY` PEM file (PKCS#8, as `openssl genpkey -algorithm ed25519` writes).
    pub fn read(path: &Path) -> Result<Self, KeyError> {
        let der = pem_body(&std::fs::read_to_string(path)?, "PRIVATE KEY")?;
        // v1 as OpenSSL writes it, or v2 with the public key after the seed.
        if let Some(seed) = der
            .strip_prefix(&PKCS8_PREFIX[..])
            .and_then(|s| <[u8; 32]>::try_from(s).ok())
        {
            return Self::from_seed(seed);
        }
        ring::signature::Ed25519KeyPair::from_pkcs8_maybe_unchecked(&der)
            .map_err(|_| KeyError::Format("not an Ed25519 private key (PKCS#8)".into()))?;
        let seed = der
            .windows(4)
            .position(|w| w == [0x04, 0x22, 0x04, 0x20])
            .and_then(|i| <[u8; 32]>::try_from(der.get(i + 4..i + 36)?).ok())
            .ok_or_else(|| KeyError::Format("no Ed25519 seed in the PKCS#8 key".into()))?;
        Self::from_seed(seed)
    }

    /// The PEM text of this key (PKCS#8 v1).
    pub fn pem(&self) -> String {
        let mut der = PKCS8_PREFIX.to_vec();
        der.extend_from_slice(&self.seed);
        pem("PRIVATE KEY", &der)
    }

    /// Its public key.
    pub fn public(&self) -> PublicKey {
        use ring::signature::KeyPair as _;
        let mut k = [0u8; 32];
        k.copy_from_slice(self.pair.public_key().as_ref());
        PublicKey(k)
    }

    /// The signature of `msg`.
    pub fn sign(&self, msg: &[u8]) -> Vec<u8> {
        self.pair.sign(msg).as_ref().to_vec()
    }

    /// Writes the key to `path` (mode 0600, a new file) and the public key to `path.pub`.
    pub fn write(&self, path: &Path) -> Result<PathBuf, KeyError> {
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)?;
        f.write_all(self.pem().as_bytes())?;
        f.sync_all()?;
        let mut pub_path = path.as_os_str().to_owned();
        pub_path.push(".pub");
        let pub_path = PathBuf::from(pub_path);
        std::fs::write(&pub_path, self.public().pem())?;
        Ok(pub_path)
    }
}

fn pem(label: &str, der: &[u8]) -> String {
    let b = B64.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for chunk in b.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(chunk).unwrap_or_default());
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

fn pem_body(text: &str, label: &str) -> Result<Vec<u8>, KeyError> {
    let begin = format!("-----BEGIN {label}-----");
    let end = format!("-----END {label}-----");
    let body = text
        .split_once(&begin)
        .and_then(|(_, rest)| rest.split_once(&end))
        .map(|(b, _)| b)
        .ok_or_else(|| KeyError::Format(format!("no PEM block \"{label}\"")))?;
    let b: String = body.chars().filter(|c| !c.is_whitespace()).collect();
    B64.decode(b)
        .map_err(|e| KeyError::Format(format!("bad base64 in the PEM block: {e}")))
}

/// The bytes a v1 document's signature covers: `id` in decimal, a newline, the config.
pub fn signed_bytes(id: u64, config: &str) -> Vec<u8> {
    let mut m = id.to_string().into_bytes();
    m.push(b'\n');
    m.extend_from_slice(config.as_bytes());
    m
}

/// The bytes a v2 document's signature covers (docs/reference.md#remote-configuration-fleet): `tidemark-config-v2`,
/// the targets joined by `,`, `id`, `not_after` (empty when absent), each
/// followed by a newline, then the config.
pub fn signed_bytes_v2(
    targets: &[String],
    id: u64,
    not_after: Option<Millis>,
    config: &str,
) -> Vec<u8> {
    let not_after = not_after.map(|t| t.to_string()).unwrap_or_default();
    let mut m = format!(
        "tidemark-config-v2\n{}\n{id}\n{not_after}\n",
        targets.join(",")
    )
    .into_bytes();
    m.extend_from_slice(config.as_bytes());
    m
}

/// Where a document came from on the sink broker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// `P/config/set`: applied now or never.
    Set,
    /// The retained `P/config/desired`: applied once, whenever the gateway is there.
    Desired,
}

/// What a gateway checks a document against.
pub struct Checks<'a> {
    /// Keys whose signatures are taken.
    pub trusted: &'a [PublicKey],
    /// This gateway's id (`gateway.id`).
    pub gateway: &'a str,
    /// Epoch ms now (for `not_after`).
    pub now: Millis,
    /// `[fleet] accept_v1`: documents without targets.
    pub accept_v1: bool,
}

/// A `P/config/set` or `P/config/desired` message.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Document {
    /// Above the last applied one.
    pub id: u64,
    /// The remote layer, TOML.
    pub config: String,
    /// Base64 Ed25519 signature of [`signed_bytes_v2`] (of [`signed_bytes`] without targets).
    pub signature: String,
    /// Base64 of the signer's public key (optional; names the key so an unknown
    /// one is told apart from a bad signature).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The gateway ids it is for (`["*"]`: every gateway trusting the key); v2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub targets: Option<Vec<String>>,
    /// Epoch ms after which it is refused (`expired`); v2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_after: Option<Millis>,
}

impl Document {
    /// A v2 document for `targets`, signed by `key`.
    pub fn signed(
        id: u64,
        config: String,
        (targets, not_after): (Vec<String>, Option<Millis>),
        key: &PrivateKey,
    ) -> Self {
        let signature = B64.encode(key.sign(&signed_bytes_v2(&targets, id, not_after, &config)));
        Self {
            id,
            config,
            signature,
            key: Some(key.public().b64()),
            targets: Some(targets),
            not_after,
        }
    }

    /// A v1 document (no targets), as earlier releases signed them.
    pub fn signed_v1(id: u64, config: String, key: &PrivateKey) -> Self {
        let signature = B64.encode(key.sign(&signed_bytes(id, &config)));
        Self {
            id,
            config,
            signature,
            key: Some(key.public().b64()),
            targets: None,
            not_after: None,
        }
    }

    /// The bytes its signature covers.
    fn message(&self) -> Vec<u8> {
        match &self.targets {
            Some(t) => signed_bytes_v2(t, self.id, self.not_after, &self.config),
            None => signed_bytes(self.id, &self.config),
        }
    }

    /// `Ok` when a trusted key signed it for this gateway and it is still valid,
    /// else the reason (`unsigned_target`, `signature`, `untrusted_key`,
    /// `not_for_this_gateway`, `expired`).
    pub fn verify(&self, c: &Checks<'_>) -> Result<(), &'static str> {
        if self.targets.is_none() && !c.accept_v1 {
            return Err("unsigned_target");
        }
        // Targets are joined by `,` and end at a newline in the signed bytes: one
        // holding either (or any control character) could shift what was signed.
        if let Some(t) = &self.targets
            && !t.iter().all(|t| valid_target(t))
        {
            return Err(
                "invalid: targets: each must be a gateway id ([A-Za-z0-9_-]{1,64}) or \"*\"",
            );
        }
        self.verify_signature(c.trusted)?;
        if let Some(t) = &self.targets
            && !t.iter().any(|t| t == c.gateway || t == "*")
        {
            return Err("not_for_this_gateway");
        }
        if self.not_after.is_some_and(|t| c.now > t) {
            return Err("expired");
        }
        Ok(())
    }

    fn verify_signature(&self, trusted: &[PublicKey]) -> Result<(), &'static str> {
        let Ok(sig) = B64.decode(self.signature.trim()) else {
            return Err("signature");
        };
        let msg = self.message();
        match &self.key {
            Some(k) => {
                let named = B64
                    .decode(k.trim())
                    .ok()
                    .and_then(|b| <[u8; 32]>::try_from(b).ok())
                    .map(PublicKey);
                match named.filter(|n| trusted.contains(n)) {
                    None => Err("untrusted_key"),
                    Some(n) if n.verifies(&msg, &sig) => Ok(()),
                    Some(_) => Err("signature"),
                }
            }
            None if trusted.iter().any(|k| k.verifies(&msg, &sig)) => Ok(()),
            None => Err("signature"),
        }
    }
}

/// A target as the signed bytes allow it: `*` or a gateway id.
pub fn valid_target(t: &str) -> bool {
    t == "*"
        || (!t.is_empty()
            && t.len() <= 64
            && t.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'))
}

/// What became of a document.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// In force, both connections confirmed.
    Applied,
    /// Nothing changed.
    Rejected,
    /// Applied, then undone: a connection did not come up within `confirm_s`.
    RolledBack,
}

/// The `P/config/result` payload.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ConfigResult {
    /// The document's id (`None` when the message had none).
    pub id: Option<u64>,
    /// What became of it.
    pub result: Outcome,
    /// The config hash in force after it (applied, rolled back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash: Option<String>,
    /// Reasons (rejected, rolled back).
    #[serde(default)]
    pub errors: Vec<String>,
    /// Epoch ms.
    pub at: Millis,
}

/// The remote layer in force and the highest id taken so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Remote {
    /// The id of the document whose config is in force (0: none).
    pub id: u64,
    /// The highest id applied, including one rolled back since.
    pub last_id: u64,
    /// The TOML of the layer ("" for none).
    pub config: String,
}

/// The file of the remote layer in `state_dir`.
pub fn remote_path(state_dir: &Path) -> PathBuf {
    state_dir.join("remote.toml")
}

impl Remote {
    /// Reads `state_dir/remote.toml` (`None` if there is none).
    pub fn read(state_dir: &Path) -> std::io::Result<Option<Self>> {
        let text = match std::fs::read_to_string(remote_path(state_dir)) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let header = |name: &str| {
            text.lines()
                .take_while(|l| l.starts_with('#'))
                .find_map(|l| l.strip_prefix(&format!("# {name} = ")))
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        let (Some(id), Some(last_id)) = (header("id"), header("last_id")) else {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "remote.toml has no `# id = N` / `# last_id = N` header",
            ));
        };
        let config = text
            .split_once("\n# end of header\n")
            .map_or(String::new(), |(_, c)| c.to_owned());
        Ok(Some(Self {
            id,
            last_id,
            config,
        }))
    }

    /// Writes it to a new file, fsyncs it, renames it over `remote.toml` and
    /// fsyncs the directory, so a power cut leaves the old layer or the new one.
    pub fn write(&self, state_dir: &Path) -> std::io::Result<()> {
        let tmp = state_dir.join("remote.toml.new");
        let mut f = std::fs::File::create(&tmp)?;
        write!(
            f,
            "# tidemark remote layer (docs/reference.md#remote-configuration-fleet), written by the gateway: do not edit.\n\
             # id = {}\n# last_id = {}\n# end of header\n{}",
            self.id, self.last_id, self.config
        )?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, remote_path(state_dir))?;
        std::fs::File::open(state_dir)?.sync_all()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_with_separators_or_control_characters_are_refused_before_the_signature() {
        let key = PrivateKey::generate().unwrap();
        let trusted = [key.public()];
        let checks = Checks {
            trusted: &trusted,
            gateway: "gw-a",
            now: 0,
            accept_v1: false,
        };
        for bad in ["gw-a,gw-b", "gw-a\n", "gw\u{7}", "", "gw a"] {
            let doc = Document::signed(
                1,
                "x = 1\n".into(),
                (vec![bad.into(), "gw-a".into()], None),
                &key,
            );
            assert_eq!(
                doc.verify(&checks)
                    .map_err(|e| e.split(':').next().unwrap_or(e)),
                Err("invalid"),
                "{bad:?}"
            );
        }
        for good in ["gw-a", "*"] {
            let doc = Document::signed(1, "x = 1\n".into(), (vec![good.into()], None), &key);
            assert_eq!(doc.verify(&checks), Ok(()), "{good:?}");
        }
    }

    #[test]
    fn keys_round_trip_through_pem_and_sign_documents_that_verify() {
        let dir = tempfile::tempdir().unwrap();
        let key = PrivateKey::generate().unwrap();
        let path = dir.path().join("k");
        let pub_path = key.write(&path).unwrap();
        let again = PrivateKey::read(&path).unwrap();
        assert_eq!(again.public(), key.public());
        let public = PublicKey::read(&pub_path).unwrap();
        assert_eq!(public, key.public());
        let doc = Document::signed(
            7,
            "[log]\nlevel = \"debug\"\n".into(),
            (vec!["gw-a".into(), "gw-b".into()], Some(5_000)),
            &key,
        );
        let other = PrivateKey::generate().unwrap().public();
        fn checks<'a>(trusted: &'a [PublicKey], gateway: &'a str, now: Millis) -> Checks<'a> {
            Checks {
                trusted,
                gateway,
                now,
                accept_v1: false,
            }
        }
        let (both, ours, theirs) = (&[other, public][..], &[public][..], &[other][..]);
        assert_eq!(doc.verify(&checks(ours, "gw-b", 5_000)), Ok(()));
        assert_eq!(
            doc.verify(&checks(ours, "gw-c", 0)),
            Err("not_for_this_gateway")
        );
        assert_eq!(doc.verify(&checks(ours, "gw-a", 5_001)), Err("expired"));
        assert_eq!(doc.verify(&checks(theirs, "gw-a", 0)), Err("untrusted_key"));
        let mut unnamed = doc.clone();
        unnamed.key = None;
        assert_eq!(unnamed.verify(&checks(both, "gw-a", 0)), Ok(()));
        assert_eq!(unnamed.verify(&checks(theirs, "gw-a", 0)), Err("signature"));
        // Every field the signature covers is bound: retargeting, a later expiry, v1 framing.
        for tamper in [
            |d: &mut Document| d.id += 1,
            |d: &mut Document| d.config.push(' '),
            |d: &mut Document| d.signature = "AAAA".into(),
            |d: &mut Document| d.signature = "not base64!".into(),
            |d: &mut Document| d.targets = Some(vec!["gw-c".into()]),
            |d: &mut Document| d.targets = Some(vec!["*".into()]),
            |d: &mut Document| d.not_after = None,
            |d: &mut Document| d.not_after = Some(6_000),
        ] {
            let mut d = doc.clone();
            tamper(&mut d);
            assert_eq!(
                d.verify(&checks(ours, "gw-c", 0))
                    .and(d.verify(&checks(ours, "gw-a", 0))),
                Err("signature")
            );
        }
        // The same bytes with one comma-joined target: refused as a target no gateway has.
        let mut joined = doc.clone();
        joined.targets = Some(vec!["gw-a,gw-b".into()]);
        for gw in ["gw-a", "gw-b"] {
            assert!(
                joined
                    .verify(&checks(ours, gw, 0))
                    .is_err_and(|e| e.starts_with("invalid: targets")),
                "{gw}"
            );
        }
        let star = Document::signed(8, String::new(), (vec!["*".into()], None), &key);
        assert_eq!(star.verify(&checks(ours, "anyone", i64::MAX)), Ok(()));
        // v1: refused unless accepted, then only its signature counts.
        let v1 = Document::signed_v1(9, "x".into(), &key);
        assert_eq!(v1.verify(&checks(ours, "gw-a", 0)), Err("unsigned_target"));
        let lenient = Checks {
            accept_v1: true,
            ..checks(ours, "gw-a", 0)
        };
        assert_eq!(v1.verify(&lenient), Ok(()));
        let mut forged = doc.clone();
        forged.targets = None;
        forged.not_after = None;
        assert_eq!(forged.verify(&lenient), Err("signature"));
        // An existing key file is never overwritten.
        assert!(key.write(&path).is_err());
    }

    #[test]
    fn the_remote_layer_survives_a_write_and_read() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(Remote::read(dir.path()).unwrap(), None);
        let r = Remote {
            id: 3,
            last_id: 5,
            config: "# a comment\n[log]\nlevel = \"warn\"\n".into(),
        };
        r.write(dir.path()).unwrap();
        assert_eq!(Remote::read(dir.path()).unwrap(), Some(r));
        std::fs::write(remote_path(dir.path()), "[log]\n").unwrap();
        assert!(Remote::read(dir.path()).is_err());
    }
}
