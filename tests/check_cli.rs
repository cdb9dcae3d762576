//! `tidemark check`: the binary a user runs, on good and broken configs.

mod support;

use std::path::Path;
use std::process::Output;

fn tidemark(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = support::tidemark();
    cmd.args(args);
    for (k, _) in std::env::vars() {
        if k.starts_with("TIDEMARK__") {
            cmd.env_remove(k);
        }
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run tidemark")
}

fn example() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/example.toml"))
        .unwrap()
}

fn check_text(body: &str) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    std::fs::write(&path, body).unwrap();
    tidemark(&["check", "--config", path.to_str().unwrap()], &[])
}

#[test]
fn example_config_is_valid_and_printed_with_defaults_filled_in() {
    let out = tidemark(&["check", "--config", "configs/example.toml"], &[]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("id = \"site-a-gw1\""));
    assert!(text.contains("client_id = \"tidemark-site-a-gw1-in\""));
    assert!(text.contains("[groups.hvac]"));
    assert!(text.contains("out_of_orderness_ms = 5000"));
}

#[test]
fn env_overrides_the_file() {
    let out = tidemark(
        &["check", "--config", "configs/example.toml"],
        &[
            ("TIDEMARK__GATEWAY__ID", "x"),
            ("TIDEMARK__GROUPS__HVAC__IDLE_TIMEOUT_MS", "4321"),
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("id = \"x\""), "{text}");
    assert!(text.contains("tidemark-x-out"), "{text}");
    assert!(text.contains("idle_timeout_ms = 4321"), "{text}");
}

#[test]
fn env_can_break_a_valid_file_and_is_named() {
    let out = tidemark(
        &["check", "--config", "configs/example.toml"],
        &[("TIDEMARK__TIME__SKEW_WINDOW", "500")],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("time.skew_window"));
}

#[test]
fn minimal_config_needs_only_the_gateway_id() {
    let out = check_text("[gateway]\nid = \"gw\"\n");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("size_ms = 60000"));
}

#[test]
fn password_is_read_from_its_file_and_never_printed() {
    let dir = tempfile::tempdir().unwrap();
    let pw = dir.path().join("pw");
    std::fs::write(&pw, "s3cr3t-value\n").unwrap();
    let body = example().replacen(
        "password_file = \"\"",
        &format!("password_file = {:?}", pw.to_str().unwrap()),
        1,
    );
    let out = check_text(&body);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(!text.contains("s3cr3t-value"));
    assert!(text.contains("source: password loaded from password_file: ********"));
}

