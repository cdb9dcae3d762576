//! One scenario per rule of docs/reference.md#time, driving the engine with a manual clock.

mod support;

use support::engine::{Sim, T0, counts_by_start};
use tidemark::model::Reason;
use tidemark::output::AlertType;

const MIN: i64 = 60_000;

#[test]
fn fast_and_slow_device_clocks_land_in_their_true_windows() {
    let mut sim = Sim::new("", T0);
    for k in 0..180 {
        let t = T0 + k * 1000 + 500;
        let at = t + 30 + (k % 7) * 20;
        sim.reading(at, "g", "fast", t + 17 * MIN, 1.0);
        sim.reading(at + 1, "g", "slow", t - 3 * MIN, 1.0);
    }
    sim.advance(T0 + 5 * MIN);
    let want = vec![(0, 60), (MIN, 60), (2 * MIN, 60)];
    assert_eq!(counts_by_start(&sim, "slow"), want);
    assert_eq!(counts_by_start(&sim, "fast"), want);
    let skew = sim.alerts(AlertType::ClockSkew);
    assert_eq!(skew.len(), 1, "only the fast clock is beyond max_skew_ms");
    assert_eq!(skew[0].device, "fast");
    assert_eq!(skew[0].offset_ms, Some(-17 * MIN + 30));
    assert!(sim.late().is_empty() && sim.rejected().is_empty());
}

#[test]
fn backward_clock_step_of_17_minutes_is_recovered_within_seconds() {
    let mut sim = Sim::new("", T0);
    for k in 0..120 {
        let t = T0 + k * 1000 + 500;
        let device_ts = if k < 60 { t } else { t - 17 * MIN };
        sim.reading(t + 20, "g", "d", device_ts, 1.0);
    }
    sim.advance(T0 + 5 * MIN);
    let skew = sim.alerts(AlertType::ClockSkew);
    assert_eq!(skew.len(), 1);
    let recovered_after = skew[0].at - (T0 + MIN);
    assert!(
        recovered_after <= 4_000,
        "recovered after {recovered_after} ms"
    );
    let counts = counts_by_start(&sim, "d");
    assert_eq!(counts[0], (0, 60));
    assert_eq!(counts[1].0, MIN);
    let misplaced = sim.late().len() as u64;
    assert!(misplaced <= 4, "{misplaced} readings misplaced");
    assert_eq!(
        counts[1].1 + misplaced,
        60,
        "every reading is in its window or on the late topic"
    );
}

#[test]
fn five_minute_backlog_burst_lands_in_true_late_windows_not_arrival_time() {
    let mut sim = Sim::new("", T0);
    let offset = 42_000; // the device clock runs 42 s behind
    // One minute live, then five minutes buffered while the uplink of the device is down.
    for k in 0..60 {
        let t = T0 + k * 1000;
        sim.reading(t + 20, "g", "d", t - offset, 1.0);
        sim.reading(t + 25, "g", "other", t, 1.0);
    }
    for k in 60..360 {
        let t = T0 + k * 1000;
        sim.reading(t + 25, "g", "other", t, 1.0);
    }
    let burst = T0 + 360_000;
    for (i, k) in (60..360).enumerate() {
        let t = T0 + k * 1000;
        sim.reading(burst + i as i64 * 5, "g", "d", t - offset, 2.0);
    }
    for k in 362..420 {
        let t = T0 + k * 1000;
        sim.reading(t + 20, "g", "d", t - offset, 3.0);
        sim.reading(t + 25, "g", "other", t, 1.0);
    }
    sim.advance(T0 + 8 * MIN);
    assert_eq!(
        sim.engine().device("g", "d").unwrap().skew.estimate(),
        Some(offset + 20)
    );
    assert!(sim.alerts(AlertType::ClockSkew).is_empty());
    let late = sim.late();
    assert_eq!(
        late.len(),
        240,
        "buffered readings older than the lateness bound"
    );
    for l in &late {
        let device_ts = match l.payload["ts"] {
            tidemark::output::PayloadValue::Int(t) => t,
            ref v => panic!("{v:?}"),
        };
        assert_eq!(
            l.event_time,
            device_ts + offset + 20,
            "stamped with its true time"
        );
        assert!(l.event_time < T0 + 300_000);
    }
    let counts = counts_by_start(&sim, "d");
    assert!(counts.contains(&(5 * MIN, 60)), "{counts:?}");
    assert!(counts.contains(&(6 * MIN, 58)), "{counts:?}");
    assert_eq!(
        sim.statuses("d"),
        vec![true, false, true],
        "offline while silent, online on return"
    );
}

