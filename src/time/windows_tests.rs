use super::*;
use crate::time::extras::Extras;
use crate::time::window::Span;
use proptest::prelude::{Just, Strategy};

#[derive(Debug, Clone)]
enum Op {
    /// An event at `t` behind the latest one; a heartbeat without metrics.
    Event(Millis, bool, Vec<(u16, f64)>),
    /// The watermark moves on by this much; what it passed is emitted and purged.
    Advance(Millis),
}

fn ops() -> impl proptest::strategy::Strategy<Value = Vec<Op>> {
    let event = (
        0i64..40_000,
        proptest::bool::weighted(0.1),
        proptest::collection::vec(
            (0u16..4, proptest::prop_oneof![Just(1.5f64), -1e6f64..1e6]),
            0..3,
        ),
    )
        .prop_map(|(t, hb, m)| Op::Event(t, hb, m));
    let advance = (0i64..15_000).prop_map(Op::Advance);
    proptest::collection::vec(proptest::prop_oneof![3 => event, 1 => advance], 1..80)
}

fn spec() -> impl proptest::strategy::Strategy<Value = WindowSpec> {
    proptest::prop_oneof![
        (1i64..12_000).prop_map(|size_ms| WindowSpec::Tumbling { size_ms }),
        (1i64..6, 1i64..4_000).prop_map(|(k, slide_ms)| WindowSpec::Hopping {
            size_ms: k * slide_ms,
            slide_ms
        }),
        (1i64..8_000).prop_map(|gap_ms| WindowSpec::Session { gap_ms }),
    ]
}

/// What `Engine::emit_windows` does to the windows ending at or before `upto`.
fn emit(ws: &mut [Window], upto: Millis) -> bool {
    let mut any = false;
    for w in ws.iter_mut().filter(|w| w.dirty && upto >= w.end) {
        let revision = w.emitted().map_or(0, |r| r + 1);
        w.set_emitted(Some(revision));
        w.dirty = false;
        any = true;
    }
    any
}

fn cbor<T: Serialize>(x: &T) -> Vec<u8> {
    let mut b = Vec::new();
    ciborium::into_writer(x, &mut b).unwrap();
    b
}

/// The reference: the plain list of windows.
fn deadline(ws: &[Window], lateness: Millis) -> Option<Millis> {
    ws.iter()
        .map(|w| {
            let purge = w.end.saturating_add(lateness);
            if w.dirty { w.end.min(purge) } else { purge }
        })
        .min()
}

proptest::proptest! {
    /// Events, emissions and purges give the packed windows exactly the plain
    /// list's windows (fields, aggregates, stored bytes, deadline, first start),
    /// whatever the window shape; a record stored by either restores to both.
    #[test]
    fn packed_windows_hold_what_the_plain_list_holds(
        spec in spec(),
        lateness in proptest::prop_oneof![Just(0i64), 0i64..30_000],
        extras in proptest::bool::weighted(0.2),
        room in 0usize..5,
        ops in ops(),
    ) {
        let extras = if extras {
            Extras::of(&["stddev".into()], 0.01)
        } else {
            Extras::default()
        };
        let rule = Rule { spec, span: Span::ALL, lateness, fresh: None, extras };
        let mut plain: Vec<Window> = Vec::new();
        let mut packed = Windows::default();
        let (mut latest, mut wm) = (0i64, None::<Millis>);
        for op in ops {
            match op {
                Op::Event(back, hb, metrics) => {
                    let t = latest - back;
                    latest = latest.max(t);
                    let a = apply(&mut plain, rule, t, wm, hb, &metrics);
                    let b = packed.apply(rule, t, wm, hb, &metrics);
                    proptest::prop_assert_eq!(a, b);
                }
                Op::Advance(by) => {
                    let w = wm.unwrap_or(0) + by;
                    wm = Some(w);
                    emit(&mut plain, w);
                    if emit(packed.open_mut(), w) {
                        packed.pack_fired(room);
                    }
                    plain.retain(|x| w < x.end + lateness);
                    packed.retain(|_, end| w < end + lateness);
                }
            }
            let got: Vec<Window> = packed.iter().map(std::borrow::Cow::into_owned).collect();
            proptest::prop_assert_eq!(&got, &plain);
            proptest::prop_assert_eq!(packed.len(), plain.len());
            proptest::prop_assert_eq!(packed.deadline(lateness), deadline(&plain, lateness));
            proptest::prop_assert_eq!(packed.first_start(), plain.first().map(|w| w.start));
            proptest::prop_assert_eq!(cbor(&packed), cbor(&plain));
        }
        let restored: Windows = ciborium::from_reader(&cbor(&plain)[..]).unwrap();
        proptest::prop_assert_eq!(&restored, &packed);
        let back: Vec<Window> = ciborium::from_reader(&cbor(&restored)[..]).unwrap();
        proptest::prop_assert_eq!(&back, &plain);
    }
}

/// A window fired and kept for lateness costs its aggregates' bytes and a
/// short header, not a window and a heap block (BENCHMARKS 4b).
#[test]
fn fired_windows_are_packed_and_a_late_reading_unpacks_one() {
    let rule = Rule {
        spec: WindowSpec::Tumbling { size_ms: 10_000 },
        span: Span::ALL,
        lateness: 30_000,
        fresh: None,
        extras: Extras::default(),
    };
    let mut ws = Windows::default();
    for i in 0..40 {
        let t = i * 1_000;
        ws.apply(
            rule,
            t,
            Some(t - 1_000),
            false,
            &[(0, 20.0 + f64::from(i as u32)), (1, 1.0)],
        );
    }
    assert!(emit(ws.open_mut(), 30_000));
    ws.pack_fired(3);
    assert_eq!((ws.open.len(), ws.len()), (1, 4));
    // Three windows of ten readings of two metrics: 47 + 43 bytes of aggregates (the
    // first's count and times as varints after its values, the second sharing them),
    // a header of 16 bytes each and the smallest end.
    assert_eq!(ws.fired.0.len(), 8 + 3 * (90 + 16));
    assert!(ws.apply(rule, 15_000, Some(35_000), false, &[(0, 1.0)]));
    assert_eq!((ws.open.len(), ws.len()), (2, 4));
    let w = ws.iter().find(|w| w.start == 10_000).unwrap();
    assert_eq!((w.count, w.dirty, w.emitted()), (11, true, Some(0)));
}

/// A stored list whose length claims more windows than it holds (a damaged
/// record) is an error, not an allocation of the claimed room.
#[test]
fn a_stored_list_claiming_more_windows_than_it_holds_is_an_error() {
    let mut w = Window::new(0, 10_000);
    w.add(5, false, &[(0, 1.0), (1, 2.0)]);
    w.set_emitted(Some(0));
    w.dirty = false;
    let one = cbor(&vec![w]);
    // An array of 2^40 elements (major type 4, 8-byte length) holding that one window.
    let mut b = vec![0x9b];
    b.extend_from_slice(&(1u64 << 40).to_be_bytes());
    b.extend_from_slice(&one[1..]);
    assert!(ciborium::from_reader::<Windows, _>(&b[..]).is_err());
    let ok: Windows = ciborium::from_reader(&one[..]).unwrap();
    // The smallest end, start 8, four one-byte varints, end 2 bytes, length 1, block 30.
    assert_eq!((ok.len(), ok.fired.0.len()), (1, 8 + 8 + 2 + 4 + 1 + 30));
}
