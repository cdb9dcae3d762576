//! The engine on a simulated clock: an implausible or corrected gateway clock,
//! the device limit, metric names, counter resets and invalid timestamps.
mod support;

use support::engine::{Sim, T0, counts_by_start};
use tidemark::engine::Now;
use tidemark::model::Reason;
use tidemark::output::AlertType;

const MIN: i64 = 60_000;

#[test]
fn implausible_gateway_clock_holds_processing_time() {
    let mut sim = Sim::new("", T0);
    // The gateway booted without RTC: its wall clock says 1970 when a reading arrives.
    let boot = |mono: i64| Now {
        wall: 5_000 + mono - T0,
        mono,
        synced: true,
    };
    let p = format!(r#"{{"ts": {T0}, "temp": 1}}"#);
    sim.driver
        .message(boot(T0 + 10), "sensors/g/d/reading", p.as_bytes());
    sim.driver.ticks_until(boot(T0 + 10 * MIN));
    assert!(sim.engine().clock_held());
    assert_eq!(sim.engine().watermark("g"), None);
    // NTP steps it right; the next reading shows the step and processing time resumes.
    let p = format!(r#"{{"ts": {}, "temp": 1}}"#, T0 + 10 * MIN);
    sim.driver
        .message(Now::at(T0 + 10 * MIN), "sensors/g/d/reading", p.as_bytes());
    sim.driver.ticks_until(Now::at(T0 + 10 * MIN + 200));
    assert!(!sim.engine().clock_held());
    assert!(sim.engine().watermark("g").is_some());
}

#[test]
fn devices_beyond_the_limit_are_rejected_visibly_and_known_ones_keep_working() {
    use tidemark::engine::MAX_DEVICES;
    let mut sim = Sim::new("[time]\npolicy = \"arrival\"\n", T0);
    let payload = b"{\"temp\": 1}";
    for d in 0..MAX_DEVICES {
        sim.driver
            .message(Now::at(T0 + 1), &format!("sensors/g/d{d}/reading"), payload);
    }
    sim.driver.take_outputs();
    sim.driver
        .message(Now::at(T0 + 2), "sensors/g/one-too-many/reading", payload);
    sim.driver
        .message(Now::at(T0 + 3), "sensors/g/d7/reading", payload);
    let r = sim.rejected();
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].reason, Reason::BadTopic);
    assert!(r[0].detail.contains("device limit"));
    assert_eq!(sim.engine().counters().accepted, MAX_DEVICES as u64 + 1);
}

#[test]
fn corrected_clock_raises_clock_ok_once_and_forward_step_is_distrusted() {
    let mut sim = Sim::new("", T0);
    // 17 minutes fast from the start: distrusted, arrival time used.
    for k in 0..30 {
        let t = T0 + k * 1000 + 500;
        sim.reading(t + 20, "g", "d", t + 17 * MIN, 1.0);
    }
    // NTP fixes the device clock.
    for k in 30..60 {
        let t = T0 + k * 1000 + 500;
        sim.reading(t + 20, "g", "d", t, 1.0);
    }
    // Later its clock jumps 17 minutes ahead again.
    for k in 60..120 {
        let t = T0 + k * 1000 + 500;
        sim.reading(t + 20, "g", "d", t + 17 * MIN, 1.0);
    }
    sim.advance(T0 + 5 * MIN);
    let skew = sim.alerts(AlertType::ClockSkew);
    let ok = sim.alerts(AlertType::ClockOk);
    assert_eq!(skew.len(), 2, "distrusted at first and after the jump");
    assert_eq!(ok.len(), 1);
    assert!(
        ok[0].at - (T0 + 30_520) <= 4_000,
        "clock_ok after {} ms",
        ok[0].at - (T0 + 30_520)
    );
    assert_eq!(ok[0].offset_ms, Some(20));
    assert!(skew[1].at - (T0 + 60_520) <= 4_000);
    // While the jump is being confirmed its readings would be 17 minutes ahead: rejected, not misplaced.
    let future = sim
        .rejected()
        .iter()
        .filter(|r| r.reason == Reason::Future)
        .count();
    assert!(future <= 4, "{future} rejected as future");
    let counted: u64 = counts_by_start(&sim, "d").iter().map(|c| c.1).sum();
    assert_eq!(
        counted + future as u64,
        120,
        "every reading is in a window or rejected"
    );
    assert_eq!(counts_by_start(&sim, "d")[0], (0, 60));
}

