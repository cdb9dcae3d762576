//! A condition judged in event time over one device's window results
//! (docs/reference.md#group_defaults-and-groupsname), pure: `raised` once
//! `when` held for `for_windows` consecutive windows, `cleared` once `clear`
//! then held as long; a revised or late window re-judges from itself on, and
//! each transition the windows no longer support is retracted, each newly
//! supported one emitted. Windows past lateness are folded into a base state.

use serde::{Deserialize, Serialize};
use smallvec::SmallVec;

use crate::model::Millis;

/// A transition of a condition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum State {
    /// `when` held for `for_windows` consecutive windows.
    Raised,
    /// `clear` held for `for_windows` consecutive windows after a raise.
    Cleared,
}

/// A transition and the window that completed its run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Transition {
    /// Start of the completing window.
    pub start: Millis,
    /// Its end.
    pub end: Millis,
    /// Raised or cleared.
    pub state: State,
}

/// What the judge says after a window, with what the completing window read
/// (for a retraction: what went out with the transition).
#[derive(Debug, Clone, PartialEq)]
pub enum Event<V = ()> {
    /// A transition the windows now support.
    Emit(Transition, V),
    /// One emitted before that they no longer support.
    Retract(Transition, V),
}

/// One window's verdicts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verdict {
    /// Window start.
    pub start: Millis,
    /// Window end.
    pub end: Millis,
    /// `when` holds.
    pub when: bool,
    /// `clear` holds (without a `clear` expression: `when` does not).
    pub clear: bool,
}

/// A condition's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    /// Consecutive windows a transition needs (≥ 1).
    pub for_windows: u32,
    /// Starts of consecutive windows lie this far apart (tumbling: the size,
    /// hopping: the slide); None: sessions, each the next one's predecessor.
    pub step: Option<Millis>,
}

/// Where the judging stands before the first window kept (16 bytes: one per
/// device and condition).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Base {
    /// Raised.
    pub raised: bool,
    /// Consecutive windows counted towards the next transition.
    pub run: u32,
    /// Start of the last window folded in; `Millis::MIN`: none.
    #[serde(rename = "last")]
    pub last_start: Millis,
}

impl Default for Base {
    fn default() -> Self {
        Self {
            raised: false,
            run: 0,
            last_start: Millis::MIN,
        }
    }
}

impl Base {
    /// Start of the last window folded in.
    pub fn last(&self) -> Option<Millis> {
        (self.last_start != Millis::MIN).then_some(self.last_start)
    }
}

/// Transitions standing, boxed: none stand for most devices most of the time,
/// and an empty one is 8 bytes in every judge instead of a Vec's 24.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
#[allow(clippy::box_collection)]
struct Standing<V>(Option<Box<StandingList<V>>>);

/// One transition inline: one allocation while any stands.
type StandingList<V> = SmallVec<[(Transition, V); 1]>;

impl<V> Standing<V> {
    fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |v| v.len())
    }

    fn get(&self, i: usize) -> Option<&(Transition, V)> {
        self.0.as_ref()?.get(i)
    }

    fn last(&self) -> Option<&(Transition, V)> {
        self.0.as_ref()?.last()
    }

    fn remove(&mut self, i: usize) -> (Transition, V) {
        let v = self.0.as_mut().expect("a standing transition to remove");
        let x = v.remove(i);
        if v.is_empty() {
            self.0 = None;
        }
        x
    }

    fn insert(&mut self, i: usize, x: (Transition, V)) {
        let v = self.0.get_or_insert_with(|| Box::new(SmallVec::new()));
        v.reserve_exact(1);
        v.insert(i, x);
    }

    fn retain(&mut self, mut f: impl FnMut(&(Transition, V)) -> bool) {
        if let Some(v) = self.0.as_mut() {
            v.retain(|x| f(x));
            if v.is_empty() {
                self.0 = None;
            }
        }
    }
}

/// One condition of one device; `V`: what a window read, kept with its verdict.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Judge<V = ()> {
    base: Base,
    /// Windows still revisable, by start: one inline (the usual), more on the heap.
    log: SmallVec<[(Verdict, V); 1]>,
    /// Transitions standing among them, with what went out with them.
    standing: Standing<V>,
}

impl<V> Default for Judge<V> {
    fn default() -> Self {
        Self {
            base: Base::default(),
            log: SmallVec::new(),
            standing: Standing(None),
        }
    }
}

