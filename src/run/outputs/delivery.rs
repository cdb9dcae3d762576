//! The uplink's delivery state, pure (the shape of rumqttc's `MqttState`): which
//! outbox entry goes next, what is in flight, how far upstream has
//! acknowledged. The sink task feeds it events (connect, PUBACK, live outputs,
//! outbox reads) and does what it says; nothing here touches a socket or the store.
//!
//! The outbox is the session: the link connects clean and, on every CONNACK,
//! publishing restarts from the oldest entry not yet acknowledged. PUBACKs are
//! matched FIFO (a broker acknowledges QoS 1 publishes in the order it received
//! them). Entries go out in sequence order, so per-topic order holds; live
//! outputs come from the commit, a backlog is read from the outbox in chunks.

use std::collections::VecDeque;

use crate::store::OutboxEntry;

/// Live outputs kept in memory at most; beyond it they are read back from the outbox.
pub const LIVE_MAX: usize = 50_000;

/// Live outputs as the commits handed them over: each commit's list is kept as
/// it came, not copied into one queue (a close burst's was 1.3 MB more at 10 000
/// devices).
#[derive(Debug, Default)]
struct Live {
    lists: VecDeque<std::vec::IntoIter<(u64, OutboxEntry)>>,
    len: usize,
}

impl Live {
    /// Takes a commit's list, as much of it as [`LIVE_MAX`] leaves room for.
    fn push(&mut self, mut list: Vec<(u64, OutboxEntry)>) {
        list.truncate(LIVE_MAX.saturating_sub(self.len));
        if !list.is_empty() {
            self.len += list.len();
            self.lists.push_back(list.into_iter());
        }
    }

    fn front(&self) -> Option<&(u64, OutboxEntry)> {
        self.lists.front().and_then(|l| l.as_slice().first())
    }

    fn pop_front(&mut self) -> Option<(u64, OutboxEntry)> {
        let list = self.lists.front_mut()?;
        let item = list.next();
        if list.as_slice().is_empty() {
            self.lists.pop_front();
        }
        self.len -= usize::from(item.is_some());
        item
    }

    fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// What a published packet was, in PUBACK order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flight {
    Entry(u64),
    /// A status or gateway alert: acknowledged, not an outbox entry.
    Other,
}

/// What the sink task should do next.
#[derive(Debug, PartialEq)]
pub enum Next {
    /// Publish this entry, then report [`Delivery::sent`] or [`Delivery::unsent`].
    Publish(u64, OutboxEntry),
    /// Read the outbox after this sequence number (None: from its start) and
    /// hand the entries to [`Delivery::read`].
    Read(Option<u64>),
    /// Nothing to do until the next event.
    Wait,
}

/// A PUBACK's effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acked {
    /// Everything below this sequence number is delivered.
    Delivered(u64),
    /// Upstream refused entry `seq` (a v5 negative PUBACK): it is sent again
    /// from there once the window is empty (see [`Delivery::retry_due`]).
    Refused(u64),
    /// Nothing changed (a status, or acks while a retry is pending).
    Nothing,
}

/// Delivery state of the uplink.
#[derive(Debug)]
pub struct Delivery {
    /// Oldest sequence number not yet acknowledged.
    acked_upto: u64,
    /// Next sequence number to publish.
    cursor: u64,
    inflight: VecDeque<Flight>,
    live: Live,
    backlog: VecDeque<(u64, OutboxEntry)>,
    /// A negative PUBACK: publish again from here once the window is empty.
    retry_from: Option<u64>,
    connected: bool,
    /// One past the last sequence number known to exist (u64::MAX: not known yet).
    end: u64,
    /// In-flight publishes at most on this connection ...
    window: usize,
    /// ... and on any (`sink.max_inflight`).
    limit: usize,
    /// QoS 0: an entry is delivered once handed to the link.
    qos0: bool,
}

impl Delivery {
    /// A fresh start; `first` is the oldest entry in the outbox, if any.
    pub fn new(first: Option<u64>, window: usize, qos: u8) -> Self {
        let first = first.unwrap_or(0);
        Self {
            acked_upto: first,
            cursor: first,
            inflight: VecDeque::new(),
            live: Live::default(),
            backlog: VecDeque::new(),
            retry_from: None,
            connected: false,
            end: u64::MAX,
            window: window.max(1),
            limit: window.max(1),
            qos0: qos == 0,
        }
    }

