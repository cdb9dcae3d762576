//! What a reload needs of two configs (docs/reference.md#reload-sighup-systemctl-reload-tidemark): the hash operators compare,
//! the keys that changed, the ones that need a restart, and the engine's part
//! as a document the journal can carry.

use std::collections::BTreeMap;

use super::whole::{Config, ConfigError};
use crate::engine::EngineConfig;

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
        for (label, ep) in [
            ("source", &self.source.endpoint),
            ("sink", &self.sink.endpoint),
        ] {
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

    /// Keys of this config that `new` changes and only a restart can (docs/reference.md#reload-sighup-systemctl-reload-tidemark).
    pub fn needs_restart(&self, new: &Config) -> Vec<&'static str> {
        let mut keys = self.gateway.needs_restart(&new.gateway);
        keys.extend(self.broker.needs_restart(&new.broker));
        // The edge node's session and task are made at start (its bdSeq, its will).
        if self.sink.plain != new.sink.plain {
            keys.push("sink.plain");
        }
        if self.sink.sparkplug != new.sink.sparkplug {
            keys.push("sink.sparkplug");
        }
        // The database outputs' tasks and cursors are made at start.
        if self.sink.postgres != new.sink.postgres {
            keys.push("sink.postgres");
        }
        if self.sink.influx != new.sink.influx {
            keys.push("sink.influx");
        }
        // The pair's role and sessions are decided at start.
        if self.standby != new.standby {
            keys.push("standby");
        }
        keys
    }
}

/// The engine settings of a record: [`EngineConfig::record`]'s, or a TOML
/// document of the earlier layout (journals and checkpoints before 2026-12).
pub fn engine_from_record(bytes: &[u8]) -> Result<EngineConfig, ConfigError> {
    if let Some(rules) = EngineConfig::from_record(bytes) {
        return Ok(rules);
    }
    let doc = std::str::from_utf8(bytes).map_err(|_| {
        ConfigError::one("engine rules: neither a record nor a TOML document".into())
    })?;
    super::load::load_str(doc, &BTreeMap::new()).map(|c| c.engine)
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
        assert_eq!(a.needs_restart(&b), vec!["broker.embedded"]);
        assert_ne!(a.hash(), b.hash());
    }

    #[test]
    fn a_record_rebuilds_the_same_engine_settings_and_a_toml_one_still_reads() {
        let a = cfg(
            "[groups.\"a.b\"]\nwindow = { kind = \"session\", gap_ms = 4000 }\n[time]\nmax_skew_ms = 1000\n\
             [payload]\nseq_field = \"n\"\n[source]\ntopic_pattern = \"x/{group}/{device}/{kind}\"\n",
        );
        let record = a.engine.record();
        assert_eq!(engine_from_record(&record).unwrap(), a.engine);
        // The layout before 2026-12: the engine's keys as a TOML document.
        let legacy = "[gateway]\nid = \"gw\"\n[groups.\"a.b\"]\nwindow = { kind = \"session\", gap_ms = 4000 }\n\
                      [time]\nmax_skew_ms = 1000\n[payload]\nseq_field = \"n\"\n\
                      [source]\ntopic_pattern = \"x/{group}/{device}/{kind}\"\n";
        assert_eq!(engine_from_record(legacy.as_bytes()).unwrap(), a.engine);
        assert!(engine_from_record(b"\xff\x00").is_err());
    }

    #[test]
    fn only_the_gateway_identity_and_the_broker_need_a_restart() {
        let a = cfg("[broker]\nembedded = true\n");
        let moved = cfg("[broker]\nembedded = true\nlisten = \"127.0.0.1:1999\"\n");
        assert_eq!(a.needs_restart(&moved), vec!["broker.listen"]);
        let off = cfg("[broker]\nlisten = \"127.0.0.1:1999\"\n");
        assert_eq!(cfg("").needs_restart(&off), vec!["broker.listen"]);
        assert!(cfg("[metrics]\ninterval_s = 3\n").needs_restart(&a) == vec!["broker.embedded"]);
        let dir = super::super::load_str(
            "[gateway]\nid = \"gw\"\nstate_dir = \"/tmp/x\"\n",
            &BTreeMap::new(),
        )
        .unwrap();
        assert_eq!(cfg("").needs_restart(&dir), vec!["gateway.state_dir"]);
        // The edge node's session is made at start.
        let edge = cfg("[sink.sparkplug]\nenabled = true\n");
        assert_eq!(cfg("").needs_restart(&edge), vec!["sink.sparkplug"]);
        let renamed = cfg("[sink.sparkplug]\nenabled = true\nedge_node_id = \"e2\"\n");
        assert_eq!(edge.needs_restart(&renamed), vec!["sink.sparkplug"]);
        let only = cfg("[sink]\nplain = false\n[sink.sparkplug]\nenabled = true\n");
        assert_eq!(edge.needs_restart(&only), vec!["sink.plain"]);
        assert!(
            cfg("[sink]\nmax_inflight = 9\n")
                .needs_restart(&cfg(""))
                .is_empty()
        );
    }
}