/// Each broken config exits 2 and names the offending key.
#[test]
fn broken_configs_exit_2_naming_the_key() {
    let ex = example();
    let cases: Vec<(String, &str)> = vec![
        (ex.replace("id = \"site-a-gw1\"", ""), "gateway.id: missing"),
        (ex.replace("id = \"site-a-gw1\"", "id = \"site a/gw\""), "gateway.id:"),
        (ex.replace("[source]", "[sourc]"), "sourc: unknown key"),
        (ex.replace("qos = 1                           # 1:", "qoss = 1 #"), "source.qoss: unknown key"),
        (ex.replace("url = \"mqtt://127.0.0.1:1883\"     # mqtt://", "url = \"http://x\" #"), "source.url: unsupported scheme \"http\""),
        (ex.replace("url = \"mqtt://127.0.0.1:1883\"\nclient_id = \"\"                    # default \"tidemark-{gateway.id}-out\"", "url = \"mqtt://:99999\"\nclient_id = \"\""), "sink.url:"),
        (format!("{ex}\n[groups.hvac2]\nwindow = {{ kind = \"tumbling\", size_ms = 0 }}\n"), "groups.hvac2.window.size_ms: must be > 0"),
        (format!("{ex}\n[groups.h3]\nwindow = {{ kind = \"hopping\", size_ms = 1000, slide_ms = 5000 }}\n"), "groups.h3.window.slide_ms: 5000 must be <= size_ms"),
        (format!("{ex}\n[groups.s]\nwindow = {{ kind = \"session\" }}\n"), "groups.s.window.gap_ms: missing"),
        (format!("{ex}\n[groups.w]\nwindow = {{ kind = \"sliding\", size_ms = 1 }}\n"), "groups.w.window.kind: unknown variant"),
        (ex.replace("password_file = \"\"                # password", "password_file = \"/nonexistent/pw\" #"), "source.password_file: cannot read"),
        (ex.replacen("protocol = \"v5\"", "protocol = \"v4\"", 1), "source.protocol: unknown variant `v4`"),
        (ex.replace("skew_window = 32", "skew_window = 65"), "time.skew_window: must be between 1 and 64"),
        (ex.replace("gateway_clock = \"auto\"", "gateway_clock = \"sometimes\""), "time.gateway_clock: unknown variant `sometimes`"),
        (ex.replace("group_ids = []", "group_ids = [\"a/b\"]"), "sparkplug.group_ids[0]:"),
        (ex.replace("host_id = \"\"                      #", "host_id = \"h#1\" #"), "sparkplug.host_id:"),
        (format!("{ex}\n[sparkplug.extra]\n"), "sparkplug.extra: unknown key"),
        (ex.replace("commit_interval_ms = 1000", "commit_interval_ms = 0"), "gateway.commit_interval_ms: must be > 0"),
        (ex.replace("memory_max_mb = 0 ", "memory_max_mb = 8 "), "gateway.memory_max_mb: 8 must be 0 (the cgroup's memory.max) or 16..=1048576"),
        (ex.replace("commit_interval_ms = 1000", "commit_interval_ms = -5"), "gateway.commit_interval_ms: invalid value"),
        (ex.replace("topic_pattern = \"sensors/{group}/{device}/{kind}\"", "topic_pattern = \"sensors/{group}/{kind}\""), "source.topic_pattern:"),
        (ex.replace("topics = [\"sensors/+/+/+\"]", "topics = [\"sensors/#/x\"]"), "source.topics[0]:"),
        (ex.replace("format = \"json\"                   # json | cbor", "format = \"xml\""), "sink.format: unknown variant"),
        (ex.replace("listen = \"127.0.0.1:1883\"", "listen = \"localhost\""), "broker.listen:"),
        (ex.replace("embedded = false", "embedded = true").replace("listen = \"127.0.0.1:1883\"", "listen = \"0.0.0.0:1883\""),
            "broker.listen: \"0.0.0.0:1883\" is reachable from other machines"),
        (ex.replace("idle_timeout_ms = 30000", "idle_timeout_ms = \"30s\""), "group_defaults.idle_timeout_ms:"),
        (ex.replace("level = \"info\"", "level = \"[[[\""), "log.level:"),
        (format!("{ex}\n[groups.\"bad/name\"]\nidle_timeout_ms = 5\n"), "groups.bad/name: group name"),
        (ex.replace("[metrics]", "[metrics]\nextra = 1"), "metrics.extra: unknown key"),
        (ex.replace("listen = \"\"  ", "listen = \"0.0.0.0:9464\""), "metrics.listen: \"0.0.0.0:9464\" is not a loopback address"),
        (ex.replace("listen = \"\"  ", "listen = \"9464\""), "metrics.listen: \"9464\" is not a host:port"),
        (ex.replace("health_timeout_s = 60", "health_timeout_s = 0"), "metrics.health_timeout_s: must be > 0"),
        (ex.replace("probe_timeout_ms = 3000", "probe_timeout_ms = 0"), "source.probe_timeout_ms: must be positive"),
        (ex.replace("probe_topic = \"tidemark/{gateway}/probe\"", "probe_topic = \"t/+/probe\""), "source.probe_topic: \"t/+/probe\" must be a topic name"),
        (ex.replace("ack_timeout_ms = 5000", "ack_timeout_ms = 0"), "sink.ack_timeout_ms: must be positive"),
        (ex.replace("out_of_orderness_ms = 2000         # or", "out_of_orderness_ms = \"soon\" # or"), "group_defaults.out_of_orderness_ms: invalid value: string \"soon\", expected a number of milliseconds or \"auto\""),
        (ex.replace("quantile = 0.999", "quantile = 1.5"), "group_defaults.adaptive.quantile: 1.5 must be between 0 and 1"),
        (format!("{ex}\n[groups.a]\nallowed_lateness_ms = \"auto\"\nadaptive = {{ min_ms = 9000, max_ms = 10 }}\n"), "groups.a.adaptive.min_ms: 9000 must be <= max_ms (10)"),
        (ex.replace("horizon_s = 900", "horizon_s = 0"), "group_defaults.adaptive.horizon_s: must be 1..=604800"),
        (ex.replace("plain = true ", "plain = false "), "sink.plain: false while [sink.sparkplug], [sink.postgres] and [sink.influx] are off would publish no results at all"),
        (ex.replace("group_id = \"tidemark\"", "group_id = \"a/b\""), "sink.sparkplug.group_id: \"a/b\" must be 1..64 chars"),
        (ex.replace("primary_host_id = \"\" ", "primary_host_id = \"h+\" "), "sink.sparkplug.primary_host_id: \"h+\" must be"),
        (ex.replace("Sparkplug host)\nenabled = false", "Sparkplug host)\nenabled = true")
            .replace("enabled = false                   # subscribe spBv1.0", "enabled = true # subscribe spBv1.0"),
            "sink.sparkplug.group_id: \"tidemark\" is also taken by [sparkplug] ingest on the same broker"),
        (ex.replace("enabled = false                   # both boards", "enabled = true # both boards"), "standby.node: \"\" must be 1..32 chars"),
        (ex.replace("node = \"\"  ", "node = \"a/b\""), "standby.node: \"a/b\" must be"),
        (ex.replace("enabled = false                   # both boards", "enabled = true # both boards")
            .replace("node = \"\"  ", "node = \"a\""),
            "standby.key_file: is required with standby.enabled"),
        (ex.replace("enabled = false                   # both boards", "enabled = true # both boards")
            .replace("node = \"\"  ", "node = \"a\"")
            .replace("key_file = \"\"  ", "key_file = \"/etc/hostname\""),
            "standby.key_file: \"/etc/hostname\""),
        (ex.replace("takeover_s = 10 ", "takeover_s = 0 "), "standby.takeover_s: must be 1..=3600"),
        (ex.replace("enabled = false                   # both boards", "enabled = true # both boards")
            .replace("node = \"\"  ", "node = \"a\"")
            .replace("embedded = false", "embedded = true"),
            "standby.enabled: a pair cannot use the embedded broker"),
        (ex.replace("enabled = false\nurl = \"\"                          # postgresql://", "enabled = true\nurl = \"postgresql://u:pw@db/site\" # postgresql://"),
            "sink.postgres.url: a password in the URL is not allowed; use sink.postgres.password_file"),
        (ex.replace("enabled = false\nurl = \"\"                          # http(s)://host:8086\napi = \"v1\"", "enabled = true\nurl = \"http://db:8086\"\napi = \"v3\""),
            "sink.influx.api: \"v3\" must be \"v1\" or \"v2\""),
        (ex.replace("aggregates = []", "aggregates = [\"p42\"]"),
            "group_defaults.aggregates: \"p42\" is not one of stddev, variance, p50"),
        (ex.replace("quantile_accuracy = 0.01", "quantile_accuracy = 0.9"),
            "group_defaults.quantile_accuracy: 0.9 must be 0.0001..=0.5"),
        ("this is = = not toml".to_string(), "c.toml: line 1, column 6: key with no value"),
    ];
    assert!(cases.len() >= 12);
    for (body, want) in cases {
        let out = check_text(&body);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(2),
            "want {want:?}, got stderr {err}"
        );
        assert!(err.contains(want), "want {want:?} in:\n{err}");
    }
}