#[test]
fn rejected_and_duplicate_messages_do_not_use_up_metric_names() {
    let mut sim = Sim::new("[time]\npolicy = \"device\"\n", T0);
    sim.send(
        T0 + 10,
        "sensors/g/d/reading",
        &format!(r#"{{"ts": {}, "seq": 1, "a": 1}}"#, T0 + 3_600_000),
    );
    sim.send(
        T0 + 20,
        "sensors/g/d/reading",
        &format!(r#"{{"ts": {T0}, "seq": 1, "b": 1}}"#),
    );
    sim.send(
        T0 + 30,
        "sensors/g/d/reading",
        &format!(r#"{{"ts": {T0}, "seq": 2, "c": 1}}"#),
    );
    assert_eq!(sim.rejected().len(), 1);
    assert_eq!(sim.engine().counters().duplicates, 1);
    let names: Vec<&str> = sim
        .engine()
        .metric_names()
        .iter()
        .map(|n| n.as_str())
        .collect();
    assert_eq!(names, vec!["c"]);
}

#[test]
fn a_device_rebooting_before_its_counter_fills_the_window_loses_nothing() {
    let p = |seq: u64, ts: i64| format!(r#"{{"ts": {ts}, "seq": {seq}, "temp": 1}}"#);
    let topic = "sensors/g/d/reading";
    // (readings before the reboot, after it, period ms)
    for (before, after, period) in [
        (1u64, 1u64, 1000i64),
        (5, 5, 1000),
        (15, 40, 4000),
        (300, 300, 200),
        (1023, 10, 100),
        (40, 2000, 50),
    ] {
        let mut sim = Sim::new("[time]\npolicy = \"device\"\n", T0);
        let ts = |k: u64| T0 + period * i64::try_from(k + 1).unwrap();
        for s in 0..before {
            sim.send(ts(s) + 50, topic, &p(s, ts(s)));
        }
        // QoS 1 redeliveries of the last three, then the reboot: the counter starts over.
        let last = ts(before - 1);
        for s in before.saturating_sub(3)..before {
            sim.send(last + 60, topic, &p(s, ts(s)));
        }
        let boot = before + 50;
        for s in 0..after {
            sim.send(ts(boot + s) + 50, topic, &p(s, ts(boot + s)));
        }
        sim.advance(ts(boot + after) + 10 * MIN);
        let c = sim.engine().counters();
        let case = format!("{before} before, {after} after, every {period} ms");
        assert_eq!(c.accepted, before + after, "{case}");
        assert_eq!(c.duplicates, before.min(3), "{case}");
        let counted: u64 = sim.windows().iter().map(|w| w.count).sum();
        assert_eq!(counted, before + after, "{case}");
    }
}

#[test]
fn readings_with_invalid_timestamps_timed_by_arrival_are_counted_per_device_and_group() {
    let mut sim = Sim::new("[time]\ninvalid = \"arrival\"\n", T0);
    for (i, p) in [
        r#"{"ts": "yesterday", "temp": "hot"}"#,
        r#"{"temp": 1}"#,
        r#"{"ts": 5, "temp": 1}"#,
        r#"{"ts": 0, "temp": 1}"#,
    ]
    .iter()
    .enumerate()
    {
        sim.send(T0 + i as i64, "sensors/g/d/reading", p);
    }
    sim.reading(T0 + 10, "g", "d", T0 + 10, 2.0);
    let c = sim.engine().counters();
    assert_eq!((c.accepted, c.timestamps_invalid), (5, 4));
    assert_eq!(sim.engine().device("g", "d").unwrap().timestamps_invalid, 4);
    let stats = sim.engine().group_stats(tidemark::engine::Now::at(T0 + 10));
    assert_eq!(stats[0].timestamps_invalid, 4);
    // Rejected instead under `invalid = "reject"`: not counted as accepted.
    let mut sim = Sim::new("[time]\ninvalid = \"reject\"\n", T0);
    sim.send(T0, "sensors/g/d/reading", r#"{"ts": "yesterday"}"#);
    assert_eq!(sim.engine().counters().timestamps_invalid, 0);
    assert_eq!(sim.rejected().len(), 1);
}
