//! `tidemark inspect`: a read-only dump of persisted state.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::json;
use tidemark::model::Reason;
use tidemark::store;

use super::Failure;

/// Counters with rejections by reason.
fn counters_json(c: &tidemark::engine::Counters) -> serde_json::Value {
    let mut v = serde_json::to_value(c).unwrap_or_default();
    v["rejected"] = Reason::ALL
        .iter()
        .map(|r| (r.as_str().to_owned(), json!(c.rejected(*r))))
        .collect::<serde_json::Map<_, _>>()
        .into();
    v
}

fn fmt_ms(t: Option<i64>) -> String {
    t.map_or_else(|| "-".into(), |t| t.to_string())
}

use tidemark::time::utc;

fn utc_opt(t: Option<i64>) -> Option<String> {
    t.map(utc)
}

/// A time column: UTC to the second, then epoch ms.
fn when(t: Option<i64>) -> String {
    t.map_or_else(|| "-".into(), |t| format!("{} ({t})", &utc(t)[..19]))
}

/// What both renderings need, computed once.
struct Seen<'a> {
    state_dir: &'a Path,
    view: &'a store::Inspect,
    clock: tidemark::time::gateway::GatewayClock,
    oldest_age: Option<i64>,
    windows_per_group: BTreeMap<&'a str, usize>,
    missing_per_group: BTreeMap<&'a str, u64>,
}

impl Seen<'_> {
    /// A device's offset against the corrected gateway clock, as the engine judges it.
    fn offset(&self, d: &tidemark::engine::Device) -> Option<i64> {
        d.skew.estimate().map(|e| e - self.clock.error)
    }
}

pub fn run(state_dir: &Path, as_json: bool) -> Result<(), Failure> {
    let view = match store::inspect(state_dir) {
        Ok(v) => v,
        Err(store::StoreError::Open {
            source: redb::DatabaseError::DatabaseAlreadyOpen,
            path,
        }) => {
            return Err(Failure::Error(format!(
                "a running gateway holds {}: see its live state with `tidemark status` \
                 (or stop it, then inspect)",
                path.display()
            )));
        }
        Err(e) => return Err(Failure::Error(e.to_string())),
    };
    let s = &view.snapshot;
    // The oldest outbox entry's age is the one reading of the wall clock.
    let now = tidemark::sys::clock::SystemClock::new().now().wall;
    let mut seen = Seen {
        state_dir,
        view: &view,
        clock: s.gateway_clock.clone().unwrap_or_default(),
        oldest_age: view.oldest.as_ref().map(|e| now - e.at),
        windows_per_group: BTreeMap::new(),
        missing_per_group: BTreeMap::new(),
    };
    for d in &s.devices {
        *seen.windows_per_group.entry(d.group.as_str()).or_default() += d.windows.len();
        *seen.missing_per_group.entry(d.group.as_str()).or_default() += d.missing;
    }
    if as_json {
        json_doc(&seen);
    } else {
        text(&seen);
    }
    Ok(())
}

fn json_doc(seen: &Seen<'_>) {
    let (s, clock) = (&seen.view.snapshot, &seen.clock);
    let (windows_per_group, missing_per_group) = (&seen.windows_per_group, &seen.missing_per_group);
    {
        let groups: Vec<_> = s
            .groups
            .iter()
            .map(|g| {
                json!({
                    "group": g.name.as_str(),
                    "watermark": g.wm,
                    "watermark_utc": utc_opt(g.wm),
                    "max_event_time": g.max_event,
                    "max_event_time_utc": utc_opt(g.max_event),
                    "open_windows": windows_per_group.get(g.name.as_str()).copied().unwrap_or(0),
                    "readings_missing": missing_per_group.get(g.name.as_str()).copied().unwrap_or(0),
                    // Learned by "auto" (docs/reference.md#group_defaults-and-groupsname); null: the config's fixed value.
                    "bound_ms": g.adaptive.as_ref().map(|a| a.bound.value),
                    "lateness_ms": g.adaptive.as_ref().map(|a| a.lateness.value),
                    "lateness_frontier": g.adaptive.as_ref().and_then(|a| a.frontier),
                })
            })
            .collect();
        let devices: Vec<_> = s
            .devices
            .iter()
            .map(|d| {
                json!({
                    "group": d.group.as_str(),
                    "device": d.id.as_str(),
                    "clock_offset_ms": seen.offset(d),
                    "clock_distrusted": d.distrusted,
                    "last_seen": d.max_event,
                    "last_seen_utc": utc_opt(d.max_event.get()),
                    "status": if d.offline { "offline" } else { "online" },
                    "readings_missing": d.missing,
                    "open_windows": d.windows.iter().map(|w| json!({
                        "start": w.start, "end": w.end, "start_utc": utc(w.start),
                        "count": w.count, "heartbeats": w.heartbeats,
                        "emitted_revision": w.emitted(),
                    })).collect::<Vec<_>>(),
                })
            })
            .collect();
        let doc = json!({
            "state_file": store::Store::file(seen.state_dir).display().to_string(),
            "groups": groups,
            "devices": devices,
            "counters": counters_json(&s.counters),
            "gateway_clock": {"error_ms": clock.error, "verdict": clock.verdict},
            "outbox": {"depth": s.outbox_depth, "dropped": s.outbox_dropped, "oldest_age_ms": seen.oldest_age},
            "journal_records": seen.view.journal_records,
        });
        println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
    }
}

