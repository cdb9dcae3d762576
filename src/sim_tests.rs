use super::*;

fn run(cfg: SimConfig, n: usize) -> (Vec<Msg>, Tally) {
    let mut f = Fleet::new(cfg);
    let mut out = Vec::new();
    let mut t = 0;
    while out.len() < n {
        if let Some(m) = f.release(t).or_else(|| f.next(1_764_480_000_000 + t, t)) {
            out.push(m);
        }
        t += 10;
    }
    (out, f.tally())
}

#[test]
fn the_same_seed_makes_the_same_fleet() {
    let cfg = SimConfig {
        skew_ms: 60_000,
        duplicates: 0.1,
        malformed: 0.05,
        late: 0.05,
        ..SimConfig::default()
    };
    let (a, ta) = run(cfg.clone(), 500);
    let (b, tb) = run(cfg.clone(), 500);
    assert_eq!(ta, tb);
    assert!(
        a.iter()
            .zip(&b)
            .all(|(x, y)| x.topic == y.topic && x.payload == y.payload)
    );
    let (c, _) = run(SimConfig { seed: 2, ..cfg }, 500);
    assert!(a.iter().zip(&c).any(|(x, y)| x.payload != y.payload));
}

#[test]
fn the_tally_counts_every_message_by_kind() {
    let cfg = SimConfig {
        duplicates: 0.1,
        malformed: 0.05,
        late: 0.05,
        out_of_order: 0.1,
        heartbeat_every: 5,
        format: SimFormat::Mixed,
        ..SimConfig::default()
    };
    let (msgs, t) = run(cfg, 2000);
    assert_eq!(t.total(), 2000);
    let count = |k: Kind| msgs.iter().filter(|m| m.kind == k).count() as u64;
    assert_eq!(count(Kind::Duplicate), t.duplicates);
    assert_eq!(count(Kind::Malformed), t.malformed);
    assert_eq!(count(Kind::Heartbeat), t.heartbeats);
    assert_eq!(count(Kind::Late), t.late);
    assert!(t.duplicates > 100 && t.malformed > 40 && t.late > 40 && t.heartbeats > 200);
    // A duplicate is the same bytes as the message before it.
    for w in msgs.windows(2) {
        if w[1].kind == Kind::Duplicate {
            assert_eq!(w[0].payload, w[1].payload);
        }
    }
}

#[test]
fn silence_and_outage_hold_messages_back_and_the_backlog_comes_in_order() {
    let cfg = SimConfig {
        devices: 4,
        silent: 1,
        silence_at_ms: 1000,
        silence_ms: 1000,
        outage_at_ms: Some(3000),
        outage_ms: 1000,
        ..SimConfig::default()
    };
    let mut f = Fleet::new(cfg);
    let mut d0 = Vec::new();
    let mut during_outage = 0;
    for t in (0..6000).step_by(10) {
        if let Some(m) = f.release(t).or_else(|| f.next(t, t)) {
            if (3000..4000).contains(&t) {
                during_outage += 1;
            }
            if m.device == 3 {
                d0.push(t);
            }
        }
    }
    assert_eq!(during_outage, 0);
    assert!(f.tally().backlog > 50);
    assert!(
        !d0.iter().any(|t| (1000..2000).contains(t)),
        "device 3 was silent"
    );
}