    /// A CONNACK: a clean session, so everything not acknowledged goes again.
    /// `receive_max`: the broker's Receive Maximum (MQTT 5); publishing past it
    /// leaves the client waiting on packet ids the broker has not acknowledged.
    pub fn connected(&mut self, receive_max: Option<u16>) {
        self.window = self
            .limit
            .min(receive_max.map_or(usize::MAX, usize::from))
            .max(1);
        self.connected = true;
        self.inflight.clear();
        self.retry_from = None;
        self.cursor = self.acked_upto;
        self.backlog.clear();
    }

    /// A reload's window (`sink.max_inflight`) and QoS, for the next connection.
    pub fn configure(&mut self, window: usize, qos: u8) {
        self.limit = window.max(1);
        self.window = self.window.min(self.limit);
        self.qos0 = qos == 0;
    }

    /// The link dropped; its in-flight publishes are void.
    pub fn disconnected(&mut self) {
        self.connected = false;
    }

    /// Whether the link is up.
    pub fn is_connected(&self) -> bool {
        self.connected
    }

    /// A publish that is not an outbox entry went out (status, alert) at `qos`.
    pub fn other_sent(&mut self, qos: u8) {
        if qos > 0 {
            self.inflight.push_back(Flight::Other);
        }
    }

    /// Outputs of a commit, with their sequence numbers, in order.
    pub fn live(&mut self, list: Vec<(u64, OutboxEntry)>) {
        if let Some((last, _)) = list.last() {
            self.end = if self.end == u64::MAX {
                last + 1
            } else {
                self.end.max(last + 1)
            };
        }
        self.live.push(list);
    }

    /// The next step while the window has room.
    pub fn next(&mut self) -> Next {
        if !self.connected || self.retry_from.is_some() || self.inflight.len() >= self.window {
            return Next::Wait;
        }
        // Entries below the cursor were already sent (from the other queue).
        while self.live.front().is_some_and(|(s, _)| *s < self.cursor) {
            self.live.pop_front();
        }
        while self.backlog.front().is_some_and(|(s, _)| *s < self.cursor) {
            self.backlog.pop_front();
        }
        if self.live.front().is_some_and(|(s, _)| *s == self.cursor) {
            let (s, e) = self.live.pop_front().expect("front");
            return Next::Publish(s, e);
        }
        if let Some((s, e)) = self.backlog.pop_front() {
            return Next::Publish(s, e);
        }
        if self.cursor < self.end {
            // A gap before the live queue: a backlog, or live entries over LIVE_MAX.
            return Next::Read(self.cursor.checked_sub(1));
        }
        Next::Wait
    }

    /// Entries read from the outbox after [`Next::Read`], in order.
    pub fn read(&mut self, entries: Vec<(u64, OutboxEntry)>) {
        let found = !entries.is_empty();
        let before_live = self.live.front().map(|(s, _)| *s);
        self.backlog.extend(
            entries
                .into_iter()
                .take_while(|(s, _)| before_live.is_none_or(|l| *s < l)),
        );
        if self.backlog.is_empty() {
            match before_live {
                // Nothing stored before the live queue: it starts right there.
                Some(l) => self.cursor = self.cursor.max(l),
                None if !found => self.end = self.cursor,
                None => {}
            }
        }
    }

    /// Entry `seq` was handed to the link.
    pub fn sent(&mut self, seq: u64) {
        self.cursor = seq + 1;
        if self.qos0 {
            self.acked_upto = seq + 1;
        } else {
            self.inflight.push_back(Flight::Entry(seq));
        }
    }

    /// The link's request queue was full: entry `seq` is read again from the outbox.
    pub fn unsent(&mut self, seq: u64) {
        self.end = self.end.max(seq + 1);
    }

