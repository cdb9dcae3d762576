//! The driver's tests: ticks before messages, commits, batches.

use super::*;

const T0: Millis = 1_764_480_000_000;

fn driver() -> Driver {
    let cfg = crate::config::load_str(
        "[gateway]\nid = \"gw\"\ncommit_interval_ms = 1000\ntick_interval_ms = 200\n\
         [group_defaults]\nidle_timeout_ms = 500\n",
        &std::collections::BTreeMap::new(),
    )
    .unwrap();
    Driver::json(&cfg).with_journal()
}

fn reading(d: &mut Driver, at: Millis) {
    let p = format!(r#"{{"ts": {at}, "temp": 1}}"#);
    d.message(Now::at(at), "sensors/g/d/reading", p.as_bytes());
}

#[test]
fn one_commit_per_interval_and_the_first_reading_after_quiet_is_not_kept_waiting() {
    let mut d = driver();
    assert!(!d.commit_due(T0));
    reading(&mut d, T0);
    assert!(d.commit_due(T0), "nothing committed yet: at once");
    let b = d.take_journal(Now::at(T0));
    assert!(!b.journal.unwrap().is_empty());
    reading(&mut d, T0 + 10);
    assert!(!d.commit_due(T0 + 999));
    assert!(d.commit_due(T0 + 1000));
    d.take_journal(Now::at(T0 + 1000));
    // A quiet spell, then a reading: committed at once.
    reading(&mut d, T0 + 5000);
    assert!(d.commit_due(T0 + 5000));
}

#[test]
fn a_gap_of_a_century_runs_as_one_tick_once_nothing_can_fire() {
    let mut d = driver();
    reading(&mut d, T0);
    let century = T0 + 100 * 365 * 86_400_000;
    // 15.8 billion ticks of 200 ms: without the shortcut this does not return.
    d.ticks_until(Now::at(century));
    assert!(d.engine().settled());
    // The window closed and the device went offline on the way, as tick by tick.
    assert!(d.outputs().iter().any(|o| matches!(o, Output::Alert(_))));
    let topics: Vec<_> = d
        .take_journal(Now::at(century))
        .outputs
        .into_iter()
        .map(|e| e.topic)
        .collect();
    assert!(topics.iter().any(|t| t.contains("/windows/")), "{topics:?}");
    assert!(topics.iter().any(|t| t.contains("/alerts/")), "{topics:?}");
    // The watermark is where the last tick puts an idle group.
    let wm = d.engine().watermark("g").unwrap();
    assert!(wm > century - 120_000, "{wm}");
    assert_eq!(d.next_tick(), Some(century + 200 - (century - T0) % 200));
}

/// `run` encodes outputs as they are emitted; a batch holds what encoding them
/// at the cut gives (`replay`'s way), at the cut's time, for families of input.
#[test]
fn outputs_encoded_at_emission_are_the_batch_encoded_at_the_cut() {
    for (devices, every, format) in [
        (1, 100, SinkFormat::Json),
        (40, 37, SinkFormat::Cbor),
        (300, 1000, SinkFormat::Json),
    ] {
        let cfg = crate::config::load_str(
            "[gateway]\nid = \"gw\"\ncommit_interval_ms = 1000\ntick_interval_ms = 200\n\
             [time]\npolicy = \"device\"\n\
             [group_defaults]\nidle_timeout_ms = 500\nheartbeat_timeout_ms = 3000\n\
             allowed_lateness_ms = 1000\n\
             window = { kind = \"tumbling\", size_ms = 2000 }\n",
            &std::collections::BTreeMap::new(),
        )
        .unwrap();
        let mut run = Driver::new(
            Engine::new(&cfg.engine),
            &cfg.gateway,
            &cfg.sink.prefix,
            format,
            None,
        )
        .with_journal();
        let mut cut = Driver::new(
            Engine::new(&cfg.engine),
            &cfg.gateway,
            &cfg.sink.prefix,
            format,
            None,
        );
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for k in 0..60i64 {
            let at = T0 + k * every;
            for i in 0..devices {
                // Every seventh reading is late, some are bad: late and rejected outputs too.
                let ts = if (k + i) % 7 == 0 { at - 30_000 } else { at };
                let p = if (k * i) % 11 == 5 {
                    "{\"temp\": ".to_string()
                } else {
                    format!(r#"{{"ts": {ts}, "temp": {k}, "rh": {i}}}"#)
                };
                let topic = format!("sensors/g{}/d{i}/reading", i % 3);
                run.message(Now::at(at), &topic, p.as_bytes());
                cut.message(Now::at(at), &topic, p.as_bytes());
            }
            if k % 9 == 8 {
                a.extend(run.take_journal(Now::at(at + 1)).outputs);
                b.extend(cut.take_batch(Now::at(at + 1)).outputs);
            }
        }
        let end = T0 + 60 * every + 10_000;
        run.ticks_until(Now::at(end));
        cut.ticks_until(Now::at(end));
        a.extend(run.take_journal(Now::at(end)).outputs);
        b.extend(cut.take_batch(Now::at(end)).outputs);
        assert!(b.iter().any(|e| e.topic.contains("/windows/")));
        assert!(b.iter().any(|e| e.topic.contains("/alerts/")));
        if devices > 1 {
            assert!(b.iter().any(|e| e.topic.ends_with("/rejected")));
            assert!(b.iter().any(|e| e.topic.contains("/late/")));
        }
        assert_eq!(a, b, "{devices} devices");
    }
}

#[test]
fn ticks_that_only_move_watermarks_are_not_durable_work() {
    let mut d = driver();
    reading(&mut d, T0);
    d.take_journal(Now::at(T0));
    // The group goes idle and its watermark follows the clock, tick after tick.
    let wm = |d: &Driver| d.engine().watermark("g");
    d.ticks_until(Now::at(T0 + 2000));
    let first = wm(&d);
    d.ticks_until(Now::at(T0 + 4000));
    assert!(wm(&d) > first, "the idle group's watermark moves");
    assert!(d.outputs().is_empty());
    assert!(!d.has_durable());
    assert!(!d.commit_due(T0 + 4000));
    // The journal keeps one collapsed tick, not one per tick.
    let ticks = d.journal().unwrap().len();
    d.ticks_until(Now::at(T0 + 8000));
    assert_eq!(d.journal().unwrap().len(), ticks);
}

fn fleet_config() -> Config {
    crate::config::load_str(
        "[gateway]\nid = \"gw\"\ncommit_interval_ms = 1000\ntick_interval_ms = 200\n\
         [time]\npolicy = \"device\"\n\
         [group_defaults]\nidle_timeout_ms = 500\nheartbeat_timeout_ms = 600000\n\
         allowed_lateness_ms = 1000\n\
         window = { kind = \"tumbling\", size_ms = 2000 }\n",
        &std::collections::BTreeMap::new(),
    )
    .unwrap()
}

/// Every device's stored record, group by group, member order.
fn records(e: &Engine) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for g in e.groups() {
        for d in e.group_devices(&g.name) {
            let mut b = Vec::new();
            ciborium::ser::into_writer(d, &mut b).unwrap();
            out.push(b);
        }
    }
    out
}

/// A window-close burst larger than a slice: `run` cuts it into batches of at most
/// [`crate::engine::TICK_SLICE`] changed devices; with nothing in between the slices
/// give `replay`'s outputs, and with readings in between, the journal's records
/// replayed on a fresh engine give the state `run` has (what recovery relies on).
#[test]
fn a_close_burst_goes_out_in_slices_that_the_journal_replays_exactly() {
    let cfg = fleet_config();
    let slice = crate::engine::TICK_SLICE;
    for (devices, interleave) in [
        (2 * slice + 808, false),
        (2 * slice + 808, true),
        (slice, true),
    ] {
        let mut run = Driver::new(
            Engine::new(&cfg.engine),
            &cfg.gateway,
            &cfg.sink.prefix,
            SinkFormat::Json,
            None,
        )
        .with_journal();
        let mut whole = Driver::new(
            Engine::new(&cfg.engine),
            &cfg.gateway,
            &cfg.sink.prefix,
            SinkFormat::Json,
            None,
        );
        let mut ops = Vec::new();
        let (mut a, mut b) = (Vec::new(), Vec::new());
        let send = |d: &mut Driver, i: usize, at: Millis, ts: Millis| {
            let p = format!(r#"{{"ts": {ts}, "temp": {i}}}"#);
            let topic = format!("sensors/g{}/d{i:05}/reading", i % 2);
            d.message(Now::at(at), &topic, p.as_bytes());
        };
        for i in 0..devices {
            send(&mut run, i, T0, T0);
            send(&mut whole, i, T0, T0);
        }
        let mut batch = run.take_journal(Now::at(T0));
        ops.push(batch.journal.take().unwrap());
        a.extend(batch.outputs);
        // Past the window's end and the idle timeout: every window closes in one tick.
        let mut at = T0 + 5_000;
        let mut slices = 0;
        loop {
            if run.backlog() {
                run.continue_backlog();
            } else {
                run.ticks_until(Now::at(at));
            }
            let mut batch = run.take_journal(Now::at(at));
            ops.push(batch.journal.take().unwrap());
            let windows = batch
                .outputs
                .iter()
                .filter(|e| e.topic.contains("/windows/"))
                .count();
            assert!(windows <= slice, "{windows} results in one batch");
            a.extend(batch.outputs);
            slices += 1;
            if !run.backlog() {
                break;
            }
            if interleave {
                // A reading arrives between two slices: a late one for a device not yet closed.
                at += 7;
                send(&mut run, devices - 1 - slices, at, T0 + 100);
            }
        }
        assert_eq!(slices, devices.div_ceil(slice), "{devices} devices");
        let mut fresh = Engine::new(&cfg.engine);
        for o in &ops {
            crate::journal::apply(&mut fresh, o).unwrap();
        }
        assert_eq!(
            records(&fresh),
            records(run.engine()),
            "{devices} devices, interleave {interleave}"
        );
        if !interleave {
            whole.ticks_until(Now::at(T0 + 5_000));
            b.extend(whole.take_batch(Now::at(T0 + 5_000)).outputs);
            for e in a.iter_mut().chain(b.iter_mut()) {
                e.at = 0;
            }
            assert_eq!(a.len(), b.len());
            assert!(a == b, "sliced outputs differ from one whole tick's");
        }
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]
    /// A slot guess (replay's look-ahead) is checked before use: wrong ones, missing
    /// ones and ones past the table give the outputs and records of no guess.
    #[test]
    fn a_slot_guess_moves_no_reading(
        msgs in proptest::collection::vec((0u8..3, 0u8..6, 0u32..12, 0i64..4000), 1..60),
    ) {
        let cfg = fleet_config();
        let (mut plain, mut guessed) = (Driver::json(&cfg), Driver::json(&cfg));
        for (i, &(g, d, guess, dt)) in msgs.iter().enumerate() {
            let now = Now::at(T0 + 50 * i as Millis);
            let topic = format!("sensors/g{g}/d{d}/reading");
            let p = format!(r#"{{"ts": {}, "seq": {i}, "temp": {dt}}}"#, T0 + dt);
            plain.message(now, &topic, p.as_bytes());
            let known = Known { decoded: None, slot: Some(guess) };
            guessed.message_decoded(now, &topic, p.as_bytes(), known);
        }
        let end = Now::at(T0 + 60_000);
        plain.ticks_until(end);
        guessed.ticks_until(end);
        let lines = |d: &mut Driver| -> Vec<Vec<u8>> {
            d.take_outputs().iter().map(|o| o.encode(SinkFormat::Json)).collect()
        };
        proptest::prop_assert_eq!(lines(&mut plain), lines(&mut guessed));
        proptest::prop_assert_eq!(records(plain.engine()), records(guessed.engine()));
    }
}