#[test]
fn several_problems_are_reported_one_line_each() {
    let body = "[gateway]\nid = \"gw\"\ncommit_interval_ms = 0\ntick_interval_ms = 0\n[time]\nmax_age_ms = 0\n";
    let out = check_text(body);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 3, "{err}");
    assert!(err.contains("gateway.commit_interval_ms"));
    assert!(err.contains("gateway.tick_interval_ms"));
    assert!(err.contains("time.max_age_ms"));
}

#[test]
fn missing_config_file_exits_2() {
    let out = tidemark(&["check", "--config", "/nonexistent/tidemark.toml"], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/tidemark.toml"));
}

/// The line of `check`'s output that sets `key` inside `[table]`.
fn line_of<'a>(text: &'a str, table: &str, key: &str) -> &'a str {
    let mut current = "";
    for line in text.lines() {
        if let Some(h) = line.strip_prefix('[') {
            current = h.trim_end_matches(']');
        } else if current == table && line.starts_with(&format!("{key} = ")) {
            return line;
        }
    }
    panic!("no {key} in [{table}] of:\n{text}")
}

#[test]
fn layered_files_and_env_report_effective_values_and_their_sources() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base.toml");
    let site = dir.path().join("site.toml");
    std::fs::write(
        &base,
        "[gateway]\nid = \"base-gw\"\nstate_dir = \"/var/lib/tidemark\"\n\
         [source]\ntopics = [\"sensors/+/+/+\"]\nkeep_alive_s = 20\n\
         [group_defaults]\nidle_timeout_ms = 45000\n\
         [sink]\nformat = \"cbor\"\nqos = 1\n",
    )
    .unwrap();
    std::fs::write(
        &site,
        "[gateway]\nid = \"greenhouse-3\"\n\
         [source]\nkeep_alive_s = 60\n\
         [groups.beds]\nwindow = { kind = \"tumbling\", size_ms = 300000 }\n",
    )
    .unwrap();
    let (b, s) = (base.to_str().unwrap(), site.to_str().unwrap());
    let out = tidemark(
        &["check", "--config", b, "--config", s],
        &[("TIDEMARK__SINK__QOS", "0")],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    // The site file wins over the base, the environment over both.
    let want = [
        (
            "gateway",
            "id",
            format!("id = \"greenhouse-3\"  # from {s}"),
        ),
        (
            "gateway",
            "state_dir",
            format!("state_dir = \"/var/lib/tidemark\"  # from {b}"),
        ),
        (
            "source",
            "keep_alive_s",
            format!("keep_alive_s = 60  # from {s}"),
        ),
        (
            "sink",
            "qos",
            "qos = 0  # from env TIDEMARK__SINK__QOS".to_owned(),
        ),
        ("sink", "format", format!("format = \"cbor\"  # from {b}")),
        (
            "groups.beds.window",
            "size_ms",
            format!("size_ms = 300000  # from {s}"),
        ),
        (
            "groups.beds",
            "idle_timeout_ms",
            format!("idle_timeout_ms = 45000  # from {b} (group_defaults)"),
        ),
        (
            "gateway",
            "commit_interval_ms",
            "commit_interval_ms = 1000  # default".to_owned(),
        ),
        (
            "source",
            "client_id",
            "client_id = \"tidemark-greenhouse-3-in\"  # default".to_owned(),
        ),
    ];
    for (table, key, line) in want {
        assert_eq!(line_of(&text, table, key), line);
    }
    // The annotated output is still a config `check` accepts.
    let again = dir.path().join("effective.toml");
    std::fs::write(&again, &text).unwrap();
    let out = tidemark(&["check", "--config", again.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(0));

    // Order matters: the base given last wins.
    let out = tidemark(&["check", "--config", s, "--config", b], &[]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        line_of(&text, "gateway", "id"),
        format!("id = \"base-gw\"  # from {b}")
    );
    // A broken layer is named.
    std::fs::write(&site, "[source]\nkeep_alive_s = \n").unwrap();
    let out = tidemark(&["check", "--config", b, "--config", s], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains(s));
}

#[test]
fn every_shipped_config_passes_check() {
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, "secret\n").unwrap();
        p.to_str().unwrap().to_owned()
    };
    // The secrets and certificates a site keeps under /etc/tidemark, here in a temp dir.
    let (pw, ca, crt, key) = (file("pw"), file("ca.pem"), file("gw.crt"), file("gw.key"));
    let base = "configs/tidemark.toml";
    // (files in order, environment, a line the effective config must hold)
    type Case<'a> = (Vec<&'a str>, Vec<(&'a str, &'a str)>, &'a str);
    let cases: Vec<Case> = vec![
        (vec!["configs/example.toml"], vec![], "id = \"site-a-gw1\""),
        (vec!["configs/local.toml"], vec![], "embedded = true"),
        (
            vec![base, "configs/site.toml"],
            vec![],
            "listen = \"127.0.0.1:9464\"",
        ),
        (
            vec![base, "configs/greenhouse.toml"],
            vec![("TIDEMARK__SINK__PASSWORD_FILE", pw.as_str())],
            "format = \"cbor\"",
        ),
        (
            vec![base, "configs/factory.toml"],
            vec![
                ("TIDEMARK__SOURCE__PASSWORD_FILE", pw.as_str()),
                ("TIDEMARK__SINK__CA_FILE", ca.as_str()),
                ("TIDEMARK__SINK__CERT_FILE", crt.as_str()),
                ("TIDEMARK__SINK__KEY_FILE", key.as_str()),
            ],
            "url = \"mqtts://mes-broker.plant.example:8883\"",
        ),
    ];
    for (files, env, want) in cases {
        let mut args = vec!["check"];
        for f in &files {
            args.extend(["--config", f]);
        }
        let out = tidemark(&args, &env);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{files:?}: {err}");
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(text.contains(want), "{files:?}: no {want:?} in\n{text}");
        assert!(!text.contains("secret"), "a secret was printed");
    }
}