/// One step of the judging: the new base and the transition it makes, if any.
fn step(rule: Rule, mut b: Base, v: &Verdict) -> (Base, Option<Transition>) {
    let consecutive = match (b.last(), rule.step) {
        (None, _) | (Some(_), None) => true,
        (Some(last), Some(s)) => v.start == last + s,
    };
    if !consecutive {
        b.run = 0;
    }
    b.last_start = v.start;
    let holds = if b.raised { v.clear } else { v.when };
    b.run = if holds { b.run + 1 } else { 0 };
    if b.run < rule.for_windows.max(1) {
        return (b, None);
    }
    b.run = 0;
    b.raised = !b.raised;
    let state = if b.raised {
        State::Raised
    } else {
        State::Cleared
    };
    (
        b,
        Some(Transition {
            start: v.start,
            end: v.end,
            state,
        }),
    )
}

/// The transitions `windows` make from `base`, in order.
pub fn transitions(
    rule: Rule,
    base: Base,
    windows: impl IntoIterator<Item = Verdict>,
) -> Vec<Transition> {
    let mut b = base;
    let mut out = Vec::new();
    for v in windows {
        let (next, t) = step(rule, b, &v);
        b = next;
        out.extend(t);
    }
    out
}

impl<V: Clone> Judge<V> {
    /// A judge from a stored base (nothing revisable kept).
    pub fn from_base(base: Base) -> Self {
        Self {
            base,
            ..Self::default()
        }
    }

    /// The base state before the windows kept.
    pub fn base(&self) -> Base {
        self.base
    }

    /// A window's result (first or revised) and what it read: what changes.
    /// Sessions: a window now covering others' starts merged them, and they go.
    pub fn window(&mut self, rule: Rule, v: Verdict, read: V, out: &mut Vec<Event<V>>) {
        if self.base.last().is_some_and(|l| v.start <= l) {
            // Settled already: past lateness, it moves nothing.
            return;
        }
        if rule.step.is_none() {
            self.log
                .retain(|(w, _)| w.start <= v.start || w.start >= v.end);
        }
        match self.log.binary_search_by_key(&v.start, |(w, _)| w.start) {
            Ok(i) => self.log[i] = (v, read),
            Err(i) => {
                self.log.reserve_exact(1);
                self.log.insert(i, (v, read));
            }
        }
        // The transitions now and those standing, both by start (a window completes
        // at most one): walked together, changed in place.
        let mut b = self.base;
        let mut i = 0;
        for k in 0..self.log.len() {
            let (next, t) = step(rule, b, &self.log[k].0);
            b = next;
            let Some(t) = t else { continue };
            while self.standing.get(i).is_some_and(|(s, _)| s.start < t.start) {
                let (old, r) = self.standing.remove(i);
                out.push(Event::Retract(old, r));
            }
            if self.standing.get(i).is_some_and(|(s, _)| *s == t) {
                i += 1;
                continue;
            }
            if self
                .standing
                .get(i)
                .is_some_and(|(s, _)| s.start == t.start)
            {
                let (old, r) = self.standing.remove(i);
                out.push(Event::Retract(old, r));
            }
            let read = self.log[k].1.clone();
            out.push(Event::Emit(t, read.clone()));
            self.standing.insert(i, (t, read));
            i += 1;
        }
        while i < self.standing.len() {
            let (old, r) = self.standing.remove(i);
            out.push(Event::Retract(old, r));
        }
    }

    /// Windows starting before `before` can no longer be revised: folded into the base.
    pub fn settle(&mut self, rule: Rule, before: Millis) {
        let n = self.log.partition_point(|(w, _)| w.start < before);
        if n == 0 {
            return;
        }
        for (v, _) in self.log.drain(..n) {
            let (b, t) = step(rule, self.base, &v);
            self.base = b;
            if let Some(t) = t {
                self.standing.retain(|(s, _)| *s != t);
            }
        }
        // Back inline once one window is left.
        if self.log.spilled() && self.log.len() <= 1 {
            self.log.shrink_to_fit();
        }
    }

    /// Raised after the windows known.
    pub fn raised(&self) -> bool {
        self.standing
            .last()
            .map_or(self.base.raised, |(t, _)| t.state == State::Raised)
    }

    /// Start of the latest window judged (kept or folded in).
    pub fn latest(&self) -> Option<Millis> {
        self.log.last().map(|(w, _)| w.start).or(self.base.last())
    }

    /// Windows kept (for the memory figures).
    pub fn kept(&self) -> usize {
        self.log.len()
    }
}

#[cfg(test)]
#[path = "judge_tests.rs"]
mod tests;
