//! The database outputs against real PostgreSQL 15 and InfluxDB 1.6 from Debian
//! (docs/reference.md#sinkpostgres-and-sinkinflux): exactly one row per window at
//! its highest revision through kill -9 and database outages; refusals set aside.
mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use support::db::{Influx, Postgres};
use support::fleet::{Fleet, MIN, reading};
use support::{
    Collector, Gateway, GatewayConfig, Mosquitto, Publisher, final_windows, wait_or_explain,
    wait_until,
};

/// 2 s windows, late readings taken for 10 min (revisions), devices offline after 5 s of
/// silence; a condition the late readings (temp 2, the others 1) raise and clear.
const RULES: &str = "[time]\npolicy = \"device\"\n\
    [group_defaults]\nwindow = { kind = \"tumbling\", size_ms = 2000 }\n\
    out_of_orderness_ms = 0\nidle_timeout_ms = 1000\nheartbeat_timeout_ms = 5000\n\
    allowed_lateness_ms = 600000\n\
    [[group_defaults.conditions]]\nname = \"warm\"\nwhen = \"temp.max > 1.5\"\n";

/// The tables as docs/reference.md gives them, made before the gateway starts so
/// the audit trigger sees every write.
const AUDIT: &str = "
CREATE TABLE tidemark_windows (
  result_id text NOT NULL, gateway text NOT NULL, group_id text NOT NULL, device text NOT NULL,
  window_start timestamptz NOT NULL, window_end timestamptz NOT NULL, revision integer NOT NULL,
  readings bigint NOT NULL, heartbeats bigint NOT NULL, metrics jsonb NOT NULL,
  written_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (gateway, group_id, device, window_start));
CREATE TABLE tidemark_alerts (
  gateway text NOT NULL, group_id text NOT NULL, device text NOT NULL, type text NOT NULL,
  at timestamptz NOT NULL, body jsonb NOT NULL,
  PRIMARY KEY (gateway, group_id, device, type, at));
CREATE TABLE audit (tbl text, op text, k text, old_rev integer, new_rev integer);
CREATE FUNCTION audit_windows() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
  INSERT INTO audit VALUES ('windows', TG_OP, NEW.group_id || '/' || NEW.device || '/' || NEW.window_start,
    CASE WHEN TG_OP = 'UPDATE' THEN OLD.revision END, NEW.revision);
  RETURN NEW; END $$;
CREATE FUNCTION audit_alerts() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
  INSERT INTO audit VALUES ('alerts', TG_OP, NEW.group_id || '/' || NEW.device || '/' || NEW.type || '/' || NEW.at, NULL, NULL);
  RETURN NEW; END $$;
CREATE TRIGGER audit_w AFTER INSERT OR UPDATE ON tidemark_windows FOR EACH ROW EXECUTE FUNCTION audit_windows();
CREATE TRIGGER audit_a AFTER INSERT OR UPDATE ON tidemark_alerts FOR EACH ROW EXECUTE FUNCTION audit_alerts();
";

fn config(
    dir: &Path,
    broker: &Mosquitto,
    pg: &Postgres,
    ix: &Influx,
    batch: u64,
) -> std::path::PathBuf {
    GatewayConfig::new("gw", &dir.join("state"), broker, broker)
        .merge("metrics", RULES)
        .set(
            "sink.postgres",
            &format!(
                "enabled = true\nurl = \"{}\"\nbatch_max = {batch}",
                pg.url()
            ),
        )
        .set(
            "sink.influx",
            &format!(
                "enabled = true\nurl = \"{}\"\nbatch_max = {batch}",
                ix.url()
            ),
        )
        .write(&dir.join("gateway.toml"))
}

/// `(group/device/start) -> (revision, readings)` as PostgreSQL holds it.
fn pg_windows(pg: &Postgres) -> BTreeMap<String, (i64, i64)> {
    pg.psql(
        "site",
        "SELECT group_id || '/' || device || '/' || (extract(epoch from window_start) * 1000)::bigint, revision, readings FROM tidemark_windows",
    )
    .lines()
    .filter_map(|l| {
        let mut f = l.split('|');
        let k = f.next()?.to_string();
        Some((k, (f.next()?.parse().ok()?, f.next()?.parse().ok()?)))
    })
    .collect()
}