#[test]
fn every_typo_and_wrong_type_is_listed_in_one_run_in_plain_words() {
    let body = "[gateway]\nid = \"gw\"\ncomit_interval_ms = 5\n[sink]\nqos = \"x\"\n\
                [time]\nmax_age_ms = \"long\"\nmax_skew_ms = 0\n[groups.a]\nidle_timeout_ms = true\nwindw = 1\n";
    let out = check_text(body);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    for want in [
        "gateway.comit_interval_ms: unknown key",
        "groups.a.windw: unknown key",
        "sink.qos: invalid type: string \"x\", expected 0 or 1",
        "time.max_age_ms: invalid type: string \"long\", expected a whole number of milliseconds",
        "groups.a.idle_timeout_ms: invalid type: boolean `true`, expected a whole number of milliseconds",
        "time.max_skew_ms: must be > 0",
    ] {
        assert!(err.contains(want), "want {want:?} in:\n{err}");
    }
    assert_eq!(err.lines().count(), 6, "{err}");
    assert!(!err.contains("u64") && !err.contains("u8"), "{err}");
}

#[test]
fn a_bad_value_from_the_environment_names_the_variable() {
    let out = tidemark(
        &["check", "--config", "configs/example.toml"],
        &[("TIDEMARK__SINK__QOS", "abc")],
    );
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("sink.qos (set by environment variable TIDEMARK__SINK__QOS): invalid type: string \"abc\", expected 0 or 1"),
        "{err}"
    );
}

