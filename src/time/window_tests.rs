use super::*;

fn rule(spec: WindowSpec, lateness: Millis) -> Rule {
    Rule {
        spec,
        span: Span::ALL,
        lateness,
        fresh: None,
        extras: Default::default(),
    }
}

fn starts(spec: WindowSpec, t: Millis) -> Vec<(Millis, Millis)> {
    let mut v = heapless::Vec::new();
    assign(spec, t, &mut v);
    v.to_vec()
}

#[test]
fn tumbling_aligns_to_the_epoch() {
    let s = WindowSpec::Tumbling { size_ms: 60_000 };
    assert_eq!(
        starts(s, 1_764_480_012_345),
        vec![(1_764_480_000_000, 1_764_480_060_000)]
    );
    assert_eq!(starts(s, 60_000), vec![(60_000, 120_000)]);
}

#[test]
fn hopping_windows_cover_every_slide_multiple_containing_t() {
    let s = WindowSpec::Hopping {
        size_ms: 60_000,
        slide_ms: 15_000,
    };
    assert_eq!(
        starts(s, 100_000),
        vec![
            (45_000, 105_000),
            (60_000, 120_000),
            (75_000, 135_000),
            (90_000, 150_000)
        ]
    );
    let odd = WindowSpec::Hopping {
        size_ms: 10_000,
        slide_ms: 4_000,
    };
    assert_eq!(
        starts(odd, 8_000),
        vec![(0, 10_000), (4_000, 14_000), (8_000, 18_000)]
    );
}

#[test]
fn sessions_merge_events_closer_than_the_gap() {
    let spec = WindowSpec::Session { gap_ms: 10_000 };
    let mut ws = Vec::new();
    assert!(apply(&mut ws, rule(spec, 0), 0, None, false, &[(0, 1.0)]));
    assert!(apply(
        &mut ws,
        rule(spec, 0),
        25_000,
        None,
        false,
        &[(0, 2.0)]
    ));
    assert_eq!(ws.len(), 2);
    assert!(apply(
        &mut ws,
        rule(spec, 0),
        9_000,
        None,
        false,
        &[(0, 3.0)]
    ));
    assert_eq!(ws.len(), 2);
    assert_eq!((ws[0].start, ws[0].end, ws[0].count), (0, 19_000, 2));
    // This one bridges both sessions.
    assert!(apply(
        &mut ws,
        Rule {
            spec,
            span: Span::ALL,
            lateness: 0,
            fresh: None,
            extras: Default::default(),
        },
        18_000,
        None,
        true,
        &[]
    ));
    assert_eq!(ws.len(), 1);
    assert_eq!(
        (ws[0].start, ws[0].end, ws[0].count, ws[0].heartbeats),
        (0, 35_000, 3, 1)
    );
    // Exactly one gap away is not closer than the gap: a new session.
    assert!(apply(
        &mut ws,
        Rule {
            spec,
            span: Span::ALL,
            lateness: 0,
            fresh: None,
            extras: Default::default(),
        },
        45_000,
        None,
        false,
        &[]
    ));
    assert_eq!(ws.len(), 2);
    let s = ws[0].metrics.iter().next().unwrap();
    assert_eq!((s.first, s.last), (1.0, 2.0));
}

#[test]
fn first_and_last_follow_event_time_with_arrival_breaking_ties() {
    let mut w = Window::new(0, 100);
    w.add(50, false, &[(0, 5.0)]);
    w.add(10, false, &[(0, 1.0)]);
    w.add(10, false, &[(0, 2.0)]);
    w.add(90, false, &[(0, 9.0)]);
    w.add(90, false, &[(0, 8.0)]);
    let s = w.metrics.iter().next().unwrap();
    assert_eq!(
        (s.first, s.last, s.min, s.max, s.count, s.sum),
        (1.0, 8.0, 1.0, 9.0, 5, 25.0)
    );
    assert_eq!(s.mean(), 5.0);
}