/// The same as InfluxDB holds it; every point carries every field of its window.
fn influx_windows(ix: &Influx) -> BTreeMap<String, (i64, i64)> {
    let v = ix.query("SELECT revision, readings, temp_count, temp_mean, hum_max FROM tidemark_windows GROUP BY \"group\", device");
    let mut out = BTreeMap::new();
    for s in v["results"][0]["series"]
        .as_array()
        .cloned()
        .unwrap_or_default()
    {
        let g = s["tags"]["group"].as_str().unwrap_or("").to_string();
        let d = s["tags"]["device"].as_str().unwrap_or("").to_string();
        if d == "x" {
            continue;
        }
        for r in s["values"].as_array().cloned().unwrap_or_default() {
            let t = r[0].as_i64().unwrap_or(0);
            let row = r.as_array().cloned().unwrap_or_default();
            assert!(
                row.iter().all(|v| !v.is_null()),
                "{g}/{d}/{t}: every field in every point: {row:?}"
            );
            out.insert(
                format!("{g}/{d}/{t}"),
                (r[1].as_i64().unwrap_or(-1), r[2].as_i64().unwrap_or(-1)),
            );
        }
    }
    out
}

/// The MQTT results, deduplicated by id, highest revision per window.
fn mqtt_windows(up: &Collector) -> BTreeMap<String, (i64, i64)> {
    final_windows(&up.on("/windows/"))
        .values()
        .map(|w| {
            (
                format!(
                    "{}/{}/{}",
                    w["group"].as_str().unwrap_or(""),
                    w["device"].as_str().unwrap_or(""),
                    w["start"]
                ),
                (
                    w["revision"].as_i64().unwrap_or(-1),
                    w["count"].as_i64().unwrap_or(-1),
                ),
            )
        })
        .collect()
}

fn sum(m: &BTreeMap<String, (i64, i64)>) -> i64 {
    m.values().map(|(_, n)| n).sum()
}

/// Sends readings until `until` holds (at least `min` batches), 10 ms apart.
fn send_while(fleet: &mut Fleet, p: &mut Publisher, min: u32, mut until: impl FnMut() -> bool) {
    let mut n = 0;
    while (n < min || !until()) && fleet.send(p, 10) {
        std::thread::sleep(Duration::from_millis(10));
        n += 1;
    }
}

#[test]
fn windows_and_alerts_land_once_at_their_highest_revision_through_kills_and_database_outages() {
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = Mosquitto::start(false);
    let mut pg = Postgres::start(dir.path());
    let mut ix = Influx::start(dir.path());
    pg.psql("site", AUDIT);
    let config = config(dir.path(), &broker, &pg, &ix, 50);
    let log = dir.path().join("gw.log");
    let up = Collector::start(broker.port, "tidemark/gw/#", "db-collector");
    let mut publisher = Publisher::connect(broker.port, "db-fleet");
    let mut fleet = Fleet::new(12, 300);
    let mut gw = Gateway::start(&config, &log);
    for round in 0..3 {
        let have = pg_windows(&pg).len();
        send_while(&mut fleet, &mut publisher, 20, || {
            pg_windows(&pg).len() > have
        });
        gw.kill9();
        gw = Gateway::start(&config, &log);
        if round == 0 {
            pg.stop();
            let before = up.on("/windows/").len();
            // 20 s of readings while PostgreSQL is down: MQTT results keep flowing.
            for _ in 0..100 {
                fleet.send(&mut publisher, 10);
                std::thread::sleep(Duration::from_millis(200));
            }
            assert!(
                up.on("/windows/").len() > before,
                "results kept flowing upstream while PostgreSQL was down"
            );
            pg.start_again();
        }
        if round == 1 {
            ix.stop();
            for _ in 0..100 {
                fleet.send(&mut publisher, 10);
                std::thread::sleep(Duration::from_millis(200));
            }
            ix.start_again();
        }
    }
    while fleet.send(&mut publisher, 10) {}
    // Late readings for closed windows: revision 1, then 2, for three devices.
    let mut late = 0;
    for d in 0..3 {
        for k in 0..2 {
            let ts = fleet.base + 20 + k;
            publisher.send(
                &format!("sensors/fleet/d{d}/reading"),
                &reading(ts, 100_000 + u64::try_from(k).unwrap_or(0), 2.0),
            );
            late += 1;
            std::thread::sleep(Duration::from_millis(300));
        }
    }
    publisher.flush();
    let total = i64::try_from(fleet.total()).unwrap_or(0) + late;
    wait_or_explain(
        2 * MIN,
        || {
            sum(&mqtt_windows(&up)) == total
                && sum(&pg_windows(&pg)) == total
                && sum(&influx_windows(&ix)) == total
        },
        || {
            format!(
                "sent {total}: mqtt {} postgres {} influx {}\n{}",
                sum(&mqtt_windows(&up)),
                sum(&pg_windows(&pg)),
                sum(&influx_windows(&ix)),
                std::fs::read_to_string(&log).unwrap_or_default()
            )
        },
    );
    let mqtt = mqtt_windows(&up);
    assert_eq!(
        pg_windows(&pg),
        mqtt,
        "PostgreSQL: one row per window at its highest revision"
    );
    assert_eq!(
        influx_windows(&ix),
        mqtt,
        "InfluxDB: one point per window at its highest revision"
    );
    assert!(
        mqtt.values().any(|(r, _)| *r == 2),
        "late readings made revision 2"
    );
    audit_clean(&pg);
    alerts_once(&up, &pg);
    // The late readings raise `warm` on three devices and the next window clears it.
    support::db::conditions_once(&up, &pg, &ix, 6);
    dashboard_queries_run(&pg);
    let _ = gw.terminate();
}

