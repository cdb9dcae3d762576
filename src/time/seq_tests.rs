use super::*;
use std::collections::BTreeSet;

#[test]
fn repeats_are_duplicates_and_reordering_within_the_window_is_fine() {
    let mut w = SeqWindow::default();
    assert!(w.check_and_insert(10));
    assert!(!w.check_and_insert(10));
    assert!(w.check_and_insert(12));
    assert!(w.check_and_insert(11));
    assert!(!w.check_and_insert(11));
    assert!(w.check_and_insert(500));
    assert!(w.check_and_insert(9));
    assert!(!w.check_and_insert(12));
}

#[test]
fn counter_restart_after_reboot_opens_a_fresh_window() {
    let mut w = SeqWindow::default();
    for s in 50_000..50_100 {
        assert!(w.check_and_insert(s));
    }
    assert!(w.check_and_insert(0), "reboot restarts at 0");
    assert!(w.check_and_insert(1));
    assert!(!w.check_and_insert(0));
}

#[test]
fn a_reboot_before_the_counter_fills_the_window_is_told_by_the_device_time() {
    // 15 readings a minute, then a reboot: the counter starts again at 0.
    for (before, after) in [(1u64, 1u64), (15, 15), (15, 40), (500, 3), (1023, 1023)] {
        let mut w = SeqWindow::default();
        let mut t = 1_000;
        for s in 0..before {
            t += 4_000;
            assert_eq!(w.observe_at(s, Some(t)), Seen::New { missing: 0 });
        }
        let last = t;
        // QoS 1 redeliveries of the old stream are still duplicates.
        for s in 0..before {
            assert_eq!(
                w.observe_at(s, Some(last - 4_000 * (before - 1 - s) as i64)),
                Seen::Duplicate
            );
        }
        for s in 0..after {
            t += 4_000;
            assert_eq!(
                w.observe_at(s, Some(t)),
                Seen::New { missing: 0 },
                "{before}/{after}: {s}"
            );
        }
        // The new stream's own redeliveries are duplicates again.
        assert_eq!(w.observe_at(after - 1, Some(t)), Seen::Duplicate);
        assert_eq!(w.observe_at(0, Some(last + 4_000)), Seen::Duplicate);
    }
}

#[test]
fn a_backfilled_reading_with_a_new_number_does_not_turn_redeliveries_into_reboots() {
    let mut w = SeqWindow::default();
    for s in 0..10 {
        assert_eq!(
            w.observe_at(s, Some(100_000 + s as i64 * 1000)),
            Seen::New { missing: 0 }
        );
    }
    // Number 10 carries a reading from long ago (a backfill), then 3 is redelivered.
    assert_eq!(w.observe_at(10, Some(5_000)), Seen::New { missing: 0 });
    assert_eq!(w.observe_at(3, Some(103_000)), Seen::Duplicate);
    assert_eq!(w.observe_at(9, Some(109_000)), Seen::Duplicate);
}

#[test]
fn a_late_reading_inside_the_window_is_not_taken_for_a_reboot() {
    let mut w = SeqWindow::default();
    assert_eq!(w.observe_at(10, Some(10_000)), Seen::New { missing: 0 });
    assert_eq!(w.observe_at(12, Some(12_000)), Seen::New { missing: 1 });
    assert_eq!(w.observe_at(11, Some(11_000)), Seen::New { missing: -1 });
    assert_eq!(w.observe_at(11, Some(11_000)), Seen::Duplicate);
    // Without a device timestamp the window alone decides, as before.
    assert_eq!(w.observe_at(10, None), Seen::Duplicate);
}

#[test]
fn gaps_count_as_missing_and_late_arrivals_take_it_back() {
    let mut w = SeqWindow::default();
    assert_eq!(w.observe(3010), Seen::New { missing: 0 });
    assert_eq!(w.observe(3014), Seen::New { missing: 3 });
    assert_eq!(w.observe(3012), Seen::New { missing: -1 });
    assert_eq!(w.observe(3012), Seen::Duplicate);
    assert_eq!(w.observe(3015), Seen::New { missing: 0 });
    // Below the stream's first number: never counted, nothing to take back.
    assert_eq!(w.observe(3005), Seen::New { missing: 0 });
    // A reboot restarting the counter is not a gap, nor is the new stream's start.
    assert_eq!(w.observe(0), Seen::New { missing: 0 });
    assert_eq!(w.observe(2), Seen::New { missing: 1 });
    // Nor is a wild jump forward.
    assert_eq!(w.observe(MAX_GAP + 100), Seen::New { missing: 0 });
}

