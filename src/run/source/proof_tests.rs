use super::*;

fn probe() -> Probe {
    Probe {
        after_ms: 1000,
        timeout_ms: 3000,
        topic: "tidemark/gw/probe".into(),
    }
}

fn proof() -> Proof {
    let mut p = Proof::new(7, SystemClock::new());
    p.last = 0;
    p
}

#[test]
fn a_busy_path_sends_no_probe() {
    let mut p = proof();
    for i in 0..50 {
        // A message every 900 ms: never quiet for probe_after_ms.
        assert!(matches!(p.step(&probe(), i * 900), ProbeStep::Wait));
        p.last = i * 900;
    }
}

#[test]
fn a_quiet_path_is_probed_every_period_and_a_returned_probe_keeps_it_up() {
    let mut p = proof();
    assert_eq!(p.next_look(&probe()), 1000);
    assert!(matches!(p.step(&probe(), 999), ProbeStep::Wait));
    assert!(matches!(p.step(&probe(), 1000), ProbeStep::Send));
    p.last_probe = Some(1000);
    p.unanswered_since = Some(1000);
    // The next one a period later, even while the first is out.
    assert_eq!(p.next_look(&probe()), 2000);
    assert!(matches!(p.step(&probe(), 1500), ProbeStep::Wait));
    assert!(matches!(p.step(&probe(), 2000), ProbeStep::Send));
    // It came back: proven, nothing outstanding, quiet counts from the return.
    p.last = 1200;
    p.unanswered_since = None;
    p.last_probe = Some(2000);
    assert!(matches!(p.step(&probe(), 2999), ProbeStep::Wait));
    assert!(matches!(p.step(&probe(), 3000), ProbeStep::Send));
}

#[test]
fn a_probe_not_back_in_time_takes_the_path_down_after_after_plus_timeout() {
    let mut p = proof();
    // Probes went at 1, 2 and 3 s; none came back.
    p.unanswered_since = Some(1000);
    p.last_probe = Some(3000);
    assert_eq!(p.next_look(&probe()), 4000);
    assert!(!matches!(p.step(&probe(), 3999), ProbeStep::Down(_)));
    match p.step(&probe(), 4000) {
        ProbeStep::Down(silent) => assert_eq!(silent, 4000),
        _ => panic!("the path should be down"),
    }
    // Anything arriving before then clears it.
    p.last = 3500;
    p.unanswered_since = None;
    assert!(!matches!(p.step(&probe(), 4000), ProbeStep::Down(_)));
}

#[test]
fn a_first_probe_acknowledged_but_never_delivered_is_looked_at_in_time() {
    let mut p = proof();
    p.first_acked = Some(10);
    assert_eq!(p.next_look(&probe()), 1000);
    p.last_probe = Some(10);
    p.last = 10;
    assert_eq!(p.next_look(&probe()), 1010);
    // Probes every second meanwhile; the first one's verdict is due at 3.01 s.
    p.last_probe = Some(2500);
    assert_eq!(p.next_look(&probe()), 3010);
}

#[test]
fn only_this_processes_probes_count() {
    let p = Proof::new(0xabc, SystemClock::new());
    let q = Proof::new(0xabd, SystemClock::new());
    assert!(p.ours(&p.payload(0)));
    assert!(p.ours(&p.payload(123_456)));
    assert!(!p.ours(&q.payload(0)));
    assert!(!p.ours(b""));
    assert!(!p.ours(b"{\"ts\": 1}"));
    assert!(p.payload(99).len() <= 24);
}