#[test]
fn the_reference_lists_every_key_check_knows() {
    let out = tidemark(&["check", "--config", "configs/example.toml"], &[]);
    assert_eq!(out.status.code(), Some(0));
    let reference =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/reference.md"))
            .unwrap();
    let mut table = String::new();
    let mut keys = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        if let Some(h) = line.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
            table = h.to_string();
            // A group's window is one key, written as a table.
            if let Some(parent) = table.strip_suffix(".window") {
                keys.push(format!("{parent}.window"));
            }
        } else if let Some((k, _)) = line.split_once(" = ")
            && !table.ends_with(".window")
        {
            keys.push(format!("{table}.{}", k.trim()));
        }
    }
    assert!(keys.len() > 50, "{keys:?}");
    for key in keys {
        let key = key.replace("groups.hvac.", "groups.NAME.");
        assert!(
            reference.contains(&format!("`{key}`")),
            "docs/reference.md does not list `{key}`"
        );
    }
}

/// `configs/example.toml` says it holds every key with its default: checked against
/// the sections' own defaults (each section's `Default`, the bottom layer).
#[test]
fn the_example_holds_every_key_with_the_sections_default() {
    fn walk(defaults: &toml::Table, example: &toml::Table, at: &str, bad: &mut Vec<String>) {
        for (k, d) in defaults {
            let key = if at.is_empty() {
                k.clone()
            } else {
                format!("{at}.{k}")
            };
            match (d, example.get(k)) {
                (toml::Value::Table(d), Some(toml::Value::Table(e))) => walk(d, e, &key, bad),
                (_, None) => bad.push(format!("{key}: missing")),
                (d, Some(e)) if d != e => {
                    bad.push(format!("{key}: {e} in the example, {d} by default"))
                }
                _ => {}
            }
        }
    }
    let example: toml::Table = toml::from_str(&example()).unwrap();
    let defaults = toml::Table::try_from(tidemark::config::RawConfig::default()).unwrap();
    let mut bad = Vec::new();
    walk(&defaults, &example, "", &mut bad);
    assert!(bad.is_empty(), "configs/example.toml:\n{}", bad.join("\n"));
}

