use super::*;
use proptest::prelude::{Just, Strategy};

/// The plain form the block replaces: aggregates in a list sorted by metric.
fn plain_add(v: &mut Vec<Stats>, m: MetricIdx, t: Millis, x: f64) {
    match v.binary_search_by_key(&m, |s| s.metric) {
        Ok(i) => v[i].add(t, x),
        Err(i) => v.insert(i, Stats::new(m, t, x)),
    }
}

fn plain_merge(v: &mut Vec<Stats>, o: &Stats) {
    match v.binary_search_by_key(&o.metric, |s| s.metric) {
        Ok(i) => v[i].merge(o),
        Err(i) => v.insert(i, *o),
    }
}

fn bits(v: &[Stats]) -> Vec<(u16, u32, [u64; 5], i64, i64)> {
    v.iter()
        .map(|s| {
            let f = [s.sum, s.min, s.max, s.first, s.last].map(f64::to_bits);
            (s.metric, s.count, f, s.first_t, s.last_t)
        })
        .collect()
}

proptest::proptest! {
    /// Readings and merges give the block exactly the aggregates (bit for bit)
    /// the plain list gets; a block rebuilt from its aggregates is the same block.
    #[test]
    fn the_block_holds_what_the_plain_list_holds(
        readings in proptest::collection::vec(
            (0u16..6, proptest::prop_oneof![Just(7i64), -5_000i64..5_000], proptest::prop_oneof![
                Just(0.0f64), Just(-0.0f64), -1e12f64..1e12,
            ]),
            0..40),
        other in proptest::collection::vec(
            (0u16..6, proptest::prop_oneof![Just(7i64), -5_000i64..5_000], -1e6f64..1e6), 0..10),
    ) {
        let (mut b, mut p) = (Metrics::default(), Vec::new());
        for &(m, t, x) in &readings {
            b.add(m, t, x);
            plain_add(&mut p, m, t, x);
            proptest::prop_assert_eq!(bits(&b.iter().collect::<Vec<_>>()), bits(&p));
        }
        let (mut ob, mut op) = (Metrics::default(), Vec::new());
        for &(m, t, x) in &other {
            ob.add(m, t, x);
            plain_add(&mut op, m, t, x);
        }
        for s in ob.iter() {
            b.merge(&s);
        }
        for s in &op {
            plain_merge(&mut p, s);
        }
        proptest::prop_assert_eq!(bits(&b.iter().collect::<Vec<_>>()), bits(&p));
        proptest::prop_assert_eq!(b.len(), p.len());
        let rebuilt: Metrics = b.iter().collect();
        proptest::prop_assert_eq!(&rebuilt, &b);
        check_packed(&b, &p)?;
    }

    /// Readings that carry several metrics each (as a device's do): the packed form
    /// of a fired window gives back the same aggregates and the same block.
    #[test]
    fn a_packed_block_gives_back_the_block(
        rows in proptest::collection::vec(
            (proptest::prop_oneof![Just(7i64), -5_000i64..5_000],
             proptest::collection::vec(-1e6f64..1e6, 1..5),
             proptest::prop_oneof![Just(None), (0u16..6).prop_map(Some)]),
            0..12),
    ) {
        let (mut b, mut p) = (Metrics::default(), Vec::new());
        for (t, values, skip) in &rows {
            for (m, &x) in (0u16..).zip(values) {
                if Some(m) != *skip {
                    b.add(m, *t, x);
                    plain_add(&mut p, m, *t, x);
                }
            }
        }
        check_packed(&b, &p)?;
    }
}

fn check_packed(b: &Metrics, p: &[Stats]) -> Result<(), proptest::test_runner::TestCaseError> {
    // Times before the window's start (a session's) are kept whole.
    for base in [-6_000, 0, 7, 6_000] {
        let mut packed = vec![9u8];
        let n = b.packed_into(base, Some(&mut packed));
        proptest::prop_assert_eq!(n, packed.len() - 1);
        proptest::prop_assert_eq!(n, b.packed_into(base, None));
        proptest::prop_assert!(n <= b.bytes());
        let back: Vec<Stats> = stats_in(&packed[1..], base).collect();
        proptest::prop_assert_eq!(bits(&back), bits(p));
        let back = Metrics::from_bytes(&packed[1..], base);
        proptest::prop_assert_eq!(back.as_bytes(), b.as_bytes());
    }
    Ok(())
}

#[test]
fn a_fired_window_of_two_metrics_packs_them_in_46_and_43_bytes() {
    let mut b = Metrics::default();
    for (t, x) in [(10, 21.5), (20, 22.0), (30, 21.0)] {
        b.add(0, t, x);
        b.add(1, t, x * 2.0);
    }
    assert_eq!(b.bytes(), 2 * FULL);
    let mut packed = Vec::new();
    // Count 3, first 10 ms after the start, last 20 ms after the first: a byte each.
    assert_eq!(b.packed_into(0, Some(&mut packed)), LIKE + 3 + LIKE);
    assert_eq!(LIKE, 43);
    assert_eq!(Metrics::from_bytes(&packed, 0), b);
    // A metric missing from one reading has its own count.
    b.add(0, 40, 20.0);
    assert_eq!(b.packed_into(0, None), 2 * (LIKE + 3));
    // A time before the start: kept whole.
    assert_eq!(b.packed_into(11, None), 2 * FULL);
}

#[test]
fn one_reading_a_metric_takes_19_bytes_and_a_second_the_whole_aggregate() {
    let mut b = Metrics::default();
    b.add(3, 10, 1.5);
    assert_eq!((b.bytes(), b.inline()), (ONE, true), "no allocation");
    b.add(1, 20, -2.0);
    assert_eq!((b.bytes(), b.inline()), (2 * ONE, false), "two times");
    b.add(3, 5, 4.0);
    assert_eq!(b.bytes(), ONE + FULL);
    let rebuilt: Metrics = b.iter().collect();
    assert_eq!(rebuilt, b);
    // The metrics of one reading share its time: 19 + 11 bytes, inline.
    let mut r = Metrics::default();
    r.add(4, 7, 21.5);
    r.add(2, 7, 58.5);
    assert_eq!((r.bytes(), r.inline()), (ONE + SAME, true));
    let s: Vec<Stats> = r.iter().collect();
    assert_eq!(s, [Stats::new(2, 7, 58.5), Stats::new(4, 7, 21.5)]);
    // A second reading of the first metric: the second keeps its time.
    r.add(2, 9, 1.0);
    assert_eq!(r.bytes(), FULL + ONE);
    assert_eq!(r.iter().nth(1), Some(Stats::new(4, 7, 21.5)));
    r.add(9, 7, 0.5);
    assert_eq!(r.bytes(), FULL + ONE + SAME);
    let s: Vec<Stats> = b.iter().collect();
    assert_eq!(s.iter().map(|s| s.metric).collect::<Vec<_>>(), [1, 3]);
    assert_eq!(
        (s[1].count, s[1].first, s[1].last, s[1].sum),
        (2, 4.0, 1.5, 5.5)
    );
    assert_eq!(s[1].delta(), (-2.5, 5));
}

#[test]
fn an_aggregate_of_one_reading_that_is_not_one_readings_is_kept_whole() {
    // A record from elsewhere: count 1 whose fields disagree.
    let mut odd = Stats::new(0, 10, 1.0);
    odd.max = 7.0;
    let b: Metrics = [odd].into_iter().collect();
    assert_eq!(b.bytes(), FULL);
    assert_eq!(b.iter().next(), Some(odd));
}