#[test]
fn state_written_before_missing_readings_were_counted_reads_and_counts_from_then_on() {
    #[derive(Serialize)]
    struct Before {
        hi: Option<u64>,
        bits: [u64; WORDS],
    }
    let mut bits = [0; WORDS];
    bits[0] = 0b101; // 100 and 98 seen, 99 never came
    let mut buf = Vec::new();
    ciborium::ser::into_writer(
        &Before {
            hi: Some(100),
            bits,
        },
        &mut buf,
    )
    .unwrap();
    let mut w: SeqWindow = ciborium::de::from_reader(buf.as_slice()).unwrap();
    // 99 was never counted missing, so its arrival takes nothing back.
    assert_eq!(w.observe(99), Seen::New { missing: 0 });
    assert_eq!(w.observe(98), Seen::Duplicate);
    assert_eq!(w.observe(103), Seen::New { missing: 2 });
    assert_eq!(w.observe(101), Seen::New { missing: -1 });
}

proptest::proptest! {
    /// Over any order of arrival of any subset of 0..n (a lossy, reordering link),
    /// missing = numbers below the highest that never arrived.
    #[test]
    fn missing_is_what_never_arrived_below_the_highest(
        n in 1u64..900,
        keep in proptest::collection::vec(proptest::bool::weighted(0.8), 900),
        order in proptest::collection::vec(0usize..900, 0..900),
        dups in 0usize..50,
    ) {
        let mut sent: Vec<u64> = (0..n).filter(|&s| keep[s as usize]).collect();
        // Reorder within the window (swaps), and redeliver some.
        for (i, &j) in order.iter().enumerate() {
            let len = sent.len();
            if len > 1 { sent.swap(i % len, j % len); }
        }
        let extra: Vec<u64> = sent.iter().take(dups).copied().collect();
        sent.extend(extra);
        let mut w = SeqWindow::default();
        let mut missing = 0i64;
        let mut hi = None;
        for &s in &sent {
            if let Seen::New { missing: m } = w.observe(s) {
                // The first number is the stream's start: nothing before it counts.
                missing += m;
            }
            hi = Some(hi.map_or(s, |h: u64| h.max(s)));
        }
        if let (Some(hi), Some(&first)) = (hi, sent.first()) {
            // Numbers between the first received and the highest that never came.
            let got: BTreeSet<u64> = sent.iter().copied().collect();
            let expect = (first..=hi).filter(|s| !got.contains(s)).count() as i64;
            proptest::prop_assert_eq!(missing, expect);
        }
    }
}

proptest::proptest! {
    /// Devices rebooting after 1..300 readings (counter back to 0, clock going on),
    /// some readings backfilled from long ago, QoS 1 redeliveries of any reading of
    /// the current run: every redelivery is a duplicate, every first delivery is new.
    #[test]
    fn redeliveries_are_duplicates_and_readings_after_a_reboot_are_not(
        runs in proptest::collection::vec(
            (1u64..300, proptest::collection::vec(proptest::num::u16::ANY, 0..40)), 1..6),
        backfills in proptest::collection::vec(1u64..300, 0..6),
        period in 1i64..60_000,
    ) {
        let mut w = SeqWindow::default();
        let mut t = 1_764_480_000_000i64;
        for (n, redeliver) in runs {
            let mut sent = Vec::new();
            for s in 0..n {
                t += period;
                let ts = if backfills.contains(&s) { t - 86_400_000 } else { t };
                proptest::prop_assert_ne!(w.observe_at(s, Some(ts)), Seen::Duplicate, "first delivery of {}", s);
                sent.push((s, ts));
                if let Some(&p) = redeliver.get(s as usize) {
                    let (rs, rts) = sent[p as usize % sent.len()];
                    proptest::prop_assert_eq!(w.observe_at(rs, Some(rts)), Seen::Duplicate, "redelivery of {}", rs);
                }
            }
            // A reboot: the clock goes on.
            t += 5_000;
        }
    }
}

proptest::proptest! {
    #[test]
    fn agrees_with_a_set_inside_the_window(seqs in proptest::collection::vec(0u64..3000, 1..400)) {
        let mut w = SeqWindow::default();
        let mut seen = BTreeSet::new();
        let mut hi: Option<u64> = None;
        for s in seqs {
            let fresh_window = hi.is_some_and(|h| s + SEQ_WINDOW <= h);
            let expect = fresh_window || !seen.contains(&s);
            proptest::prop_assert_eq!(w.check_and_insert(s), expect, "seq {}", s);
            if fresh_window {
                seen.clear();
                hi = Some(s);
            } else {
                hi = Some(hi.map_or(s, |h| h.max(s)));
            }
            seen.insert(s);
            // Forget what fell out of the window.
            let h = hi.unwrap_or(0);
            seen.retain(|x| x + SEQ_WINDOW > h);
        }
    }
}

