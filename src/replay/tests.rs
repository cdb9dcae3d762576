use super::*;

/// The engine fed one record at a time on one thread, outputs rendered as
/// the pipeline renders them: what [`run_memory_with`] must equal.
fn sequential(cfg: &Config, capture: &str, flush: bool) -> Vec<u8> {
    let mut rp = Driver::json(cfg);
    let mut input = Input {
        r: capture.as_bytes(),
        line: String::new(),
        offset: 0,
        line_no: 0,
        mono: VirtualMono::default(),
    };
    let (tx, rx) = std::sync::mpsc::channel();
    let (mut topic, mut payload, mut last) = (String::new(), Vec::new(), None::<Now>);
    loop {
        topic.clear();
        payload.clear();
        let Some(now) = input.next_into(&mut topic, &mut payload).unwrap() else {
            break;
        };
        rp.message(now, &topic, &payload);
        rp.engine_mut().take_commands();
        last = Some(last.map_or(now, |l| Now {
            wall: l.wall.max(now.wall),
            mono: l.mono.max(now.mono),
            synced: now.synced,
        }));
        tx.send((rp.take_outputs(), Vec::new())).unwrap();
    }
    if let Some(last) = last {
        rp.ticks_until(Now {
            wall: last.wall + 120_000,
            mono: last.mono + 120_000,
            synced: last.synced,
        });
        if flush {
            rp.flush();
        }
        tx.send((rp.take_outputs(), Vec::new())).unwrap();
    }
    drop(tx);
    let mut out = Vec::new();
    write_outputs(&cfg.sink.prefix, &rx, &mut out).unwrap();
    out
}