#[test]
fn out_of_order_within_the_bound_produces_no_late_events() {
    let mut sim = Sim::new("[time]\npolicy = \"device\"\n", T0);
    for k in (0..180).step_by(2) {
        let base = T0 + k * 1000;
        sim.reading(base + 1100, "g", "d", base + 1000, 1.0);
        sim.reading(base + 1150, "g", "d", base, 1.0);
    }
    sim.advance(T0 + 5 * MIN);
    assert!(sim.late().is_empty());
    assert_eq!(
        counts_by_start(&sim, "d"),
        vec![(0, 60), (MIN, 60), (2 * MIN, 60)]
    );
    assert!(sim.windows_of("d").iter().all(|w| w.revision == 0));
}

#[test]
fn late_event_within_lateness_revises_once_per_tick_and_beyond_goes_to_late_topic() {
    let mut sim = Sim::new("[time]\npolicy = \"device\"\n", T0);
    for k in 0..70 {
        sim.reading(T0 + k * 1000 + 10, "g", "d", T0 + k * 1000, 1.0);
    }
    assert_eq!(sim.windows_of("d").len(), 1, "first window fired");
    // Two late readings inside the same tick: one coalesced revision.
    sim.reading(T0 + 70_000, "g", "d", T0 + 30_000, 5.0);
    sim.reading(T0 + 70_050, "g", "d", T0 + 31_000, 7.0);
    for k in 71..96 {
        sim.reading(T0 + k * 1000 + 10, "g", "d", T0 + k * 1000, 1.0);
    }
    sim.reading(T0 + 96_500, "g", "d", T0 + 10_000, 9.0);
    sim.advance(T0 + 97_000);
    let first: Vec<_> = sim
        .windows_of("d")
        .into_iter()
        .filter(|w| w.start == T0)
        .collect();
    assert_eq!(first.len(), 2);
    assert_eq!((first[0].revision, first[0].count), (0, 60));
    assert_eq!((first[1].revision, first[1].count), (1, 62));
    assert_eq!(first[1].id, format!("g/d/{T0}/1"));
    assert_eq!(first[1].metrics["temp"].max, 7.0);
    let late = sim.late();
    assert_eq!(late.len(), 1);
    assert_eq!(late[0].event_time, T0 + 10_000);
    assert!(late[0].watermark.unwrap() >= T0 + 90_000);
    assert_eq!(sim.engine().counters().late, 1);
}

#[test]
fn one_silent_device_does_not_stall_its_group() {
    let mut sim = Sim::new("[time]\npolicy = \"device\"\n", T0);
    for k in 0..200 {
        let t = T0 + k * 1000;
        sim.reading(t + 10, "g", "a", t, 1.0);
        if k < 20 {
            sim.reading(t + 10, "g", "b", t, 1.0);
        }
    }
    sim.advance(T0 + 199_500);
    let counts = counts_by_start(&sim, "a");
    assert_eq!(counts, vec![(0, 60), (MIN, 60), (2 * MIN, 60)]);
    assert_eq!(counts_by_start(&sim, "b"), vec![(0, 20)]);
    assert!(sim.engine().watermark("g").unwrap() >= T0 + 197_000);
}

#[test]
fn silent_group_still_closes_windows_and_raises_offline() {
    let mut sim = Sim::new("", T0);
    for k in 0..30 {
        let t = T0 + k * 1000;
        sim.reading(t + 10, "g", "d", t, 1.0);
    }
    let last_arrival = T0 + 29_010;
    sim.advance(T0 + 4 * MIN);
    assert_eq!(counts_by_start(&sim, "d"), vec![(0, 30)]);
    let off = sim.alerts(AlertType::Offline);
    assert_eq!(off.len(), 1);
    let last_seen = T0 + 29_010; // device time + estimated offset (10 ms)
    assert_eq!(off[0].last_seen, Some(last_seen));
    // W = last_seen + silence − idle_timeout − out_of_orderness reaches last_seen + heartbeat_timeout.
    let due = last_arrival + 60_000 + 30_000 + 2_000;
    assert!(
        off[0].at >= due && off[0].at < due + 200,
        "offline at {}",
        off[0].at - due
    );
    assert_eq!(sim.statuses("d"), vec![true, false]);
}

#[test]
fn silent_group_with_device_clocks_behind_is_not_pushed_ahead_of_its_timeline() {
    let mut sim = Sim::new("[time]\npolicy = \"device\"\n", T0);
    let behind = 10 * MIN;
    for k in 0..30 {
        let t = T0 + k * 1000;
        sim.reading(t + 10, "g", "d", t - behind, 1.0);
    }
    sim.advance(T0 + 5 * MIN);
    let wm = sim.engine().watermark("g").unwrap();
    let silence = T0 + 5 * MIN - (T0 + 29_010);
    // At most one tick ahead of the formula, and far behind the gateway clock.
    let expected = T0 + 29_000 - behind + silence - 30_000 - 2_000;
    assert!(
        wm <= expected && wm > expected - 200,
        "wm {} vs {}",
        wm,
        expected
    );
    assert!(wm < T0 + 5 * MIN - behind);
    assert_eq!(counts_by_start(&sim, "d"), vec![(-10 * MIN, 30)]);
    assert_eq!(sim.alerts(AlertType::Offline).len(), 1);
}