    /// A PUBACK (`ok`: reason code below 0x80).
    pub fn puback(&mut self, ok: bool) -> Acked {
        let Some(Flight::Entry(seq)) = self.inflight.pop_front() else {
            return Acked::Nothing;
        };
        if !ok {
            self.retry_from = Some(self.retry_from.map_or(seq, |r| r.min(seq)));
            return Acked::Refused(seq);
        }
        if self.retry_from.is_some() {
            return Acked::Nothing;
        }
        self.acked_upto = seq + 1;
        Acked::Delivered(seq + 1)
    }

    /// A refused entry waits to be sent again and the window is empty.
    pub fn retry_due(&self) -> bool {
        self.retry_from.is_some() && self.inflight.is_empty()
    }

    /// Publishing restarts at the refused entry.
    pub fn retry(&mut self) {
        if let Some(from) = self.retry_from.take() {
            self.cursor = from;
            self.backlog.clear();
        }
    }

    /// Everything known is delivered (a clean stop may go).
    pub fn drained(&self) -> bool {
        self.inflight.is_empty()
            && self.live.is_empty()
            && self.backlog.is_empty()
            && self.cursor >= self.end
    }

    /// Acknowledgements outstanding.
    pub fn in_flight(&self) -> usize {
        self.inflight.len()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn entry(seq: u64) -> OutboxEntry {
        OutboxEntry {
            topic: format!("t/{}", seq % 3),
            payload: seq.to_be_bytes().to_vec().into(),
            retain: false,
            at: 0,
            report: false,
        }
    }

    /// The outbox, a link that takes `room` publishes, and what went out.
    struct Rig {
        d: Delivery,
        outbox: BTreeMap<u64, OutboxEntry>,
        next_seq: u64,
        published: Vec<u64>,
        room: usize,
        read_chunk: usize,
    }

    impl Rig {
        fn new(stored: u64, window: usize) -> Self {
            let outbox: BTreeMap<_, _> = (0..stored).map(|s| (s, entry(s))).collect();
            Self {
                d: Delivery::new(outbox.keys().next().copied(), window, 1),
                outbox,
                next_seq: stored,
                published: Vec::new(),
                room: usize::MAX,
                read_chunk: 4,
            }
        }

        /// A commit: entries stored and handed over live.
        fn commit(&mut self, n: u64) {
            let list: Vec<_> = (self.next_seq..self.next_seq + n)
                .map(|s| (s, entry(s)))
                .collect();
            for (s, e) in &list {
                self.outbox.insert(*s, e.clone());
            }
            self.next_seq += n;
            self.d.live(list);
        }

        /// What the sink task's fill loop does.
        fn fill(&mut self) {
            loop {
                match self.d.next() {
                    Next::Publish(s, e) => {
                        assert_eq!(e, entry(s), "entry {s} intact");
                        if self.room == 0 {
                            self.d.unsent(s);
                            return;
                        }
                        self.room -= 1;
                        self.published.push(s);
                        self.d.sent(s);
                    }
                    Next::Read(after) => {
                        let from = after.map_or(0, |a| a + 1);
                        let v = self
                            .outbox
                            .range(from..)
                            .take(self.read_chunk)
                            .map(|(s, e)| (*s, e.clone()))
                            .collect();
                        self.d.read(v);
                    }
                    Next::Wait => return,
                }
            }
        }

        /// The broker acknowledges `n` in order; delivered entries leave the outbox.
        fn ack(&mut self, n: usize, ok: bool) -> Vec<Acked> {
            let mut out = Vec::new();
            for _ in 0..n {
                let a = self.d.puback(ok);
                if let Acked::Delivered(upto) = a {
                    self.outbox = self.outbox.split_off(&upto);
                }
                out.push(a);
            }
            out
        }
    }

    fn in_order_from(published: &[u64], first: u64) {
        let want: Vec<u64> = (first..first + published.len() as u64).collect();
        assert_eq!(published, want);
    }

    #[test]
    fn a_backlog_goes_out_before_live_entries_in_sequence_order() {
        let mut r = Rig::new(10, 100);
        r.d.connected(None);
        r.commit(5);
        r.fill();
        // Ten stored (read in chunks of 4), then five live: one sequence, so per-topic order holds.
        in_order_from(&r.published, 0);
        assert_eq!(r.published.len(), 15);
        r.ack(15, true);
        assert!(r.d.drained());
        assert!(r.outbox.is_empty());
    }

    #[test]
    fn the_window_bounds_what_is_in_flight() {
        let mut r = Rig::new(0, 3);
        r.d.connected(None);
        r.commit(10);
        r.fill();
        assert_eq!(r.published, vec![0, 1, 2]);
        assert_eq!(r.d.next(), Next::Wait);
        r.ack(2, true);
        r.fill();
        in_order_from(&r.published, 0);
        assert_eq!(r.published.len(), 5);
    }

    #[test]
    fn the_brokers_receive_maximum_narrows_the_window_for_that_connection() {
        let mut r = Rig::new(0, 100);
        r.d.connected(Some(2));
        r.commit(10);
        r.fill();
        assert_eq!(r.published, vec![0, 1], "no more than the broker takes");
        assert_eq!(r.d.next(), Next::Wait);
        // A broker that takes more on the next connection: the configured bound again.
        r.d.disconnected();
        r.d.connected(Some(1000));
        r.published.clear();
        r.fill();
        assert_eq!(r.published, (0..10).collect::<Vec<_>>());
        assert_eq!(r.d.in_flight(), 10);
    }

    #[test]
    fn a_reconnect_mid_flight_sends_again_from_the_oldest_unacknowledged() {
        let mut r = Rig::new(0, 4);
        r.d.connected(None);
        r.commit(10);
        r.fill();
        r.ack(2, true);
        // Entries 2 and 3 were in flight when the link dropped; more commits meanwhile.
        r.d.disconnected();
        r.commit(3);
        r.fill();
        assert_eq!(r.published, vec![0, 1, 2, 3], "nothing goes out while down");
        r.d.connected(None);
        r.d.other_sent(1); // the online status
        r.published.clear();
        while !r.d.drained() {
            r.fill();
            let n = r.d.in_flight();
            r.ack(n, true);
        }
        in_order_from(&r.published, 2);
        assert_eq!(r.published.len(), 11);
        assert!(r.outbox.is_empty());
    }

    #[test]
    fn a_negative_puback_sends_again_from_the_refused_entry_once_the_window_is_empty() {
        let mut r = Rig::new(0, 10);
        r.d.connected(None);
        r.commit(6);
        r.fill();
        assert_eq!(
            r.ack(2, true),
            vec![Acked::Delivered(1), Acked::Delivered(2)]
        );
        assert_eq!(r.ack(1, false), vec![Acked::Refused(2)]);
        // Later acks do not move the mark past the refused entry.
        assert_eq!(r.ack(3, true), vec![Acked::Nothing; 3]);
        assert!(r.d.retry_due());
        r.d.retry();
        r.published.clear();
        r.fill();
        assert_eq!(r.published, vec![2, 3, 4, 5]);
        r.ack(4, true);
        assert!(r.d.drained());
    }

    #[test]
    fn a_full_request_queue_reads_the_entry_back_from_the_outbox() {
        let mut r = Rig::new(0, 100);
        r.d.connected(None);
        r.commit(6);
        r.room = 2;
        r.fill();
        assert_eq!(r.published, vec![0, 1]);
        r.room = usize::MAX;
        r.fill();
        in_order_from(&r.published, 0);
        assert_eq!(r.published.len(), 6);
    }

    #[test]
    fn live_entries_beyond_the_memory_bound_are_read_from_the_outbox() {
        let mut r = Rig::new(0, 64);
        r.read_chunk = 512;
        r.d.connected(None);
        let n = LIVE_MAX as u64 + 1000;
        r.commit(n);
        let mut rounds = 0;
        while !r.d.drained() {
            r.fill();
            let k = r.d.in_flight();
            r.ack(k, true);
            rounds += 1;
            assert!(rounds < 10_000);
        }
        in_order_from(&r.published, 0);
        assert_eq!(r.published.len() as u64, n);
    }

    #[test]
    fn statuses_in_flight_are_matched_but_deliver_nothing() {
        let mut r = Rig::new(0, 10);
        r.d.connected(None);
        r.d.other_sent(1);
        r.commit(1);
        r.fill();
        assert_eq!(r.ack(2, true), vec![Acked::Nothing, Acked::Delivered(1)]);
    }
}