/// The audit trigger saw every key inserted once and no update that lowered or repeated a revision.
fn audit_clean(pg: &Postgres) {
    let inserted_twice = pg.psql("site", "SELECT count(*) FROM (SELECT k FROM audit WHERE op = 'INSERT' GROUP BY tbl, k HAVING count(*) > 1) x");
    assert_eq!(inserted_twice, "0", "every key inserted once");
    let lowered = pg.psql(
        "site",
        "SELECT count(*) FROM audit WHERE op = 'UPDATE' AND new_rev <= old_rev",
    );
    assert_eq!(lowered, "0", "no update lowered or repeated a revision");
}

/// Every alert published upstream is one row (the devices went offline at the end).
fn alerts_once(up: &Collector, pg: &Postgres) {
    // Device alerts (`P/alerts/G/D`) and gateway-level ones (`P/alerts`), each once by its key;
    // read again at every look: devices keep going offline while the check runs.
    let published = || {
        let mut keys: Vec<String> = up
            .on("/alerts")
            .iter()
            .map(|a| {
                let v = a.json();
                format!(
                    "{}/{}/{}/{}",
                    v["group"].as_str().unwrap_or(""),
                    v["device"].as_str().unwrap_or(""),
                    v["type"].as_str().unwrap_or(""),
                    v["at"]
                )
            })
            .collect();
        keys.sort();
        keys.dedup();
        keys
    };
    let stored = || {
        let q = "SELECT group_id || '/' || device || '/' || type || '/' || (extract(epoch from at) * 1000)::bigint \
                 FROM tidemark_alerts ORDER BY 1";
        let mut rows: Vec<String> = pg.psql("site", q).lines().map(str::to_string).collect();
        rows.sort();
        rows
    };
    wait_or_explain(
        2 * MIN,
        || {
            let p = published();
            !p.is_empty() && stored() == p
        },
        || format!("published {:?}\nstored {:?}", published(), stored()),
    );
}

/// The refusals counted in /api/v1/status, `tidemark status` and /metrics.
fn outputs_shown(http: u16) {
    let (_, body) = support::http_get(http, "/api/v1/status");
    let status: serde_json::Value = serde_json::from_str(&body).expect("status json");
    let outputs = status["outputs"].as_array().expect("outputs");
    let by = |n: &str| {
        outputs
            .iter()
            .find(|o| o["name"] == n)
            .cloned()
            .unwrap_or_default()
    };
    assert!(by("postgres")["refused"].as_u64() >= Some(1), "{outputs:?}");
    assert!(by("influx")["refused"].as_u64() >= Some(1), "{outputs:?}");
    assert!(by("postgres")["written"].as_u64() > Some(0), "{outputs:?}");
    let cli = support::tidemark()
        .args(["status", "--url", &format!("http://127.0.0.1:{http}")])
        .output()
        .expect("tidemark status");
    let text = String::from_utf8_lossy(&cli.stdout);
    assert!(
        text.lines()
            .any(|l| l.starts_with("output  postgres") && l.contains("refused")),
        "{text}"
    );
    let (_, metrics) = support::http_get(http, "/metrics");
    assert!(
        metrics.contains("tidemark_output_refused_total{output=\"postgres\"}"),
        "{metrics}"
    );
}