/// A payload of one of the shapes the capture mixes: garbage, bad CBOR, a bad
/// timestamp, an overflowing value, CBOR, JSON.
fn payload(kind: u64, ts: Millis, seq: u64, dev: u64, rnd: &mut impl FnMut(u64) -> u64) -> Vec<u8> {
    match kind {
        0 => b"not json".to_vec(),
        1 => vec![0xa2, 0x62, b't', b's', 0x1b],
        2 => format!(r#"{{"ts":"bad","seq":{seq},"t":1}}"#).into_bytes(),
        3 => format!(r#"{{"ts":{ts},"seq":{seq},"t":1e999}}"#).into_bytes(),
        4 => {
            let mut c = vec![0xa3, 0x62, b't', b's', 0x1b];
            c.extend_from_slice(&ts.to_be_bytes());
            c.extend_from_slice(&[0x63, b's', b'e', b'q', 0x1b]);
            c.extend_from_slice(&seq.to_be_bytes());
            c.extend_from_slice(&[0x61, b'h', 0xfb]);
            c.extend_from_slice(&(f64::from(u32::try_from(dev).unwrap()) / 3.0).to_be_bytes());
            c
        }
        _ => format!(
            r#"{{"ts":{ts},"seq":{seq},"temp":{}.{},"hum":{}}}"#,
            rnd(40),
            rnd(100),
            rnd(100)
        )
        .into_bytes(),
    }
}

#[test]
fn read_ahead_decoding_and_the_writer_thread_change_no_output_byte() {
    let cfg = crate::config::load_str(
        "[gateway]\nid = \"gw\"\ntick_interval_ms = 100\n\
         [sparkplug]\nenabled = true\n\
         [payload]\nseq_field = \"seq\"\n\
         [group_defaults]\nout_of_orderness_ms = 1000\nidle_timeout_ms = 5000\n\
         heartbeat_timeout_ms = 8000\nallowed_lateness_ms = 2000\n\
         window = { kind = \"tumbling\", size_ms = 2000 }\n",
        &Default::default(),
    )
    .unwrap();
    // A family of captures: sizes around the batch size, every kind of payload
    // and topic (decoded ahead, rejected ahead, left to the engine).
    for (seed, n) in [(1u64, 5), (2, 1023), (3, 1025), (4, 3000), (5, 4100)] {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut rnd = |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
        let mut capture = String::new();
        let mut wall: Millis = 1_764_480_000_000;
        for i in 0..n {
            wall += i64::try_from(rnd(40)).unwrap();
            let now = Now {
                wall,
                mono: wall - 1_764_000_000_000,
                synced: true,
            };
            let dev = rnd(30);
            let lag = if rnd(20) == 0 { rnd(20_000) } else { rnd(3000) };
            let ts = wall - i64::try_from(lag).unwrap();
            let seq = i as u64 / 2 + rnd(2);
            let topic = match rnd(20) {
                0 => "sensors/g/+/reading".to_string(),
                1 => format!("spBv1.0/g{}/DDATA/node/d{dev}", rnd(2)),
                2 => format!("sensors/g{}/d{dev}/heartbeat", dev % 3),
                3 => format!("sensors/g{}/d\u{e9}{dev}/reading", dev % 3),
                _ => format!("sensors/g{}/d{dev}/reading", dev % 3),
            };
            let payload = payload(rnd(12), ts, seq, dev, &mut rnd);
            capture.push_str(&Record::of(now, &topic, &payload).to_line());
            capture.push('\n');
        }
        // Read buffers far smaller than a line too: lines cut at every point go the copied path.
        for (flush, buffer) in [(false, 1 << 18), (true, 1 << 18), (false, 61), (true, 300)] {
            let mut piped = Vec::new();
            let (_, summary) = run_memory_with(
                &cfg,
                std::io::BufReader::with_capacity(buffer, capture.as_bytes()),
                &mut piped,
                120_000,
                Finish {
                    flush,
                    timed: false,
                },
            )
            .unwrap();
            let want = sequential(&cfg, &capture, flush);
            assert_eq!(summary.records, n as u64);
            assert_eq!(
                summary.outputs,
                want.iter().filter(|&&b| b == b'\n').count() as u64
            );
            if n > 1000 {
                let text = String::from_utf8_lossy(&want);
                for part in [
                    "/windows/",
                    "decode_error",
                    "bad_topic",
                    "spBv1.0/",
                    "/late/",
                    "offline",
                ] {
                    assert!(text.contains(part), "seed {seed}: no {part} in the outputs");
                }
            }
            assert!(
                piped == want,
                "seed {seed}, {n} records, flush {flush}, buffer {buffer}: outputs differ"
            );
        }
    }
}

#[test]
fn an_output_that_cannot_be_written_fails_the_replay() {
    let cfg = crate::config::load_str("[gateway]\nid = \"gw\"\n", &Default::default()).unwrap();
    let capture: String = (0..3000)
        .map(|i| {
            let now = Now::at(1_764_480_000_000 + i * 100);
            let p = format!(r#"{{"ts":{},"v":1}}"#, now.wall);
            Record::of(now, &format!("sensors/g/d{}/reading", i % 7), p.as_bytes()).to_line() + "\n"
        })
        .collect();
    struct Full;
    impl Write for Full {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::Error::from(std::io::ErrorKind::StorageFull))
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let Err(e) = run_memory_with(
        &cfg,
        capture.as_bytes(),
        Full,
        60_000,
        Finish {
            flush: true,
            timed: false,
        },
    ) else {
        panic!("a replay into a full output succeeded");
    };
    assert!(e.to_string().starts_with("writing output"), "{e}");
}

#[test]
fn a_capture_line_gives_back_the_exact_payload_bytes() {
    let now = Now {
        wall: 1_764_480_000_123,
        mono: 42,
        synced: false,
    };
    let cases: [&[u8]; 5] = [
        br#"{"ts": 1764480000000,  "temp": 21.50}"#,
        b"{\"ts\": 1,\n \"temp\": 2}",
        b"null",
        &[0x08, 0x00, 0xff, 0x10],
        b"",
    ];
    for payload in cases {
        let line = Record::of(now, "spBv1.0/g/DDATA/n/d", payload).to_line();
        assert!(!line.contains('\n'), "{line}");
        let back: Record<'_> = serde_json::from_str(&line).expect(&line);
        let mut bytes = b"kept".to_vec();
        back.payload_into(&mut bytes).unwrap();
        assert_eq!(&bytes[..4], b"kept", "{line}");
        assert_eq!(&bytes[4..], payload, "{line}");
        assert_eq!(
            (back.arrival, back.mono, back.synced, back.topic.as_ref()),
            (now.wall, Some(42), Some(false), "spBv1.0/g/DDATA/n/d")
        );
    }
}

/// The one pass over a capture line reads what serde reads, and leaves every
/// other shape to serde (which then reads it as it always did).
#[test]
fn a_line_as_capture_writes_it_is_read_in_one_pass_and_the_rest_by_serde() {
    use crate::codec::{Decoded, Decoder, PayloadConfig, PayloadFormat, TimestampUnit};
    let dec = |format| {
        Decoder::new(&PayloadConfig {
            format,
            timestamp_field: "ts".into(),
            timestamp_unit: TimestampUnit::Ms,
            seq_field: None,
        })
    };
    let json = dec(PayloadFormat::Json);
    let one_pass = [
        r#"{"arrival":1764480000123,"mono":42,"payload":{"ts":1764480000000,"temp":21.5},"synced":false,"topic":"sensors/g/d/reading"}"#,
        r#"{"arrival":7,"payload":{},"topic":"t"}"#,
        r#"{"topic":"t","payload":{"a":-1.5e3},"arrival":-3,"mono":-4}"#,
    ];
    let to_serde = [
        r#"{"arrival":7,"payload":{"a":{"b":1}},"topic":"t"}"#,
        r#"{"arrival":7,"payload":[1],"topic":"t"}"#,
        r#"{"arrival":7,"payload":{"a":1},"topic":"t\"x"}"#,
        r#"{"arrival":7, "payload":{"a":1},"topic":"t"}"#,
        r#"{"arrival":7,"payload":{"a":1},"topic":"t","qos":1}"#,
        r#"{"arrival":7,"arrival":8,"payload":{"a":1},"topic":"t"}"#,
        r#"{"arrival":7.5,"payload":{"a":1},"topic":"t"}"#,
        r#"{"arrival":7,"mono":-0,"payload":{"a":1},"topic":"t"}"#,
        r#"{"arrival":7,"mono":null,"payload":{"a":1},"topic":"t"}"#,
        r#"{"arrival":7,"payload_b64":"AA==","topic":"t"}"#,
        r#"{"arrival":7,"payload":{"a":1},"topic":"t"} x"#,
        r#"{"arrival":7,"payload":{"a":1}}"#,
        r#"{"arrival":99999999999999999999999,"payload":{"a":1},"topic":"t"}"#,
        r#"{"arrival":-9999999999999999999,"payload":{"a":1},"topic":"t"}"#,
    ];
    for (line, want) in one_pass
        .iter()
        .map(|l| (l, true))
        .chain(to_serde.iter().map(|l| (l, false)))
    {
        let mut out = Decoded::default();
        let got = super::line::scan(line, &json, &mut out);
        assert_eq!(got.is_some(), want, "{line}");
        let Some(got) = got else { continue };
        let rec: Record<'_> = serde_json::from_str(line).expect(line);
        let mut payload = Vec::new();
        rec.payload_into(&mut payload).unwrap();
        assert_eq!(
            (
                got.arrival,
                got.mono,
                got.synced,
                &line[got.topic.clone()],
                &line.as_bytes()[got.payload.clone()]
            ),
            (
                rec.arrival,
                rec.mono,
                rec.synced,
                rec.topic.as_ref(),
                payload.as_slice()
            ),
            "{line}"
        );
        assert_eq!(Ok(out), json.decode(&payload), "{line}");
    }
    // A CBOR decoder does not read the JSON text: serde's path, and its error.
    assert!(
        super::line::scan(
            one_pass[0],
            &dec(PayloadFormat::Cbor),
            &mut Decoded::default()
        )
        .is_none()
    );
}

/// A capture line that is not UTF-8 stops the replay with the read error, after
/// the lines before it, whether it is read in the buffer or copied out of it.
#[test]
fn a_line_that_is_not_utf8_stops_the_replay_where_it_stood() {
    let cfg = crate::config::load_str("[gateway]\nid = \"gw\"\n", &Default::default()).unwrap();
    let good = r#"{"arrival":1764480000000,"payload":{"ts":1764480000000,"t":1},"topic":"sensors/g/d/reading"}"#;
    let mut capture = format!("{good}\n").into_bytes();
    capture.extend_from_slice(b"{\"arrival\":1764480000001,\"payload\":{\"t\":1},\"topic\":\"sensors/g/d\xff/reading\"}\n");
    for buffer in [1 << 18, 13] {
        let err = run_memory(
            &cfg,
            std::io::BufReader::with_capacity(buffer, capture.as_slice()),
            Vec::new(),
            0,
        )
        .map(|_| ())
        .unwrap_err();
        assert!(
            matches!(&err, ReplayError::Io { what, .. } if what == "reading input"),
            "buffer {buffer}: {err}"
        );
        assert!(err.to_string().contains("UTF-8"), "buffer {buffer}: {err}");
    }
}

/// An output line as serde writes it: the reference for [`line_into`].
#[derive(serde::Serialize)]
struct Line<'a, P: serde::Serialize> {
    topic: &'a str,
    payload: P,
    retain: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    at: Option<Millis>,
}

/// Output lines written by hand are the lines serde writes for a [`Line`].
#[test]
fn output_lines_are_serdes_lines() {
    let cfg = crate::config::load_str(
        "[gateway]\nid = \"gw\"\n[group_defaults]\nwindow = { kind = \"tumbling\", size_ms = 1000 }\n",
        &Default::default(),
    )
    .unwrap();
    let mut rp = Driver::json(&cfg);
    for i in 0..40i64 {
        let now = Now {
            wall: 1_764_480_000_000 + i * 300,
            mono: i * 300,
            synced: true,
        };
        let payload = format!(r#"{{"ts":{},"temp":{}.{i}}}"#, now.wall - 50, 20 + i % 7);
        let topic = if i % 9 == 0 {
            "sensors/g/+/reading".to_string()
        } else {
            format!("sensors/g/d{}/reading", i % 3)
        };
        rp.message(now, &topic, payload.as_bytes());
    }
    rp.flush();
    let outputs = rp.take_outputs();
    for timed in [false, true] {
        let times: Vec<Millis> = if timed {
            (0..outputs.len() as i64).collect()
        } else {
            Vec::new()
        };
        let (tx, rx) = std::sync::mpsc::channel();
        tx.send((outputs.clone(), times.clone())).unwrap();
        drop(tx);
        let mut mine = Vec::new();
        write_outputs(&cfg.sink.prefix, &rx, &mut mine).unwrap();
        let mut want = Vec::new();
        for (i, o) in outputs.iter().enumerate() {
            serde_json::to_writer(
                &mut want,
                &Line {
                    topic: &o.topic(&cfg.sink.prefix),
                    payload: o.payload(),
                    retain: o.retain(),
                    at: times.get(i).copied(),
                },
            )
            .unwrap();
            want.push(b'\n');
        }
        let text = String::from_utf8(want.clone()).unwrap();
        for part in ["/windows/", "/rejected", "/status/"] {
            assert!(text.contains(part), "no {part} in the outputs");
        }
        assert_eq!(String::from_utf8(mine).unwrap(), text, "timed {timed}");
    }
    // The durable mode's lines: the outbox entry's payload bytes as they are.
    for o in &outputs {
        let bytes = o.encode(crate::output::SinkFormat::Json);
        let raw: &serde_json::value::RawValue = serde_json::from_slice(&bytes).unwrap();
        let topic = o.topic(&cfg.sink.prefix);
        let mut mine = Vec::new();
        line_into(
            &mut mine,
            &topic,
            |l| l.extend_from_slice(raw.get().as_bytes()),
            o.retain(),
            None,
        );
        let mut want = serde_json::to_vec(&Line {
            topic: &topic,
            payload: raw,
            retain: o.retain(),
            at: None,
        })
        .unwrap();
        want.push(b'\n');
        assert_eq!(mine, want);
    }
}

proptest::proptest! {
    /// An arrival of any length reads as serde reads it wherever the one pass takes it.
    #[test]
    fn arrivals_read_as_serde_reads_them(n in "-?[0-9]{1,24}") {
        use crate::codec::{Decoded, Decoder, PayloadConfig, PayloadFormat, TimestampUnit};
        let dec = Decoder::new(&PayloadConfig {
            format: PayloadFormat::Json,
            timestamp_field: "ts".into(),
            timestamp_unit: TimestampUnit::Ms,
            seq_field: None,
        });
        let line = format!(r#"{{"arrival":{n},"payload":{{"a":1}},"topic":"t"}}"#);
        if let Some(got) = super::line::scan(&line, &dec, &mut Decoded::default()) {
            let rec: Record<'_> = serde_json::from_str(&line).unwrap();
            proptest::prop_assert_eq!(got.arrival, rec.arrival, "{}", line);
            proptest::prop_assert!(n.trim_start_matches('-').len() <= 18);
        }
    }
}
