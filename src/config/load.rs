//! Layering: embedded defaults < files < remote layer < environment, every
//! problem collected and named by key and by the file or variable that set it.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::fleet::Fleet;
use super::validate::{self, describe_config_error, describe_serde_error};
use super::whole::{Config, ConfigError, RawConfig};

/// Loads the files in order (a later file wins key by key) over the defaults,
/// then the process environment over all of them.
pub fn load(paths: &[PathBuf]) -> Result<Config, ConfigError> {
    let env: BTreeMap<String, String> = std::env::vars().collect();
    load_with_env(paths, &env)
}

/// Like [`load`] with an explicit environment (tests).
pub fn load_with_env(
    paths: &[PathBuf],
    env: &BTreeMap<String, String>,
) -> Result<Config, ConfigError> {
    let mut layers = Vec::with_capacity(paths.len());
    for path in paths {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::one(format!("config file {}: {e}", path.display())))?;
        layers.push((path.display().to_string(), text));
    }
    load_layers(&layers, env)
}

/// The name a remote layer's keys are shown as coming from (`check`).
pub const REMOTE: &str = "remote";

/// Like [`load_with_env`] with a remote layer (docs/reference.md#remote-configuration-fleet) above the files.
pub fn load_with_remote(
    paths: &[PathBuf],
    env: &BTreeMap<String, String>,
    remote: &str,
) -> Result<Config, ConfigError> {
    let mut layers = Vec::with_capacity(paths.len() + 1);
    for path in paths {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::one(format!("config file {}: {e}", path.display())))?;
        layers.push((path.display().to_string(), text));
    }
    let local = load_layers(&layers, env)?;
    layers.push((REMOTE.to_owned(), remote.to_owned()));
    let merged = load_layers(&layers, env)?;
    // What points where the documents come from and who may sign them stays local,
    // however the document spells it (a table, a dotted or quoted key): judged on the result.
    let mut problems = fleet_changes(&local.fleet, &merged.fleet);
    if problems.is_empty()
        && let Ok(t) = toml::from_str::<toml::Table>(remote)
        && t.keys().any(|k| k == "fleet" || k.starts_with("fleet."))
    {
        problems.push("fleet: is local only (a remote document cannot name it)".to_owned());
    }
    if problems.is_empty() {
        Ok(merged)
    } else {
        Err(ConfigError { problems })
    }
}

/// `fleet.<key> is local only` for each `[fleet]` value `remote` differs from `local` in.
fn fleet_changes(local: &Fleet, remote: &Fleet) -> Vec<String> {
    let mut out = Vec::new();
    let mut differs = |key: &str, same: bool| {
        if !same {
            out.push(format!("fleet.{key} is local only"));
        }
    };
    differs("enabled", local.enabled == remote.enabled);
    differs("trusted_keys", local.trusted_keys == remote.trusted_keys);
    differs("confirm_s", local.confirm_ms == remote.confirm_ms);
    differs("accept_v1", local.accept_v1 == remote.accept_v1);
    out
}

/// The gateway's config as `run` and `check` see it: the files and the
/// environment, with the remote layer kept in `state_dir` when `[fleet]` is
/// enabled. A remote layer that no longer fits is left out, with the reason.
pub fn load_gateway(
    paths: &[PathBuf],
) -> Result<(Config, Option<crate::fleet::Remote>, Option<String>), ConfigError> {
    let env: BTreeMap<String, String> = std::env::vars().collect();
    let local = load_with_env(paths, &env)?;
    if !local.fleet.enabled {
        return Ok((local, None, None));
    }
    let remote = match crate::fleet::Remote::read(&local.gateway.state_dir) {
        Ok(Some(r)) => r,
        Ok(None) => return Ok((local, None, None)),
        Err(e) => {
            let why = format!(
                "{}: {e}; running on the local config",
                crate::fleet::remote_path(&local.gateway.state_dir).display()
            );
            return Ok((local, None, Some(why)));
        }
    };
    match over_remote(local, paths, &env, &remote.config) {
        (cfg, None) => Ok((cfg, Some(remote), None)),
        (local, Some(why)) => {
            let why = format!(
                "remote layer (document {}) left out: {why}; running on the local config",
                remote.id
            );
            // Its ids stay taken.
            let kept = crate::fleet::Remote {
                id: 0,
                config: String::new(),
                ..remote
            };
            Ok((local, Some(kept), Some(why)))
        }
    }
}

/// `local` (the files and `env`) with the remote layer `remote` above the files
/// when `local` enables `[fleet]`; a layer that no longer fits them is left out,
/// with the reason.
pub fn over_remote(
    local: Config,
    paths: &[PathBuf],
    env: &BTreeMap<String, String>,
    remote: &str,
) -> (Config, Option<String>) {
    if !local.fleet.enabled || remote.is_empty() {
        return (local, None);
    }
    match load_with_remote(paths, env, remote) {
        Ok(cfg) => (cfg, None),
        Err(e) => (local, Some(e.problems.join("; "))),
    }
}