fn text(seen: &Seen<'_>) {
    let (s, clock) = (&seen.view.snapshot, &seen.clock);
    let (windows_per_group, missing_per_group) = (&seen.windows_per_group, &seen.missing_per_group);
    println!(
        "state file: {}",
        store::Store::file(seen.state_dir).display()
    );
    println!();
    println!(
        "{:<24} {:<35} {:<35} {:>12} {:>8} {:>10} {:>11}",
        "GROUP",
        "WATERMARK (UTC, ms)",
        "MAX EVENT (UTC, ms)",
        "OPEN WINDOWS",
        "MISSING",
        "BOUND MS",
        "LATENESS MS"
    );
    for g in &s.groups {
        let open = windows_per_group.get(g.name.as_str()).copied().unwrap_or(0);
        // Learned by "auto"; a fixed value is the config's.
        let learned = |v: Option<i64>| v.map_or_else(|| "fixed".to_owned(), |v| v.to_string());
        println!(
            "{:<24} {:<35} {:<35} {:>12} {:>8} {:>10} {:>11}",
            g.name,
            when(g.wm),
            when(g.max_event),
            open,
            missing_per_group.get(g.name.as_str()).copied().unwrap_or(0),
            learned(g.adaptive.as_ref().map(|a| a.bound.value)),
            learned(g.adaptive.as_ref().map(|a| a.lateness.value))
        );
    }
    println!();
    println!(
        "{:<24} {:<24} {:>12} {:<35} {:<8} {:>7} {:>8}",
        "GROUP", "DEVICE", "OFFSET MS", "LAST SEEN (UTC, ms)", "STATUS", "WINDOWS", "MISSING"
    );
    for d in &s.devices {
        let offset = match (seen.offset(d), d.distrusted) {
            (Some(o), true) => format!("{o}!"),
            (o, _) => fmt_ms(o),
        };
        println!(
            "{:<24} {:<24} {:>12} {:<35} {:<8} {:>7} {:>8}",
            d.group,
            d.id,
            offset,
            when(d.max_event.get()),
            if d.offline { "offline" } else { "online" },
            d.windows.len(),
            d.missing
        );
    }
    println!();
    let c = &s.counters;
    println!(
        "counters: received {} accepted {} late {} duplicates {} missing {} timestamps invalid {} rejected {} ({}) windows {} alerts {} conditions raised {} cleared {} retracted {}",
        c.received,
        c.accepted,
        c.late,
        c.duplicates,
        c.readings_missing,
        c.timestamps_invalid,
        c.rejected.iter().sum::<u64>(),
        Reason::ALL
            .iter()
            .map(|r| format!("{} {}", r.as_str(), c.rejected(*r)))
            .collect::<Vec<_>>()
            .join(", "),
        c.windows_emitted,
        c.alerts,
        c.conditions[0],
        c.conditions[1],
        c.conditions[2]
    );
    println!(
        "gateway clock: {}",
        match clock.verdict {
            tidemark::time::gateway::Verdict::Wrong => format!(
                "wrong by {} ms by the devices' consensus (event times follow the devices)",
                clock.error
            ),
            tidemark::time::gateway::Verdict::Trusted => "trusted".into(),
            tidemark::time::gateway::Verdict::Unsure => "not judged yet".into(),
        }
    );
    println!(
        "outbox: {} entries, {} dropped, oldest {}",
        s.outbox_depth,
        s.outbox_dropped,
        seen.oldest_age
            .map_or_else(|| "-".into(), |a| format!("{a} ms old"))
    );
    if seen.view.journal_records > 0 {
        println!(
            "journal: {} group commits since this checkpoint (the state above is older; the gateway folds them in at its next start)",
            seen.view.journal_records
        );
    }
}