/// Every panel of contrib/grafana/tidemark-postgres.json runs on the tables and returns rows.
fn dashboard_queries_run(pg: &Postgres) {
    let d: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/contrib/grafana/tidemark-postgres.json"
        ))
        .expect("dashboard"),
    )
    .expect("dashboard json");
    let panels = d["panels"].as_array().expect("panels");
    assert!(panels.len() >= 4);
    for p in panels {
        let sql = p["targets"][0]["rawSql"].as_str().expect("rawSql");
        // Grafana's macros and the dashboard's variable, as Grafana expands them.
        let mut q = sql.replace("$metric", "temp");
        while let Some(i) = q.find("$__timeFilter(") {
            let j = i + q[i..].find(')').expect("macro end");
            let col = &q[i + "$__timeFilter(".len()..j];
            q = format!(
                "{}{col} BETWEEN now() - interval '1 day' AND now() + interval '1 day'{}",
                &q[..i],
                &q[j + 1..]
            );
        }
        let rows = pg.psql("site", &q);
        assert!(
            !rows.is_empty(),
            "panel {:?} returned no rows: {q}",
            p["title"]
        );
    }
}

#[test]
fn a_refused_row_and_a_refused_point_are_set_aside_published_and_counted_the_rest_written() {
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = Mosquitto::start(false);
    let pg = Postgres::start(dir.path());
    let ix = Influx::start(dir.path());
    pg.psql("site", AUDIT);
    pg.psql(
        "site",
        "ALTER TABLE tidemark_windows ADD CONSTRAINT no_d4 CHECK (device <> 'd4')",
    );
    let http = support::free_port();
    let config = GatewayConfig::new("gw", &dir.path().join("state"), &broker, &broker)
        .merge("metrics", RULES)
        .set(
            "sink.postgres",
            &format!("enabled = true\nurl = \"{}\"", pg.url()),
        )
        .set(
            "sink.influx",
            &format!("enabled = true\nurl = \"{}\"", ix.url()),
        )
        .http(http)
        .write(&dir.path().join("gateway.toml"));
    let log = dir.path().join("gw.log");
    let up = Collector::start(broker.port, "tidemark/gw/#", "refuse-collector");
    let mut publisher = Publisher::connect(broker.port, "refuse-fleet");
    let mut fleet = Fleet::new(6, 60);
    // `vib` only on d3, already a string field in InfluxDB: its points conflict.
    assert_eq!(
        ix.write(&format!(
            "tidemark_windows,device=x,gateway=gw,group=fleet vib_mean=\"text\" {}",
            fleet.base
        )),
        204
    );
    let gw = Gateway::start(&config, &log);
    while fleet.send(&mut publisher, 6) {}
    for k in 0..5 {
        let ts = fleet.base + i64::from(k) * 100 + 70;
        publisher.send(
            "sensors/fleet/d3/reading",
            format!(r#"{{"ts": {ts}, "temp": 1, "vib": 0.5}}"#).as_bytes(),
        );
    }
    publisher.flush();
    let refused = || {
        up.on("/rejected")
            .iter()
            .map(|r| r.json())
            .filter(|v| v["reason"] == "output_refused")
            .collect::<Vec<_>>()
    };
    wait_or_explain(
        MIN,
        || {
            let r = refused();
            r.iter().any(|v| {
                v["device"] == "d4"
                    && v["detail"]
                        .as_str()
                        .is_some_and(|d| d.starts_with("postgres: "))
            }) && r.iter().any(|v| {
                v["device"] == "d3"
                    && v["detail"]
                        .as_str()
                        .is_some_and(|d| d.starts_with("influx: "))
            })
        },
        || {
            format!(
                "{:#?}\n{}",
                refused(),
                std::fs::read_to_string(&log).unwrap_or_default()
            )
        },
    );
    let mqtt = mqtt_windows(&up);
    wait_until(MIN, "every other window written", || {
        let want_pg: BTreeMap<_, _> = mqtt_windows(&up)
            .into_iter()
            .filter(|(k, _)| !k.contains("/d4/"))
            .collect();
        pg_windows(&pg) == want_pg
    });
    let ix_rows = influx_windows(&ix);
    for (k, v) in &mqtt {
        if k.contains("/d3/") {
            continue;
        }
        assert_eq!(ix_rows.get(k), Some(v), "{k} in InfluxDB");
    }
    for v in refused() {
        assert!(
            v["id"].as_str().is_some_and(|i| !i.is_empty())
                && v["topic"].as_str().is_some_and(|t| t.contains("/windows/")),
            "{v}"
        );
    }
    outputs_shown(http);
    let _ = gw.terminate();
}

#[test]
fn after_a_takeover_the_new_active_writes_from_the_replicated_cursor_no_duplicate_no_gap() {
    use support::pair::{Board, TAKEOVER, pair_up, pump, wait_line};
    let site = Mosquitto::stock();
    let up_broker = Mosquitto::stock();
    let dir = tempfile::tempdir().expect("tempdir");
    let pg = Postgres::start(dir.path());
    pg.psql("site", AUDIT);
    // A condition every window meets: raised once per device, never again after the takeover.
    let extra = format!(
        "[sink.postgres]\nenabled = true\nurl = \"{}\"\nbatch_max = 100\n\
         [[group_defaults.conditions]]\nname = \"on\"\nwhen = \"temp.mean > 0.5\"\n",
        pg.url()
    );
    let mut boards = [
        Board::with(dir.path(), "a", (&site, &up_broker), 3, &extra),
        Board::with(dir.path(), "b", (&site, &up_broker), 3, &extra),
    ];
    let up = Collector::start(up_broker.port, "tidemark/gw/#", "takeover-db-collector");
    pair_up(&mut boards);
    let (stop, pumping) = pump(site.port, "takeover-db-fleet", Fleet::new(20, 150));
    wait_until(MIN, "rows in PostgreSQL from the first active", || {
        pg_windows(&pg).len() > 20
    });
    boards[0].kill9();
    wait_line(&boards[1], TAKEOVER, 0, MIN);
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (mut publisher, mut fleet) = pumping.join().expect("fleet thread");
    while fleet.send(&mut publisher, 10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    publisher.flush();
    let total = i64::try_from(fleet.total()).unwrap_or(0);
    wait_or_explain(
        3 * MIN,
        || sum(&mqtt_windows(&up)) == total && sum(&pg_windows(&pg)) == total,
        || {
            format!(
                "sent {total}: mqtt {} postgres {}\n{}",
                sum(&mqtt_windows(&up)),
                sum(&pg_windows(&pg)),
                boards[1].log_text()
            )
        },
    );
    assert_eq!(
        pg_windows(&pg),
        mqtt_windows(&up),
        "one row per window, no gap"
    );
    audit_clean(&pg);
    let ids = support::db::condition_ids(&up);
    assert_eq!(
        ids.len(),
        20,
        "one raise per device across the takeover: {ids:?}"
    );
    assert!(ids.iter().all(|i| i.ends_with("/raised")), "{ids:?}");
    wait_until(MIN, "the raises in PostgreSQL", || {
        let mut rows: Vec<String> = pg
            .psql("site", "SELECT id FROM tidemark_conditions")
            .lines()
            .map(str::to_string)
            .collect();
        rows.sort();
        rows == ids
    });
    let written = pg.psql("site", "SELECT count(*) FROM audit WHERE tbl = 'windows'");
    eprintln!("{written} row writes for {} windows", pg_windows(&pg).len());
    for b in &mut boards {
        if let Some(g) = b.gw.take() {
            let _ = g.terminate();
        }
    }
}

#[test]
fn a_site_with_only_a_database_needs_no_upstream_broker() {
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = Mosquitto::start(false);
    let pg = Postgres::start(dir.path());
    let config = GatewayConfig::new("gw", &dir.path().join("state"), &broker, &broker)
        .merge("metrics", RULES)
        .set("sink", "url = \"\"\nplain = false")
        .set(
            "sink.postgres",
            &format!("enabled = true\nurl = \"{}\"", pg.url()),
        )
        .write(&dir.path().join("gateway.toml"));
    let log = dir.path().join("gw.log");
    let mut publisher = Publisher::connect(broker.port, "db-only-fleet");
    let mut fleet = Fleet::new(4, 60);
    let gw = Gateway::start(&config, &log);
    while fleet.send(&mut publisher, 4) {}
    publisher.flush();
    let total = i64::try_from(fleet.total()).unwrap_or(0);
    wait_or_explain(
        MIN,
        || {
            pg.try_psql("site", "SELECT sum(readings) FROM tidemark_windows")
                .is_ok_and(|s| s == total.to_string())
        },
        || std::fs::read_to_string(&log).unwrap_or_default(),
    );
    let (code, _) = gw.terminate();
    assert_eq!(
        code,
        Some(0),
        "{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
}