/// Parses a TOML document layered over the defaults and under `env`.
pub fn load_str(text: &str, env: &BTreeMap<String, String>) -> Result<Config, ConfigError> {
    load_layers(&[("<config>".to_owned(), text.to_owned())], env)
}

/// The bottom layer of every configuration: each section's defaults, from its
/// struct. A group's window is one value (a file's window replaces it whole,
/// never merges with it key by key), so it is left to its serde default.
fn bottom_layer() -> toml::Table {
    let mut t = toml::Table::try_from(RawConfig::default()).unwrap_or_default();
    if let Some(toml::Value::Table(g)) = t.get_mut("group_defaults") {
        g.remove("window");
    }
    t
}

/// `(name, TOML text)` layers over the defaults, `env` over all of them.
fn load_layers(
    layers: &[(String, String)],
    env: &BTreeMap<String, String>,
) -> Result<Config, ConfigError> {
    use config::{Environment, File, FileFormat};
    let env_map: config::Map<String, String> = env
        .iter()
        .filter(|(k, _)| k.starts_with("TIDEMARK__"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let defaults = toml::to_string(&bottom_layer()).unwrap_or_default();
    let mut builder =
        config::Config::builder().add_source(File::from_str(&defaults, FileFormat::Toml));
    let mut sources = BTreeMap::new();
    for (name, text) in layers {
        // Parsed once on its own so a syntax error names its file.
        let doc: toml::Table = toml::from_str(text).map_err(|e| {
            let at = e.span().map_or(String::new(), |span| {
                let before = &text[..span.start.min(text.len())];
                let line = before.matches('\n').count() + 1;
                let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
                format!(" line {line}, column {column}:")
            });
            ConfigError::one(format!("config file {name}:{at} {}", e.message().trim()))
        })?;
        provenance(&mut sources, "", &doc, name);
        builder = builder.add_source(File::from_str(text, FileFormat::Toml));
    }
    for key in env_map.keys() {
        if let Some(rest) = key.strip_prefix("TIDEMARK__") {
            let dotted = rest.to_ascii_lowercase().replace("__", ".");
            sources.retain(|k: &String, _| !k.starts_with(&format!("{dotted}.")));
            sources.insert(dotted, format!("env {key}"));
        }
    }
    let layered = builder
        .add_source(
            Environment::with_prefix("TIDEMARK")
                .prefix_separator("__")
                .separator("__")
                .try_parsing(true)
                .list_separator(",")
                .with_list_parse_key("source.topics")
                .source(Some(env_map)),
        )
        .build()
        .map_err(|e| ConfigError::one(describe_config_error(&e)))?;
    let tree: serde_json::Value = layered
        .try_deserialize()
        .map_err(|e| ConfigError::one(describe_config_error(&e)))?;
    let (raw, mut problems) = deserialize_all(tree);
    let named = |problems: Vec<String>| ConfigError {
        problems: problems
            .into_iter()
            .map(|p| name_the_source(p, &sources))
            .collect(),
    };
    let Some(raw) = raw else {
        return Err(named(problems));
    };
    // Rule violations too, so one run lists every problem (the bad keys above
    // stand at their defaults here).
    match validate::validate(raw) {
        Ok(mut cfg) if problems.is_empty() => {
            cfg.sources = sources;
            Ok(cfg)
        }
        Ok(_) => Err(named(problems)),
        Err(e) => {
            problems.extend(e.problems);
            Err(named(problems))
        }
    }
}

/// Deserializes `tree`, collecting every unknown key and wrong type: each one is
/// reported, then removed (unknown) or set to its default, and the rest tried again.
fn deserialize_all(mut tree: serde_json::Value) -> (Option<RawConfig>, Vec<String>) {
    let defaults = serde_json::to_value(bottom_layer()).unwrap_or_default();
    let mut problems = Vec::new();
    loop {
        match serde_path_to_error::deserialize::<_, RawConfig>(tree.clone()) {
            Ok(raw) => return (Some(raw), problems),
            Err(e) => {
                let path = e.path().to_string();
                let msg = e.into_inner().to_string();
                problems.push(describe_serde_error(&path, &msg));
                if problems.len() >= 100 || !repair(&mut tree, &defaults, &path, &msg) {
                    return (None, problems);
                }
            }
        }
    }
}

/// Takes the key an error names out of the way: an unknown key is removed, a wrong
/// value replaced by its default (a group's by `group_defaults`'), else removed.
fn repair(
    tree: &mut serde_json::Value,
    defaults: &serde_json::Value,
    path: &str,
    msg: &str,
) -> bool {
    let mut keys: Vec<String> = if path == "." {
        Vec::new()
    } else {
        path.split('.').map(str::to_owned).collect()
    };
    if let Some(rest) = msg.strip_prefix("unknown field `") {
        let key = rest.split('`').next().unwrap_or(rest);
        if keys.last().map(String::as_str) != Some(key) {
            keys.push(key.to_owned());
        }
    }
    let Some((leaf, parents)) = keys.split_last() else {
        return false;
    };
    let mut default_path: Vec<&str> = keys.iter().map(String::as_str).collect();
    if default_path.first() == Some(&"groups") && default_path.len() > 2 {
        default_path.splice(..2, ["group_defaults"]);
    }
    let default = if msg.starts_with("unknown field") {
        None
    } else {
        default_path
            .iter()
            .try_fold(defaults, |v, k| v.get(*k))
            .cloned()
    };
    let Some(parent) = parents
        .iter()
        .try_fold(&mut *tree, |v, k| v.get_mut(k.as_str()))
        .and_then(serde_json::Value::as_object_mut)
    else {
        return false;
    };
    match default {
        Some(d) => parent.insert(leaf.clone(), d).is_some(),
        None => parent.remove(leaf).is_some(),
    }
}

/// `key: problem` with the environment variable named when one set the key, and
/// the deserializer's type names in plain words.
fn name_the_source(problem: String, sources: &BTreeMap<String, String>) -> String {
    let Some((key, what)) = problem.split_once(": ") else {
        return problem;
    };
    let what = plain_words(key, what);
    match sources.get(key).and_then(|s| s.strip_prefix("env ")) {
        Some(var) => format!("{key} (set by environment variable {var}): {what}"),
        None => format!("{key}: {what}"),
    }
}

fn plain_words(key: &str, what: &str) -> String {
    let number = if key.ends_with("_ms") {
        "a whole number of milliseconds"
    } else if key.ends_with("_s") {
        "a whole number of seconds"
    } else if key.ends_with("qos") {
        "0 or 1"
    } else {
        "a whole number"
    };
    let mut out = what.to_owned();
    for t in ["u8", "u16", "u32", "u64", "usize", "i64", "i32"] {
        out = out.replace(&format!("expected {t}"), &format!("expected {number}"));
    }
    out.replace("expected a sequence", "expected a list")
        .replace("expected a map", "expected a table")
        .replace("invalid type: integer", "invalid type: number")
        .replace("invalid type: sequence", "invalid type: list")
        .replace("invalid type: map", "invalid type: table")
}

/// Records `name` as the origin of every leaf of `table` (a later layer overwrites).
fn provenance(out: &mut BTreeMap<String, String>, prefix: &str, table: &toml::Table, name: &str) {
    for (k, v) in table {
        let key = format!("{prefix}{k}");
        match v {
            toml::Value::Table(t) => provenance(out, &format!("{key}."), t, name),
            _ => {
                out.insert(key, name.to_owned());
            }
        }
    }
}

/// `effective` TOML with a `# from ...` comment on every line whose key was set
/// by a file or the environment; other values are defaults (or derived from them).
pub fn annotate_sources(effective: &str, sources: &BTreeMap<String, String>) -> String {
    let mut out = String::with_capacity(effective.len() * 2);
    let mut table = String::new();
    // `[[a.b]]`: each key of an element comes from where the whole list did.
    let mut list = false;
    for line in effective.lines() {
        let trimmed = line.trim_start();
        out.push_str(line);
        if let Some(h) = trimmed.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
            list = h.starts_with('[');
            table = h.trim_matches(['[', ']']).replace('"', "");
        } else if let Some((k, _)) = trimmed.split_once(" = ") {
            let key = if table.is_empty() {
                k.trim().to_owned()
            } else {
                format!("{table}.{}", k.trim().trim_matches('"'))
            };
            // A group's unset key comes from `[group_defaults]`.
            let inherited = key
                .strip_prefix("groups.")
                .and_then(|rest| rest.split_once('.'))
                .and_then(|(_, k)| sources.get(&format!("group_defaults.{k}")));
            let own = sources
                .get(&key)
                .or_else(|| list.then(|| sources.get(&table)).flatten());
            let inherited = inherited.or_else(|| {
                list.then(|| {
                    table
                        .strip_prefix("groups.")
                        .and_then(|rest| rest.split_once('.'))
                        .and_then(|(_, k)| sources.get(&format!("group_defaults.{k}")))
                })
                .flatten()
            });
            match (own, inherited) {
                (Some(o), _) => out.push_str(&format!("  # from {o}")),
                (None, Some(o)) => out.push_str(&format!("  # from {o} (group_defaults)")),
                (None, None) => out.push_str("  # default"),
            }
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_written_replaces_the_default_one_whole() {
        for w in [
            r#"{ kind = "session", gap_ms = 5000 }"#,
            r#"{ kind = "hopping", size_ms = 10000, slide_ms = 5000 }"#,
            r#"{ kind = "tumbling", size_ms = 10000 }"#,
        ] {
            let text = format!("[gateway]\nid = \"gw\"\n[group_defaults]\nwindow = {w}\n");
            assert!(load_str(&text, &BTreeMap::new()).is_ok(), "{w}");
        }
    }

    #[test]
    fn a_remote_document_changes_no_fleet_key_however_spelled() {
        let dir = tempfile::tempdir().unwrap();
        let key = crate::fleet::PrivateKey::generate().unwrap();
        let public = key.write(&dir.path().join("k")).unwrap();
        let local = dir.path().join("local.toml");
        std::fs::write(
            &local,
            format!(
                "[gateway]\nid = \"gw\"\nstate_dir = {:?}\n[fleet]\nenabled = true\ntrusted_keys = [{:?}]\n",
                dir.path().join("state"),
                public
            ),
        )
        .unwrap();
        let env = BTreeMap::new();
        let paths = [local];
        for (doc, key) in [
            ("\"fleet.accept_v1\" = true\n", "fleet.accept_v1"),
            ("\"fleet.enabled\" = false\n", "fleet.enabled"),
            ("fleet.confirm_s = 5\n", "fleet.confirm_s"),
            ("fleet = { accept_v1 = true }\n", "fleet.accept_v1"),
            (
                "[fleet]\ntrusted_keys = []\nenabled = true\n",
                "fleet.trusted_keys",
            ),
            ("[fleet]\nenabled = true\n", "fleet"),
            (
                "[log]\nlevel = \"debug\"\n\"fleet.accept_v1\" = true\n",
                "log.fleet",
            ),
        ] {
            let e = load_with_remote(&paths, &env, doc).expect_err(doc);
            assert!(
                e.problems.iter().any(|p| p.starts_with(key)),
                "{doc:?}: {:?}",
                e.problems
            );
        }
        let ok = load_with_remote(&paths, &env, "[log]\nlevel = \"debug\"\n").unwrap();
        assert!(ok.fleet.enabled && !ok.fleet.accept_v1);
    }

    #[test]
    fn secret_files_others_can_read_and_clear_credentials_are_warned_about() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let pw = dir.path().join("pw");
        std::fs::write(&pw, "secret\n").unwrap();
        std::fs::set_permissions(&pw, std::fs::Permissions::from_mode(0o644)).unwrap();
        let text = |url: &str| {
            format!(
                "[gateway]\nid = \"gw\"\n[source]\nurl = \"{url}\"\nusername = \"u\"\npassword_file = {:?}\n",
                pw.display().to_string()
            )
        };
        let env = BTreeMap::new();
        let cfg = load_str(&text("mqtt://10.0.0.5:1883"), &env).unwrap();
        let w = cfg.warnings();
        assert!(
            w.iter()
                .any(|w| w.starts_with("source.password_file:") && w.contains("644")),
            "{w:?}"
        );
        assert!(
            w.iter().any(|w| w.starts_with("source.url: credentials")),
            "{w:?}"
        );
        std::fs::set_permissions(&pw, std::fs::Permissions::from_mode(0o600)).unwrap();
        for url in [
            "mqtts://10.0.0.5:8883",
            "mqtt://127.0.0.1:1883",
            "mqtt://localhost:1883",
        ] {
            let cfg = load_str(&text(url), &env).unwrap();
            assert!(cfg.warnings().is_empty(), "{url}: {:?}", cfg.warnings());
        }
    }

    #[test]
    fn the_embedded_broker_listens_beyond_loopback_only_when_told() {
        let env = BTreeMap::new();
        let doc = |listen: &str, allow: bool| {
            format!(
                "[gateway]\nid = \"gw\"\n[broker]\nembedded = true\nlisten = \"{listen}\"\nallow_remote = {allow}\n"
            )
        };
        let e = load_str(&doc("0.0.0.0:1883", false), &env).unwrap_err();
        assert!(
            e.problems[0].starts_with("broker.listen:"),
            "{:?}",
            e.problems
        );
        assert!(e.problems[0].contains("allow_remote"), "{:?}", e.problems);
        assert!(load_str(&doc("0.0.0.0:1883", true), &env).is_ok());
        assert!(load_str(&doc("127.0.0.1:1883", false), &env).is_ok());
        assert!(load_str(&doc("[::1]:1883", false), &env).is_ok());
    }
}