#[test]
fn windows_past_lateness_refuse_the_event() {
    let spec = WindowSpec::Tumbling { size_ms: 1000 };
    let mut ws = Vec::new();
    assert!(apply(&mut ws, rule(spec, 500), 500, Some(1400), false, &[]));
    assert!(!apply(
        &mut ws,
        rule(spec, 500),
        500,
        Some(1500),
        false,
        &[]
    ));
}

fn cbor<T: Serialize>(v: &T) -> Vec<u8> {
    let mut b = Vec::new();
    ciborium::ser::into_writer(v, &mut b).unwrap();
    b
}

proptest::proptest! {
    /// Packing the window changed no stored byte: its record is the old
    /// layout's, both ways, over shapes, metric sets, revisions and sessions.
    #[test]
    fn records_keep_the_layout_they_had_before_the_window_was_packed(
        kind in 0u8..3,
        events in proptest::collection::vec(
            (0i64..200_000, proptest::bool::weighted(0.1),
             proptest::collection::vec((0u16..5, -1e9f64..1e9), 0..4)),
            1..40),
        revisions in proptest::collection::vec(0usize..40, 0..4),
        lateness in 0i64..50_000,
    ) {
        let spec = match kind {
            0 => WindowSpec::Tumbling { size_ms: 10_000 },
            1 => WindowSpec::Hopping { size_ms: 30_000, slide_ms: 10_000 },
            _ => WindowSpec::Session { gap_ms: 7_000 },
        };
        let mut ws = Vec::new();
        for (i, (t, hb, ms)) in events.iter().enumerate() {
            apply(&mut ws, rule(spec, lateness), *t, None, *hb, ms);
            if revisions.contains(&i) {
                for w in &mut ws {
                    let r = w.emitted().map_or(0, |r| r + 1);
                    w.set_emitted(Some(r));
                    w.dirty = false;
                }
            }
        }
        for w in &ws {
            // The records' derive is the layout written before the window was packed.
            let old = WindowRecord {
                start: w.start,
                end: w.end,
                emitted: w.emitted(),
                dirty: w.dirty,
                count: u64::from(w.count),
                heartbeats: u64::from(w.heartbeats),
                metrics: w.metrics.iter().map(|s| (s.metric, StatsRecord::from(&s))).collect(),
                last_event: w.last_event,
                extra: None,
            };
            let bytes = cbor(w);
            proptest::prop_assert_eq!(&bytes, &cbor(&old));
            let back: Window = ciborium::de::from_reader(&bytes[..]).unwrap();
            proptest::prop_assert_eq!(&back, w);
            let old_back: WindowRecord = ciborium::de::from_reader(&bytes[..]).unwrap();
            proptest::prop_assert_eq!(old_back, old);
        }
    }
}

#[test]
fn the_packed_window_and_its_metric_are_the_sizes_the_benchmarks_count() {
    // 64 bytes, the extra aggregates' pointer (None without them), and two metrics of one reading inline.
    assert_eq!(std::mem::size_of::<Window>(), 80);
    assert_eq!(std::mem::size_of::<Metrics>(), 32);
    assert_eq!(std::mem::size_of::<Stats>(), 64);
}

#[test]
fn a_window_with_extra_aggregates_is_stored_and_read_back_whole() {
    let extras = crate::time::extras::Extras::of(&["stddev".into(), "p99".into()], 0.01);
    let mut w = Window::new(0, 100);
    for (t, v) in [(10, 1.0), (20, 4.0), (30, -2.5)] {
        w.add(t, false, &[(0, v), (3, v * 2.0)]);
        w.add_extra(extras, &[(0, v), (3, v * 2.0)]);
    }
    let bytes = cbor(&w);
    let back: Window = ciborium::de::from_reader(&bytes[..]).unwrap();
    assert_eq!(back, w);
    let x = back.extra.as_deref().expect("extra state");
    assert_eq!(x.len(), 2);
    assert_eq!(x[0].moments.as_ref().map(|m| m.count()), Some(3));
    assert_eq!(
        x[1].sketch.as_ref().map(crate::time::sketch::Sketch::count),
        Some(3)
    );
}