#[test]
fn returning_device_goes_online_once_and_offline_again_when_silent() {
    let mut sim = Sim::new("[time]\npolicy = \"device\"\n", T0);
    for k in 0..10 {
        sim.reading(T0 + k * 1000 + 5, "g", "d", T0 + k * 1000, 1.0);
    }
    sim.advance(T0 + 3 * MIN);
    assert_eq!(sim.alerts(AlertType::Offline).len(), 1);
    for k in 180..190 {
        sim.heartbeat(T0 + k * 1000 + 5, "g", "d", T0 + k * 1000);
    }
    sim.advance(T0 + 6 * MIN);
    let online = sim.alerts(AlertType::Online);
    assert_eq!(online.len(), 1);
    assert_eq!(online[0].last_seen, Some(T0 + 180_000));
    assert_eq!(sim.alerts(AlertType::Offline).len(), 2);
    assert_eq!(sim.statuses("d"), vec![true, false, true, false]);
    let hb: Vec<_> = sim
        .windows_of("d")
        .into_iter()
        .filter(|w| w.heartbeats > 0)
        .collect();
    assert_eq!(hb.len(), 1);
    assert_eq!((hb[0].count, hb[0].heartbeats), (0, 10));
}

#[test]
fn invalid_timestamps_use_arrival_time_by_default() {
    let mut sim = Sim::new("", T0);
    let at = T0 + 5_000;
    sim.send(at, "sensors/g/d/reading", r#"{"temp": 1}"#);
    sim.send(
        at + 1,
        "sensors/g/d/reading",
        r#"{"ts": "garbage", "temp": 2}"#,
    );
    sim.send(
        at + 2,
        "sensors/g/d/reading",
        r#"{"ts": 1000000, "temp": 3}"#,
    );
    sim.advance(T0 + 3 * MIN);
    assert!(sim.rejected().is_empty());
    assert_eq!(counts_by_start(&sim, "d"), vec![(0, 3)]);
}

#[test]
fn invalid_timestamps_are_rejected_under_reject() {
    let mut sim = Sim::new("[time]\ninvalid = \"reject\"\n", T0);
    sim.send(T0 + 1, "sensors/g/d/reading", r#"{"temp": 1}"#);
    sim.send(T0 + 2, "sensors/g/d/reading", r#"{"ts": "garbage"}"#);
    sim.send(T0 + 3, "sensors/g/d/reading", r#"{"ts": 1000000}"#);
    sim.send(T0 + 4, "sensors/g/d/reading", r#"{"ts": -1}"#);
    let r = sim.rejected();
    assert_eq!(r.len(), 4);
    assert!(r.iter().all(|r| r.reason == Reason::InvalidTimestamp));
    assert!(
        r[2].detail.contains("min_valid_epoch_ms"),
        "{}",
        r[2].detail
    );
    assert_eq!(r[0].group.as_deref(), Some("g"));
    assert_eq!(
        sim.engine().counters().rejected(Reason::InvalidTimestamp),
        4
    );
}

#[test]
fn future_and_too_old_event_times_are_rejected() {
    let mut sim = Sim::new("[time]\npolicy = \"device\"\n", T0);
    sim.reading(T0 + 1000, "g", "d", T0 + 1000 + 10_000, 1.0);
    sim.reading(T0 + 2000, "g", "d", T0 + 2000 - 25 * 60 * MIN, 1.0);
    sim.reading(T0 + 3000, "g", "d", T0 + 3000 + 4_000, 1.0);
    let r = sim.rejected();
    assert_eq!(
        r.iter().map(|r| r.reason).collect::<Vec<_>>(),
        vec![Reason::Future, Reason::TooOld]
    );
    assert_eq!(r[0].arrival, T0 + 1000);
}

#[test]
fn one_far_future_timestamp_from_a_calibrated_device_is_rejected_not_absorbed() {
    let mut sim = Sim::new("", T0);
    for k in 0..30 {
        sim.reading(T0 + k * 1000 + 20, "g", "d", T0 + k * 1000, 1.0);
    }
    sim.reading(T0 + 30_020, "g", "d", T0 + 30_000 + 3_600_000, 1.0);
    sim.reading(T0 + 31_020, "g", "d", T0 + 31_000, 1.0);
    let r = sim.rejected();
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].reason, Reason::Future);
    assert!(sim.alerts(AlertType::ClockSkew).is_empty());
    assert_eq!(
        sim.engine().device("g", "d").unwrap().skew.estimate(),
        Some(20)
    );
}

#[test]
fn duplicate_sequence_numbers_are_dropped_and_counted() {
    let mut sim = Sim::new("[time]\npolicy = \"device\"\n", T0);
    let p = |seq: u64, ts: i64| format!(r#"{{"ts": {ts}, "seq": {seq}, "temp": 1}}"#);
    sim.send(T0 + 100, "sensors/g/d/reading", &p(7, T0));
    sim.send(T0 + 200, "sensors/g/d/reading", &p(7, T0));
    sim.send(T0 + 300, "sensors/g/d/reading", &p(9, T0 + 1));
    sim.send(T0 + 400, "sensors/g/d/reading", &p(8, T0 + 2));
    sim.send(T0 + 500, "sensors/g/d/reading", &p(9, T0 + 1));
    // A reboot restarts the counter far below the window: a fresh window, not dropped.
    sim.send(T0 + 600, "sensors/g/d/reading", &p(5000, T0 + 3));
    sim.send(T0 + 700, "sensors/g/d/reading", &p(1, T0 + 4));
    sim.advance(T0 + 3 * MIN);
    assert_eq!(sim.engine().counters().duplicates, 2);
    assert_eq!(counts_by_start(&sim, "d"), vec![(0, 5)]);
}

#[test]
fn hopping_windows_start_every_slide() {
    let mut sim = Sim::new(
        "[time]\npolicy = \"device\"\n[group_defaults]\nwindow = { kind = \"hopping\", size_ms = 60000, slide_ms = 15000 }\n",
        T0,
    );
    for k in 0..120 {
        sim.reading(T0 + k * 1000 + 10, "g", "d", T0 + k * 1000, k as f64);
    }
    sim.advance(T0 + 5 * MIN);
    let counts = counts_by_start(&sim, "d");
    let starts: Vec<i64> = counts.iter().map(|c| c.0).collect();
    assert_eq!(
        starts,
        vec![
            -45_000, -30_000, -15_000, 0, 15_000, 30_000, 45_000, 60_000, 75_000, 90_000, 105_000
        ]
    );
    let full: Vec<_> = counts
        .iter()
        .filter(|c| (0..=60_000).contains(&c.0))
        .map(|c| c.1)
        .collect();
    assert!(full.iter().all(|&c| c == 60), "{full:?}");
    let w = sim
        .windows_of("d")
        .into_iter()
        .find(|w| w.start == T0 + 15_000)
        .unwrap();
    assert_eq!(
        (w.metrics["temp"].first, w.metrics["temp"].last),
        (15.0, 74.0)
    );
}

#[test]
fn session_windows_close_after_the_gap() {
    let mut sim = Sim::new(
        "[time]\npolicy = \"device\"\n[groups.s]\nwindow = { kind = \"session\", gap_ms = 10000 }\n",
        T0,
    );
    for k in 0..5 {
        sim.reading(T0 + k * 1000 + 10, "s", "d", T0 + k * 1000, 1.0);
    }
    for k in 30..36 {
        sim.reading(T0 + k * 1000 + 10, "s", "d", T0 + k * 1000, 1.0);
    }
    sim.advance(T0 + 3 * MIN);
    let w = sim.windows_of("d");
    let got: Vec<_> = w
        .iter()
        .map(|w| (w.start - T0, w.end - T0, w.count, w.revision))
        .collect();
    assert_eq!(got, vec![(0, 14_000, 5, 0), (30_000, 45_000, 6, 0)]);
}

#[test]
fn bad_topics_and_undecodable_payloads_are_rejected_with_reasons() {
    let mut sim = Sim::new("", T0);
    sim.send(T0 + 1, "sensors/g/d", r#"{"ts": 1}"#);
    sim.send(T0 + 2, "sensors/g/d/status", r#"{"ts": 1}"#);
    sim.send(T0 + 3, "sensors/g/d/reading", "[1,2,3]");
    sim.send(T0 + 4, "sensors/g/d/reading", "{\"ts\": ");
    let r = sim.rejected();
    let reasons: Vec<_> = r.iter().map(|r| r.reason).collect();
    assert_eq!(
        reasons,
        vec![
            Reason::BadTopic,
            Reason::BadTopic,
            Reason::DecodeError,
            Reason::DecodeError
        ]
    );
    assert_eq!(r[0].group, None);
    assert_eq!(r[2].device.as_deref(), Some("d"));
    let c = sim.engine().counters();
    assert_eq!(
        (
            c.received,
            c.rejected(Reason::BadTopic),
            c.rejected(Reason::DecodeError)
        ),
        (4, 2, 2)
    );
}
