use super::*;

fn build_decoder(format: PayloadFormat, unit: TimestampUnit) -> Decoder {
    Decoder::new(&PayloadConfig {
        format,
        timestamp_field: "ts".into(),
        timestamp_unit: unit,
        seq_field: Some("seq".into()),
    })
}

fn cbor(v: &serde_json::Value) -> Vec<u8> {
    let mut out = Vec::new();
    ciborium::ser::into_writer(v, &mut out).unwrap();
    out
}

fn ts_of(d: &Decoder, payload: &[u8]) -> DeviceTs {
    d.decode(payload).unwrap().ts
}

#[test]
fn json_reading_yields_timestamp_seq_and_numeric_metrics_only() {
    let d = build_decoder(PayloadFormat::Auto, TimestampUnit::Auto);
    let p = d
        .decode(br#"{"ts": 1764480000123, "seq": 17, "temp": 21.5, "hum": 40, "ok": true, "name": "x", "nested": {"a": 1}, "arr": [1,2]}"#)
        .unwrap();
    assert_eq!(p.ts, DeviceTs::Ms(1_764_480_000_123));
    assert_eq!(p.seq, Some(17));
    let names: Vec<(&str, f64)> = p.metrics.iter().map(|(n, v)| (n.as_str(), *v)).collect();
    assert_eq!(names, vec![("temp", 21.5), ("hum", 40.0)]);
}

#[test]
fn cbor_reading_decodes_like_json_in_auto_and_cbor_modes() {
    let v = serde_json::json!({"ts": 1_764_480_000_123_i64, "seq": 3, "temp": -4.25});
    for f in [PayloadFormat::Auto, PayloadFormat::Cbor] {
        let d = build_decoder(f, TimestampUnit::Auto);
        let p = d.decode(&cbor(&v)).unwrap();
        assert_eq!(p.ts, DeviceTs::Ms(1_764_480_000_123));
        assert_eq!(p.seq, Some(3));
        assert_eq!(p.metrics[0].1, -4.25);
    }
    let json = build_decoder(PayloadFormat::Json, TimestampUnit::Auto);
    assert!(
        json.decode(&cbor(&v)).is_err(),
        "json mode must not accept CBOR"
    );
    let only_cbor = build_decoder(PayloadFormat::Cbor, TimestampUnit::Auto);
    assert!(
        only_cbor.decode(br#"{"ts":1}"#).is_err(),
        "cbor mode must not accept JSON"
    );
}

#[test]
fn auto_unit_is_chosen_by_magnitude() {
    let d = build_decoder(PayloadFormat::Json, TimestampUnit::Auto);
    assert_eq!(
        ts_of(&d, br#"{"ts": 1764480000}"#),
        DeviceTs::Ms(1_764_480_000_000)
    );
    assert_eq!(
        ts_of(&d, br#"{"ts": 1764480000.123}"#),
        DeviceTs::Ms(1_764_480_000_123)
    );
    assert_eq!(
        ts_of(&d, br#"{"ts": 1764480000123}"#),
        DeviceTs::Ms(1_764_480_000_123)
    );
    assert_eq!(
        ts_of(&d, br#"{"ts": 1764480000123456}"#),
        DeviceTs::Ms(1_764_480_000_123)
    );
    assert_eq!(
        ts_of(&d, br#"{"ts": 1764480000123456789}"#),
        DeviceTs::Ms(1_764_480_000_123)
    );
    assert_eq!(
        ts_of(&d, br#"{"ts": 1.764480000123e12}"#),
        DeviceTs::Ms(1_764_480_000_123)
    );
}

#[test]
fn explicit_units_are_obeyed() {
    let cases = [
        (TimestampUnit::S, "1764480000", 1_764_480_000_000),
        (TimestampUnit::S, "1.5", 1_500),
        (TimestampUnit::Ms, "1764480000", 1_764_480_000),
        (TimestampUnit::Us, "1764480000123456", 1_764_480_000_123),
        (TimestampUnit::Ns, "1764480000123456789", 1_764_480_000_123),
    ];
    for (unit, ts, want) in cases {
        let d = build_decoder(PayloadFormat::Json, unit);
        let body = format!(r#"{{"ts": {ts}}}"#);
        assert_eq!(
            ts_of(&d, body.as_bytes()),
            DeviceTs::Ms(want),
            "{unit:?} {ts}"
        );
    }
}

#[test]
fn rfc3339_strings_with_z_and_offsets_parse() {
    let d = build_decoder(PayloadFormat::Json, TimestampUnit::Auto);
    let want = DeviceTs::Ms(1_764_480_000_123);
    assert_eq!(ts_of(&d, br#"{"ts": "2025-11-30T05:20:00.123Z"}"#), want);
    assert_eq!(
        ts_of(&d, br#"{"ts": "2025-11-30T07:20:00.123+02:00"}"#),
        want
    );
    assert_eq!(
        ts_of(&d, br#"{"ts": "2025-11-29T23:50:00.123-05:30"}"#),
        want
    );
    assert_eq!(
        ts_of(&d, br#"{"ts": "2025-11-30T05:20:00.123456789z"}"#),
        want
    );
    assert_eq!(
        ts_of(&d, br#"{"ts": "2025-11-30T05:20:00Z"}"#),
        DeviceTs::Ms(1_764_480_000_000)
    );
    assert_eq!(
        parse_rfc3339("2024-02-29T00:00:00Z"),
        Some(1_709_164_800_000)
    );
    assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), Some(0));
    for bad in [
        "2025-13-01T00:00:00Z",
        "2025-02-30T00:00:00Z",
        "2025-11-30T24:00:00Z",
        "2025-11-30T05:20:00",
        "2025-11-30T05:20:00.Z",
        "2025-11-30T05:20:00+0200",
        "yesterday at noon",
        "",
    ] {
        assert_eq!(parse_rfc3339(bad), None, "{bad}");
    }
}

#[test]
fn unusable_timestamps_are_invalid_not_errors() {
    let d = build_decoder(PayloadFormat::Json, TimestampUnit::Auto);
    assert_eq!(ts_of(&d, br#"{"temp": 1}"#), DeviceTs::Missing);
    for body in [
        &br#"{"ts": "soon"}"#[..],
        br#"{"ts": 0}"#,
        br#"{"ts": -5}"#,
        br#"{"ts": null}"#,
        br#"{"ts": true}"#,
        br#"{"ts": [1]}"#,
        br#"{"ts": 1e300}"#,
    ] {
        assert!(
            matches!(ts_of(&d, body), DeviceTs::Invalid(_)),
            "{}",
            String::from_utf8_lossy(body)
        );
    }
    // {"ts": NaN} as CBOR (JSON cannot express it).
    let mut nan_map = vec![0xa1, 0x62, b't', b's', 0xfb];
    nan_map.extend_from_slice(&f64::NAN.to_be_bytes());
    let auto = build_decoder(PayloadFormat::Auto, TimestampUnit::Auto);
    assert!(matches!(ts_of(&auto, &nan_map), DeviceTs::Invalid(_)));
}

#[test]
fn non_objects_and_garbage_are_decode_errors() {
    let d = build_decoder(PayloadFormat::Auto, TimestampUnit::Auto);
    let deep = format!("{{\"a\":{}1{}}}", "[".repeat(500), "]".repeat(500));
    let too_many: String = (0..40)
        .map(|i| format!("\"m{i}\":{i}"))
        .collect::<Vec<_>>()
        .join(",");
    let long_name = format!("{{\"{}\":1}}", "n".repeat(65));
    for body in [
        &b"[1,2]"[..],
        b"42",
        b"\"str\"",
        b"",
        b"{\"ts\": 17",
        b"{\"ts\": 1} trailing",
        b"\xff\xfe",
        deep.as_bytes(),
        format!("{{{too_many}}}").as_bytes(),
        long_name.as_bytes(),
        &[0xa1, 0x61, b'x'],
        &[0xa1, 0x61, b'x', 0x01, 0x00],
    ] {
        assert!(
            d.decode(body).is_err(),
            "{:?}",
            String::from_utf8_lossy(body)
        );
    }
    let big = vec![b' '; MAX_PAYLOAD + 1];
    assert!(d.decode(&big).unwrap_err().0.contains("64 KiB"));
}

#[test]
fn seq_that_is_not_a_non_negative_integer_is_ignored() {
    let d = build_decoder(PayloadFormat::Json, TimestampUnit::Auto);
    assert_eq!(
        d.decode(br#"{"ts":1764480000000,"seq":-1}"#).unwrap().seq,
        None
    );
    assert_eq!(
        d.decode(br#"{"ts":1764480000000,"seq":"7"}"#).unwrap().seq,
        None
    );
    assert_eq!(
        d.decode(br#"{"ts":1764480000000,"seq":1.5}"#).unwrap().seq,
        None
    );
    assert_eq!(
        d.decode(br#"{"ts":1764480000000,"seq":0}"#).unwrap().seq,
        Some(0)
    );
}

#[test]
fn cbor_indefinite_lengths_tags_and_nesting_are_handled() {
    let d = build_decoder(PayloadFormat::Auto, TimestampUnit::Auto);
    // {_ "ts": 1(1764480000), "t": [_ 1, {"x": h'00'}], "s": (_ "a" "b"), "v": 1.5f16 }
    let mut b = vec![0xbf, 0x62, b't', b's', 0xc1, 0x1a];
    b.extend_from_slice(&1_764_480_000u32.to_be_bytes());
    b.extend_from_slice(&[0x61, b't', 0x9f, 0x01, 0xa1, 0x61, b'x', 0x41, 0x00, 0xff]);
    b.extend_from_slice(&[0x61, b's', 0x7f, 0x61, b'a', 0x61, b'b', 0xff]);
    b.extend_from_slice(&[0x61, b'v', 0xf9, 0x3e, 0x00, 0xff]);
    let p = d.decode(&b).unwrap();
    assert_eq!(p.ts, DeviceTs::Ms(1_764_480_000_000));
    assert_eq!(p.metrics.len(), 1);
    assert_eq!((p.metrics[0].0.as_str(), p.metrics[0].1), ("v", 1.5));
    // A map claiming more entries than bytes exist is truncated, not a huge loop.
    assert!(
        d.decode(&[0xbb, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff])
            .is_err()
    );
    // Deep nesting is garbage.
    let mut deep = vec![0xa1, 0x61, b'a'];
    deep.extend(std::iter::repeat_n(0x81, 100));
    deep.push(0x01);
    assert!(d.decode(&deep).unwrap_err().0.contains("nested"));
}

fn json_value() -> impl proptest::strategy::Strategy<Value = serde_json::Value> {
    use proptest::prelude::*;
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        any::<u64>().prop_map(serde_json::Value::from),
        (-1e12f64..1e12).prop_map(serde_json::Value::from),
        "[a-z0-9:.TZ+-]{0,30}".prop_map(serde_json::Value::from),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
            proptest::collection::btree_map("[a-z]{1,3}", inner, 0..4)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest::proptest! {
    /// The CBOR reader and the JSON visitor agree on every object.
    #[test]
    fn cbor_and_json_encodings_decode_alike(
        fields in proptest::collection::btree_map("[a-z]{1,4}|ts|seq", json_value(), 0..12)
    ) {
        let obj = serde_json::Value::Object(fields.into_iter().collect());
        let d = build_decoder(PayloadFormat::Auto, TimestampUnit::Auto);
        let from_json = d.decode(&serde_json::to_vec(&obj).unwrap());
        let from_cbor = d.decode(&cbor(&obj));
        proptest::prop_assert_eq!(from_json.is_ok(), from_cbor.is_ok());
        if let (Ok(a), Ok(b)) = (from_json, from_cbor) {
            proptest::prop_assert_eq!(a, b);
        }
    }
}

proptest::proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
        for f in [PayloadFormat::Auto, PayloadFormat::Json, PayloadFormat::Cbor] {
            let _ = build_decoder(f, TimestampUnit::Auto).decode(&bytes);
        }
    }

    #[test]
    fn arbitrary_cbor_maps_never_panic(prefix in 0xa0u8..=0xbf, rest in proptest::collection::vec(proptest::num::u8::ANY, 0..256)) {
        let mut bytes = vec![prefix];
        bytes.extend(rest);
        let _ = build_decoder(PayloadFormat::Auto, TimestampUnit::Auto).decode(&bytes);
    }

    #[test]
    fn arbitrary_timestamp_strings_never_panic(s in "\\PC{0,40}") {
        let _ = parse_rfc3339(&s);
    }
}

/// A JSON object of the shapes devices send and of the ones the one pass leaves
/// to serde (nesting, escapes, odd numbers, blanks, long names, bad endings).
fn payload_text() -> impl proptest::strategy::Strategy<Value = String> {
    use proptest::prelude::{Just, Strategy, prop_oneof};
    let name = prop_oneof![
        Just("ts".to_owned()),
        Just("seq".to_owned()),
        Just("temp".to_owned()),
        Just("h\\u0041".to_owned()),
        Just("ü".to_owned()),
        "[a-z]{1,3}",
        "[a-z]{60,70}",
        Just("k".repeat(64)),
        Just("k".repeat(65)),
    ];
    let value = prop_oneof![
        (-1e6f64..1e6).prop_map(|f| f.to_string()),
        proptest::num::i64::ANY.prop_map(|i| i.to_string()),
        proptest::num::u64::ANY.prop_map(|i| format!("{i}0")),
        (-99_999i64..99_999, 0u32..4, -30i32..30)
            .prop_map(|(m, z, e)| format!("{m}.{}5e{e}", "0".repeat(z as usize))),
        prop_oneof![
            Just("-0"),
            Just("-0.0"),
            Just("01"),
            Just("1."),
            Just("1e"),
            Just("1E+2"),
            Just("true"),
            Just("false"),
            Just("null"),
            Just("nul"),
            Just("\"2024-05-01T10:00:00Z\""),
            Just("\"a\\\"b\""),
            Just("{\"x\":[1,{\"y\":2}]}"),
            Just("[]"),
            Just("1e400"),
            Just("NaN"),
            Just("\"\u{1}\""),
            Just("123456789012345678901234"),
            Just("0.1234567890123456789"),
        ]
        .prop_map(str::to_owned),
        "\"[ -~]{0,60}\"",
    ];
    let sep = prop_oneof![Just(""), Just(" "), Just("\n\t")];
    // Few fields (one odd field decides) and many (past the 32-metric limit).
    let field = (name, value, sep.clone());
    (
        prop_oneof![
            proptest::collection::vec(field.clone(), 0..4),
            proptest::collection::vec(field, 0..40)
        ],
        sep,
        prop_oneof![Just(""), Just(" "), Just(","), Just("}"), Just(" x")],
    )
        .prop_map(|(fields, pad, tail)| {
            let body: Vec<String> = fields
                .iter()
                .map(|(k, v, s)| format!("{s}\"{k}\"{s}:{s}{v}{s}"))
                .collect();
            format!("{pad}{{{}}}{tail}", body.join(","))
        })
}

proptest::proptest! {
    /// The one pass and serde file the same fields, bit for bit, and where the one
    /// pass declines serde gives the error: a payload decodes as it always did.
    #[test]
    fn the_one_pass_decodes_every_payload_as_serde_does(text in payload_text(), seq in proptest::bool::ANY) {
        let d = Decoder::new(&PayloadConfig {
            format: PayloadFormat::Auto,
            timestamp_field: "ts".into(),
            timestamp_unit: TimestampUnit::Auto,
            seq_field: seq.then(|| "seq".to_owned()),
        });
        let (mut a, mut b) = (Decoded::default(), Decoded::default());
        let fast = d.decode_into(text.as_bytes(), &mut a);
        let slow = d.decode_serde(text.as_bytes(), &mut b);
        proptest::prop_assert_eq!(&fast, &slow, "{}", text);
        if fast.is_ok() {
            proptest::prop_assert_eq!(format!("{a:?}"), format!("{b:?}"), "{}", text);
        }
        let mut c = Decoded::default();
        if let Some(n) = d.decode_json_prefix(&text, &mut c) {
            let mut e = Decoded::default();
            proptest::prop_assert!(d.decode_serde(&text.as_bytes()[..n], &mut e).is_ok());
            proptest::prop_assert_eq!(format!("{c:?}"), format!("{e:?}"), "{}", text);
        }
    }
}

/// A field name over 64 bytes is refused whatever its value (serde's key check),
/// on the one pass too.
#[test]
fn a_field_name_over_64_bytes_is_refused_whatever_its_value() {
    let d = build_decoder(PayloadFormat::Json, TimestampUnit::Ms);
    for (len, ok) in [(64, true), (65, false)] {
        for v in ["\"x\"", "true", "null", "1.5"] {
            let text = format!("{{\"ts\":1,\"{}\":{v}}}", "k".repeat(len));
            let got = d.decode(text.as_bytes());
            assert_eq!(got.is_ok(), ok, "{text}: {got:?}");
            let mut b = Decoded::default();
            assert_eq!(
                got.map(|_| ()),
                d.decode_serde(text.as_bytes(), &mut b),
                "{text}"
            );
        }
    }
}

proptest::proptest! {
    /// A payload that is not UTF-8 gets serde's verdict whichever byte breaks it.
    #[test]
    fn a_payload_that_is_not_utf8_decodes_as_serde_has_it(text in payload_text(), at in 0usize..200, bad in 0x80u8..=0xff) {
        let d = Decoder::new(&PayloadConfig {
            format: PayloadFormat::Json,
            timestamp_field: "ts".into(),
            timestamp_unit: TimestampUnit::Auto,
            seq_field: None,
        });
        let mut bytes = text.into_bytes();
        bytes.insert(at.min(bytes.len()), bad);
        let (mut a, mut b) = (Decoded::default(), Decoded::default());
        let fast = d.decode_into(&bytes, &mut a);
        proptest::prop_assert_eq!(&fast, &d.decode_serde(&bytes, &mut b));
        if fast.is_ok() {
            proptest::prop_assert_eq!(format!("{a:?}"), format!("{b:?}"));
        }
    }
}

proptest::proptest! {
    /// Integers to f64 by halves are what `as` gives, either side of 2^53 and of zero.
    #[test]
    fn integers_convert_as_as_converts_them(
        i in proptest::prop_oneof![
            proptest::prelude::Strategy::prop_map(proptest::prelude::any::<i64>(), i128::from),
            -(1i128 << 54)..(1i128 << 54),
            -70_000i128..70_000,
            proptest::prelude::any::<i128>(),
        ],
    ) {
        proptest::prop_assert_eq!(super::int_to_f64(i).to_bits(), (i as f64).to_bits());
    }
}