/// A bad condition is named by its key and the column of the error; an aggregate
/// the group does not compute is named too, with the key that would add it.
#[test]
fn a_bad_condition_names_its_key_and_the_column() {
    let out = check_text(
        "[gateway]\nid = \"gw\"\n[groups.hvac]\naggregates = [\"p95\"]\n\
         [[groups.hvac.conditions]]\nname = \"overheat\"\nwhen = \"temp.mean > 80 and temp.p99 > 85\"\n\
         for_windows = 3\nclear = \"temp.mean < < 75\"\n\
         [[groups.hvac.conditions]]\nname = \"bad name!\"\nwhen = \"temp.mean > 80 an\"\nfor_windows = 0\n",
    );
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    for want in [
        "groups.hvac.conditions[0].when: at column 20: temp.p99 reads p99, which the group does not compute (add it to groups.hvac.aggregates)",
        "groups.hvac.conditions[0].clear: at column 13: expected a value",
        "groups.hvac.conditions[1].name: \"bad name!\"",
        "groups.hvac.conditions[1].for_windows: 0 must be 1..=1000",
        "groups.hvac.conditions[1].when: at column 16: expected and, or, or the end in \"temp.mean > 80 an\"",
    ] {
        assert!(err.contains(want), "{want:?} not in:\n{err}");
    }
    // More conditions than a group may have.
    let many: String = (0..65)
        .map(|i| format!("[[groups.hvac.conditions]]\nname = \"c{i}\"\nwhen = \"count > {i}\"\n"))
        .collect();
    let out = check_text(&format!("[gateway]\nid = \"gw\"\n{many}"));
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("groups.hvac.conditions: 65 conditions: at most 64 a group"),
        "{err}"
    );
    // The same with p99 computed and the expressions fixed: valid, and printed back.
    let out = check_text(
        "[gateway]\nid = \"gw\"\n[groups.hvac]\naggregates = [\"p99\"]\n\
         [[groups.hvac.conditions]]\nname = \"overheat\"\nwhen = \"temp.mean > 80 and temp.p99 > 85\"\n\
         for_windows = 3\nclear = \"temp.mean < 75\"\n",
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("[[groups.hvac.conditions]]"), "{text}");
    assert!(
        text.contains("when = \"temp.mean > 80 and temp.p99 > 85\""),
        "{text}"
    );
}
