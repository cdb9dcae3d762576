use super::*;

const T0: i64 = 1_764_480_000_000;

#[test]
fn persisted_form_keeps_every_bucket_and_absent_samples() {
    let mut e = SkewEstimator::default();
    for i in 0..40 {
        e.observe(T0 + i * 700, T0 + i * 700 - 50 - (i % 3) * 10, 32);
    }
    // Held out: a step candidate leaves its second's bucket without a sample.
    e.observe(T0 + 40 * 700, T0 + 40 * 700 - 600_000, 32);
    assert!(e.buckets.iter().any(|b| b.min().is_none()));
    let mut buf = Vec::new();
    ciborium::ser::into_writer(&e, &mut buf).unwrap();
    let back: SkewEstimator = ciborium::de::from_reader(&buf[..]).unwrap();
    assert_eq!(back, e);
    assert!(
        buf.len() < 400,
        "packed: {} bytes for {} buckets",
        buf.len(),
        e.buckets.len()
    );
}

#[test]
fn state_written_with_one_map_per_bucket_still_reads() {
    // The form before the packed one; its first bucket from before `hi` existed.
    let old = serde_json::json!({
        "buckets": [
            { "sec": 7, "min": 40 },
            { "sec": 8, "min": null, "hi": null },
            { "sec": 9, "min": 35, "hi": 90 },
        ],
        "est": 35,
        "hi": 90,
    });
    let mut buf = Vec::new();
    ciborium::ser::into_writer(&old, &mut buf).unwrap();
    let e: SkewEstimator = ciborium::de::from_reader(&buf[..]).unwrap();
    let b: Vec<_> = e.buckets.iter().map(|b| (b.min(), b.hi())).collect();
    assert_eq!(b, [(Some(40), None), (None, None), (Some(35), Some(90))]);
    assert_eq!(
        (e.last_second(), e.estimate(), e.jitter()),
        (Some(9), Some(35), 55)
    );
}

#[test]
fn packed_buckets_round_trip_every_value() {
    use proptest::prelude::*;
    let value = prop_oneof![
        Just(NONE),
        Just(NONE + 1),
        Just(Millis::MAX),
        any::<i64>(),
        -100_000i64..100_000
    ];
    proptest!(|(v in proptest::collection::vec((value.clone(), value), 0..=MAX_BUCKETS))| {
        let buckets: Buckets = v.iter().map(|&(min, hi)| Bucket { min, hi }).collect();
        prop_assert_eq!(unpack(&pack(&buckets)), Some(buckets));
    });
    // Truncated or overlong input is refused, not misread.
    let b: Buckets = [Bucket { min: 5, hi: 300 }].into_iter().collect();
    let p = pack(&b);
    assert_eq!(unpack(&p[..p.len() - 1]), None);
    assert_eq!(unpack(&[0xff; 11]), None);
}

/// A device whose clock is `offset` behind the gateway, sending every `every` ms with `delay`.
fn feed(
    e: &mut SkewEstimator,
    from: i64,
    to: i64,
    every: i64,
    offset: i64,
    delay: i64,
) -> Vec<Sample> {
    let mut out = Vec::new();
    let mut t = from;
    while t < to {
        out.push(e.observe(t + delay, t - offset, 32));
        t += every;
    }
    out
}

#[test]
fn estimate_is_the_least_delayed_sample() {
    let mut e = SkewEstimator::default();
    e.observe(T0 + 300, T0 - 180_000, 32);
    e.observe(T0 + 1_050, T0 + 1_000 - 180_000, 32);
    e.observe(T0 + 2_500, T0 + 2_000 - 180_000, 32);
    assert_eq!(e.estimate(), Some(180_050));
}

#[test]
fn backlog_burst_does_not_flush_good_samples_nor_count_as_a_step() {
    let mut e = SkewEstimator::default();
    feed(&mut e, T0, T0 + 60_000, 1_000, 42_000, 20);
    assert_eq!(e.estimate(), Some(42_020));
    // 5 minutes of buffered readings (one per 100 ms) arrive over 6 seconds.
    let burst_start = T0 + 360_000;
    for i in 0..3000i64 {
        let device_t = T0 + 60_000 + i * 100 - 42_000;
        let arrival = burst_start + i * 2;
        let s = e.observe(arrival, device_t, 32);
        assert_ne!(s, Sample::Reset, "burst sample {i} taken for a step");
    }
    assert_eq!(e.estimate(), Some(42_020));
    feed(&mut e, T0 + 366_000, T0 + 380_000, 1_000, 42_000, 15);
    assert_eq!(e.estimate(), Some(42_015));
}

#[test]
fn backward_device_clock_step_is_recovered_within_seconds() {
    let mut e = SkewEstimator::default();
    feed(&mut e, T0, T0 + 60_000, 1_000, 0, 10);
    // Device clock steps back 17 minutes: offsets rise by 17 min.
    let step = 17 * 60_000;
    let samples = feed(&mut e, T0 + 60_000, T0 + 66_000, 500, step, 10);
    let reset_at = samples
        .iter()
        .position(|s| *s == Sample::Reset)
        .expect("step recognised");
    assert!(reset_at * 500 <= 4_000, "took {} ms", reset_at * 500);
    assert_eq!(e.estimate(), Some(step + 10));
}

