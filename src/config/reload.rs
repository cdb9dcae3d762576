//! What a reload needs of two configs (SPEC §11): the hash operators compare,
//! the keys that changed, the ones that need a restart, and the engine's part
//! as a document the journal can carry.

use std::collections::BTreeMap;

use super::{Config, ConfigError, EngineConfig};

/// Keys (and key prefixes ending in `.`) that only a restart can change.
pub const RESTART_ONLY: [&str; 3] = ["gateway.id", "gateway.state_dir", "broker."];

/// Sections of the effective config the engine is built from.
const ENGINE_KEYS: [&str; 6] = [
    "source.topic_pattern",
    "payload.",
    "time.",
    "group_defaults.",
    "groups.",
    "sparkplug.",
];

impl Config {
    /// First 16 hex digits of the SHA-256 of the effective config as `check` prints it.
    pub fn hash(&self) -> String {
        let d = ring::digest::digest(&ring::digest::SHA256, self.effective_toml().as_bytes());
        d.as_ref()[..8].iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Every leaf of the effective config by dotted key (passwords as a digest of their value).
    fn leaves(&self) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        if let Ok(t) = toml::from_str::<toml::Table>(&self.effective_toml()) {
            flatten(&mut out, "", &t);
        }
        for (label, ep) in [("source", &self.source), ("sink", &self.sink)] {
            if let Some(p) = &ep.password {
                let d = ring::digest::digest(&ring::digest::SHA256, p.as_bytes());
                out.insert(
                    format!("{label}.password_file#content"),
                    format!("{:?}", d.as_ref()),
                );
            }
        }
        out
    }

    /// Dotted keys whose effective value differs between `self` and `new`, sorted.
    pub fn changed_keys(&self, new: &Config) -> Vec<String> {
        let (a, b) = (self.leaves(), new.leaves());
        let mut keys: Vec<String> = a
            .keys()
            .chain(b.keys())
            .filter(|k| a.get(*k) != b.get(*k))
            .map(|k| k.replace("#content", ""))
            .collect();
        keys.sort();
        keys.dedup();
        keys
    }

    /// The engine's part of the effective config as a TOML document (no secrets,
    /// no file names): what the journal records of a reload and the store of a checkpoint.
    pub fn engine_doc(&self) -> String {
        let mut leaves = BTreeMap::new();
        if let Ok(t) = toml::from_str::<toml::Table>(&self.effective_toml()) {
            flatten_values(&mut leaves, "", &t);
        }
        let mut doc = toml::Table::new();
        let mut gw = toml::Table::new();
        gw.insert(
            "id".into(),
            toml::Value::String(self.gateway_id.to_string()),
        );
        doc.insert("gateway".into(), toml::Value::Table(gw));
        for (key, value) in leaves {
            if !ENGINE_KEYS
                .iter()
                .any(|p| key == *p || (p.ends_with('.') && key.starts_with(p)))
            {
                continue;
            }
            insert_dotted(&mut doc, &key, value);
        }
        toml::to_string(&doc).unwrap_or_default()
    }
}

/// Keys of `changed` that need a restart.
pub fn needs_restart(changed: &[String]) -> Vec<String> {
    changed
        .iter()
        .filter(|k| {
            RESTART_ONLY
                .iter()
                .any(|p| *k == p || (p.ends_with('.') && k.starts_with(p)))
        })
        .cloned()
        .collect()
}

/// The engine settings of a document written by [`Config::engine_doc`].
pub fn engine_from_doc(doc: &str) -> Result<EngineConfig, ConfigError> {
    super::load_str(doc, &BTreeMap::new()).map(|c| c.engine())
}

fn flatten(out: &mut BTreeMap<String, String>, prefix: &str, t: &toml::Table) {
    let mut values = BTreeMap::new();
    flatten_values(&mut values, prefix, t);
    out.extend(values.into_iter().map(|(k, v)| (k, v.to_string())));
}

/// Leaves by dotted key; inline tables (a group's `window`) and arrays stay one value.
fn flatten_values(out: &mut BTreeMap<String, toml::Value>, prefix: &str, t: &toml::Table) {
    for (k, v) in t {
        let key = format!("{prefix}{k}");
        match v {
            toml::Value::Table(inner) if !is_leaf_table(&key) => {
                flatten_values(out, &format!("{key}."), inner);
            }
            _ => {
                out.insert(key, v.clone());
            }
        }
    }
}

/// `window` is one setting although it is written as a table.
fn is_leaf_table(key: &str) -> bool {
    key.ends_with(".window")
}

fn insert_dotted(doc: &mut toml::Table, key: &str, value: toml::Value) {
    let mut parts: Vec<&str> = Vec::new();
    // Group names may hold dots: `groups.NAME.key` splits at the first and the last.
    if let Some(rest) = key.strip_prefix("groups.")
        && let Some((name, leaf)) = rest.rsplit_once('.')
    {
        parts.extend(["groups", name, leaf]);
    } else {
        parts.extend(key.split('.'));
    }
    let mut t = doc;
    for p in &parts[..parts.len() - 1] {
        t = match t
            .entry((*p).to_owned())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()))
        {
            toml::Value::Table(inner) => inner,
            _ => return,
        };
    }
    t.insert(parts[parts.len() - 1].to_owned(), value);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(extra: &str) -> Config {
        super::super::load_str(
            &format!("[gateway]\nid = \"gw\"\n{extra}"),
            &BTreeMap::new(),
        )
        .unwrap()
    }

    #[test]
    fn the_same_config_has_the_same_hash_and_no_changed_keys() {
        let (a, b) = (cfg(""), cfg(""));
        assert_eq!(a.hash(), b.hash());
        assert_eq!(a.hash().len(), 16);
        assert!(a.changed_keys(&b).is_empty());
    }

    #[test]
    fn changed_keys_name_each_setting_and_a_group_window_as_one() {
        let a = cfg("[groups.hvac]\nout_of_orderness_ms = 5000\n");
        let b = cfg(
            "[groups.hvac]\nout_of_orderness_ms = 5000\nwindow = { kind = \"tumbling\", size_ms = 30000 }\n\
             [source]\ntopics = [\"a/#\"]\n[broker]\nembedded = true\n",
        );
        let keys = a.changed_keys(&b);
        assert_eq!(
            keys,
            vec!["broker.embedded", "groups.hvac.window", "source.topics"]
        );
        assert_eq!(needs_restart(&keys), vec!["broker.embedded"]);
        assert_ne!(a.hash(), b.hash());
    }

    #[test]
    fn the_engine_doc_rebuilds_the_same_engine_settings() {
        let a = cfg(
            "[groups.\"a.b\"]\nwindow = { kind = \"session\", gap_ms = 4000 }\n[time]\nmax_skew_ms = 1000\n\
             [payload]\nseq_field = \"n\"\n[source]\ntopic_pattern = \"x/{group}/{device}/{kind}\"\n",
        );
        let doc = a.engine_doc();
        assert!(!doc.contains("state_dir"), "{doc}");
        let e = engine_from_doc(&doc).unwrap();
        let want = a.engine();
        assert_eq!(e.groups.of("a.b"), want.groups.of("a.b"));
        assert_eq!(e.groups.defaults, want.groups.defaults);
        assert_eq!(e.time.max_skew_ms, 1000);
        assert_eq!(format!("{:?}", e.payload), format!("{:?}", want.payload));
        assert_eq!(format!("{:?}", e.pattern), format!("{:?}", want.pattern));
    }
}