/// One step of a device's numbering: what real streams do to the filter.
#[derive(Debug, Clone)]
enum Step {
    Next,
    Skip(u64),
    Back(u64),
    Again(u64),
    Reboot(u64),
    Stored,
}

fn step() -> impl proptest::strategy::Strategy<Value = Step> {
    use proptest::prelude::*;
    prop_oneof![
        8 => Just(Step::Next),
        2 => (1u64..3_000).prop_map(Step::Skip),
        2 => (0u64..1_500).prop_map(Step::Back),
        2 => (0u64..40).prop_map(Step::Again),
        1 => (0u64..5).prop_map(Step::Reboot),
        1 => Just(Step::Stored),
    ]
}

fn cbor<T: Serialize>(v: &T) -> Vec<u8> {
    let mut b = Vec::new();
    ciborium::ser::into_writer(v, &mut b).unwrap();
    b
}

proptest::proptest! {
    /// The filter that elides its bitmap answers every number as the plain one
    /// did and stores the same bytes, over streams with gaps, reorderings,
    /// redeliveries, reboots, numbers near both ends of u64, timestamps that go
    /// back or are absent, and restores from either's stored form.
    #[test]
    fn agrees_with_the_plain_bitmap_step_by_step_and_byte_for_byte(
        start in proptest::prop_oneof![0u64..3, 1_000u64..2_000, (u64::MAX - 5_000)..u64::MAX],
        steps in proptest::collection::vec((step(), proptest::option::weighted(0.8, -3_000i64..3_000)), 1..600),
        legacy in proptest::bool::weighted(0.2),
    ) {
        let mut new = SeqWindow::default();
        let mut old = plain::Plain::default();
        let (mut seq, mut t) = (start, 1_700_000_000_000i64);
        for (i, (st, dt)) in steps.into_iter().enumerate() {
            match st {
                Step::Next => seq = seq.saturating_add(1),
                Step::Skip(k) => seq = seq.saturating_add(k + 1),
                Step::Back(k) | Step::Again(k) => seq = seq.saturating_sub(k),
                Step::Reboot(k) => seq = k,
                Step::Stored => {
                    // Restore the new filter from the plain one's bytes (state of a
                    // binary from before), or from its own.
                    let bytes = if legacy { cbor(&old) } else { cbor(&new) };
                    new = ciborium::de::from_reader(bytes.as_slice()).unwrap();
                    continue;
                }
            }
            let ts = dt.map(|d| { t += d; t });
            let (a, b) = (new.observe_at(seq, ts), old.observe_at(seq, ts));
            proptest::prop_assert_eq!(a, b, "step {} seq {}", i, seq);
            proptest::prop_assert_eq!(cbor(&new), cbor(&old), "step {}", i);
            proptest::prop_assert_eq!(
                new.bits.is_some(),
                SeqWindow::in_order(new.hi, new.lo) != Some(new.words()),
                "a bitmap is kept exactly while it is not the in-order one"
            );
        }
    }
}

/// In-order streams keep no bitmap; a gap keeps one until it is filled or
/// slides out of the window, a legacy record until its stream restarts.
#[test]
fn in_order_streams_keep_no_bitmap() {
    for n in [1u64, 2, 63, 64, 65, 1_023, 1_024, 1_025, 5_000] {
        let mut w = SeqWindow::default();
        for s in 0..n {
            assert_eq!(w.observe(s), Seen::New { missing: 0 });
        }
        assert!(w.bits.is_none(), "{n}");
        // A gap of 3 keeps the bitmap; its filling drops it.
        assert_eq!(w.observe(n + 3), Seen::New { missing: 3 });
        assert!(w.bits.is_some());
        for s in n..n + 3 {
            assert_eq!(w.observe(s), Seen::New { missing: -1 });
        }
        assert!(w.bits.is_none(), "{n}: filled");
        // A gap (n + 4) never filled: the bitmap goes once it slides out.
        assert_eq!(w.observe(n + 5), Seen::New { missing: 1 });
        for s in n + 6..n + 4 + SEQ_WINDOW {
            w.observe(s);
            assert!(w.bits.is_some(), "{n}: {s}");
        }
        w.observe(n + 4 + SEQ_WINDOW);
        assert!(w.bits.is_none(), "{n}: slid out");
    }
}