#[test]
fn step_on_a_link_with_a_second_and_a_half_of_jitter_is_still_recovered() {
    let delay = |k: i64| 10 + ((k + 3) * 7919) % 1_500;
    let mut e = SkewEstimator::default();
    for k in 0..120i64 {
        let t = T0 + k * 500;
        e.observe(t + delay(k), t, 32);
    }
    assert!(e.jitter() > 1_000, "jitter {}", e.jitter());
    let step = 17 * 60_000;
    let mut reset = None;
    for k in 120..160i64 {
        let t = T0 + k * 500;
        if e.observe(t + delay(k), t - step, 32) == Sample::Reset {
            reset = Some(k - 120);
            break;
        }
    }
    assert!(reset.is_some_and(|k| k * 500 <= 5_000), "{reset:?}");
    assert!(
        e.estimate()
            .is_some_and(|o| (step..step + 1_500).contains(&o))
    );
}

#[test]
fn step_whose_jitter_outgrows_the_old_link_is_adopted_over_the_filter_horizon() {
    let mut e = SkewEstimator::default();
    feed(&mut e, T0, T0 + 60_000, 1_000, 0, 10);
    let step = 17 * 60_000;
    let mut reset = None;
    for k in 0..120i64 {
        let t = T0 + 60_000 + k * 500;
        let delay = 10 + ((k + 3) * 7919) % 1_500;
        if e.observe(t + delay, t - step, 32) == Sample::Reset {
            reset = Some(k * 500);
            break;
        }
    }
    // The candidates' minimum settles (within 20 ms) after ~20 s, then the 32 s horizon runs.
    assert!(reset.is_some_and(|ms| ms <= 60_000), "{reset:?}");
    assert!(
        e.estimate()
            .is_some_and(|o| (step..step + 100).contains(&o))
    );
}

#[test]
fn backlog_drained_slightly_faster_than_real_time_is_not_a_step() {
    for send_every in [500i64, 900] {
        let mut e = SkewEstimator::default();
        feed(&mut e, T0, T0 + 60_000, 1_000, 0, 20);
        // Ten minutes buffered (one reading a second), then sent one every `send_every` ms.
        for i in 0..600i64 {
            let s = e.observe(T0 + 660_000 + i * send_every, T0 + 60_000 + i * 1_000, 32);
            assert_ne!(s, Sample::Reset, "every {send_every} ms: sample {i}");
        }
        assert_eq!(e.estimate(), Some(20));
    }
}

#[test]
fn forward_step_needs_confirmation_but_one_wild_sample_is_ignored() {
    let mut e = SkewEstimator::default();
    feed(&mut e, T0, T0 + 30_000, 1_000, 0, 10);
    assert_eq!(
        e.observe(T0 + 30_000, T0 + 30_000 + 3_600_000, 32),
        Sample::Divergent
    );
    feed(&mut e, T0 + 31_000, T0 + 40_000, 1_000, 0, 10);
    assert_eq!(e.estimate(), Some(10));
    // A real forward step of 17 minutes persists and is taken.
    let samples = feed(&mut e, T0 + 40_000, T0 + 50_000, 1_000, -17 * 60_000, 10);
    assert!(samples.contains(&Sample::Reset));
    assert_eq!(e.estimate(), Some(-17 * 60_000 + 10));
}

#[test]
fn young_estimator_follows_lower_samples_at_once() {
    let mut e = SkewEstimator::default();
    e.observe(T0, T0 - 90_000, 32); // first sample came out of a queue, 90 s late
    assert_eq!(e.observe(T0 + 10, T0, 32), Sample::Taken);
    assert_eq!(e.estimate(), Some(10));
}

#[test]
fn a_rebased_estimator_continues_across_a_gateway_step_without_a_candidate() {
    for delta in [-3 * 3_600_000, -600_000, 600_000, 86_400_000] {
        let mut e = SkewEstimator::default();
        feed(&mut e, T0, T0 + 40_000, 500, 0, 20);
        e.rebase(delta);
        assert_eq!(e.estimate(), Some(20 + delta));
        // Samples on the stepped clock are ordinary ones, and buckets keep aging.
        for k in 0..80i64 {
            let t = T0 + 40_000 + k * 500;
            assert_eq!(e.observe(t + 20 + delta, t, 32), Sample::Taken, "{delta}");
        }
        assert_eq!(e.estimate(), Some(20 + delta));
        assert!(e.buckets.len() <= 32);
    }
}

#[test]
fn old_buckets_age_out_so_drift_is_followed() {
    let mut e = SkewEstimator::default();
    feed(&mut e, T0, T0 + 40_000, 1_000, 0, 5);
    feed(&mut e, T0 + 40_000, T0 + 80_000, 1_000, 800, 5);
    assert_eq!(e.estimate(), Some(805));
}
