//! Conditions on a device's window results (docs/conditions.md): the
//! configured rules, each device's judges as durable state, and the
//! `P/conditions/{group}/{device}` records they emit.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::expr::{Expr, ExprError, Ref};
use super::judge::{Event, Judge, Rule, State, Verdict};
use crate::model::Millis;
use crate::output::{ConditionOut, ConditionState, Emit, Output, WindowResult};

/// Longest run a condition may ask for.
pub const MAX_FOR_WINDOWS: u32 = 1000;

/// Conditions a group may have: each device of the group carries a judge for each.
pub const MAX_PER_GROUP: usize = 64;

/// A condition as written in the configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConditionDef {
    /// `[A-Za-z0-9_-]{1,64}`.
    pub name: String,
    /// Raises when it holds for `for_windows` consecutive windows.
    pub when: String,
    /// Clears when it holds as long; absent: when `when` no longer holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clear: Option<String>,
    /// Consecutive windows a transition needs.
    #[serde(default = "one")]
    pub for_windows: u32,
}

fn one() -> u32 {
    1
}

/// A condition parsed once at config load.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(try_from = "ConditionDef", into = "ConditionDef")]
pub struct Condition {
    def: ConditionDef,
    when: Expr,
    clear: Option<Expr>,
    /// Fingerprint of the definition: a changed one starts judging anew.
    print: u32,
    /// Fingerprint of the name: a device's judging is found by it.
    key: u32,
    /// The name, shared by every record.
    shared: Arc<str>,
    /// What each value read is called in records: `when`'s refs, then `clear`'s.
    labels: Box<[Arc<str>]>,
}

/// FNV-1a (32 bits): stable across builds and runs, unlike the std hasher.
fn fnv(text: &str) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in text.bytes() {
        h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
    }
    h
}

impl PartialEq for Condition {
    fn eq(&self, o: &Self) -> bool {
        self.def == o.def
    }
}

impl Eq for Condition {}

impl From<Condition> for ConditionDef {
    fn from(c: Condition) -> Self {
        c.def
    }
}

impl TryFrom<ConditionDef> for Condition {
    type Error = String;
    fn try_from(def: ConditionDef) -> Result<Self, String> {
        Condition::parse(def).map_err(|(key, e)| format!("{key}: {e}"))
    }
}

/// Whether `name` is a valid condition name.
pub fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

impl Condition {
    /// Parses both expressions; the error names the key (`when`/`clear`) and the column.
    pub fn parse(def: ConditionDef) -> Result<Self, (&'static str, ExprError)> {
        let when = Expr::parse(&def.when).map_err(|e| ("when", e))?;
        let clear = match &def.clear {
            Some(c) => Some(Expr::parse(c).map_err(|e| ("clear", e))?),
            None => None,
        };
        let print = fnv(&format!(
            "{}\0{}\0{:?}\0{}",
            def.name, def.when, def.clear, def.for_windows
        ));
        let labels = when
            .refs()
            .iter()
            .chain(clear.iter().flat_map(|c| c.refs().iter()))
            .map(|r| Arc::from(r.to_string()))
            .collect();
        Ok(Self {
            key: fnv(&def.name),
            shared: Arc::from(def.name.as_str()),
            labels,
            def,
            when,
            clear,
            print,
        })
    }

    /// As configured.
    pub fn def(&self) -> &ConditionDef {
        &self.def
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.def.name
    }

    /// What `when` and `clear` read: (key, its source, the ref).
    pub fn refs(&self) -> impl Iterator<Item = (&'static str, &str, &Ref)> {
        let when = self
            .when
            .refs()
            .iter()
            .map(|r| ("when", self.def.when.as_str(), r));
        let src = self.def.clear.as_deref().unwrap_or("");
        let clear = self
            .clear
            .iter()
            .flat_map(|c| c.refs().iter())
            .map(move |r| ("clear", src, r));
        when.chain(clear)
    }

    fn reads(&self, r: &WindowResult) -> Reads {
        let clear = self.clear.iter().flat_map(|c| c.refs().iter());
        let mut it = self
            .when
            .refs()
            .iter()
            .chain(clear)
            .map(|x| value(r, x).unwrap_or(f64::NAN));
        if self.labels.len() <= 2 {
            let a = it.next().unwrap_or(f64::NAN);
            Reads::Two([a, it.next().unwrap_or(f64::NAN)])
        } else {
            Reads::Many(it.collect())
        }
    }

    fn verdict(&self, r: &WindowResult, reads: &[f64]) -> Verdict {
        let n = self.when.refs().len();
        let at = |i: usize| reads.get(i).copied().filter(|v| !v.is_nan());
        let when = self.when.eval(at);
        let clear = match &self.clear {
            Some(c) => c.eval(|i| at(n + i)),
            None => !when,
        };
        Verdict {
            start: r.start,
            end: r.end,
            when,
            clear,
        }
    }

    /// The values a transition's deciding expression read.
    fn values(&self, state: State, reads: &[f64]) -> crate::output::Values {
        let n = self.when.refs().len();
        let range = match (&self.clear, state) {
            (Some(_), State::Cleared) => n..self.labels.len(),
            _ => 0..n,
        };
        range
            .map(|i| {
                let v = reads.get(i).copied().filter(|v| !v.is_nan());
                (Arc::clone(&self.labels[i]), v)
            })
            .collect()
    }
}

/// A window's value of `r`; None: absent.
fn value(r: &WindowResult, x: &Ref) -> Option<f64> {
    use super::expr::Agg;
    match x {
        Ref::Count => Some(r.count as f64),
        Ref::Heartbeats => Some(r.heartbeats as f64),
        Ref::Metric(name, agg) => {
            let m = r.metrics.get(name)?;
            Some(match agg {
                Agg::Count => m.count as f64,
                Agg::Sum => m.sum,
                Agg::Min => m.min,
                Agg::Max => m.max,
                Agg::Mean => m.mean,
                Agg::First => m.first,
                Agg::Last => m.last,
                other => {
                    let n = other.name();
                    m.extra.as_ref()?.0.iter().find(|(k, _)| *k == n)?.1
                }
            })
        }
    }
}

/// What one window read for one condition (`when`'s refs, then `clear`'s; NaN:
/// absent), inline for the usual one or two (no allocation per window).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
enum Reads {
    /// At most two values (NaN past the refs).
    Two([f64; 2]),
    /// More.
    Many(Box<[f64]>),
}

impl Reads {
    fn as_slice(&self) -> &[f64] {
        match self {
            Reads::Two(v) => v,
            Reads::Many(v) => v,
        }
    }
}

/// One condition's judging of one device, in the device's durable record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CondState {
    /// The condition's name, by its fingerprint (no copy of the name per device).
    key: u32,
    print: u32,
    judge: Judge<Reads>,
}

/// A device's conditions, in the order of its group's: one allocation for up to two.
pub type DeviceConditions = Option<Box<smallvec::SmallVec<[CondState; 2]>>>;

/// The names of the conditions raised now, among `conds` (those still configured).
pub fn raised<'a>(
    state: &'a DeviceConditions,
    conds: &'a [Condition],
) -> impl Iterator<Item = &'a str> {
    state
        .iter()
        .flat_map(|v| v.iter())
        .filter(|c| c.judge.raised())
        .filter_map(|s| conds.iter().find(|c| c.key == s.key))
        .map(|c| c.name())
}

/// `state` laid out as `conds`: a kept condition keeps its judging, a changed
/// one goes on from its raised state and judges windows after those it knew.
fn align(conds: &[Condition], state: &mut DeviceConditions) {
    let aligned = state.as_ref().is_some_and(|s| {
        s.len() == conds.len()
            && s.iter()
                .zip(conds)
                .all(|(a, c)| a.print == c.print && a.key == c.key)
    });
    if aligned {
        return;
    }
    let mut old = state.take().map(|b| *b).unwrap_or_default();
    let mut new = smallvec::SmallVec::<[CondState; 2]>::with_capacity(conds.len());
    for c in conds {
        let judge = match old.iter().position(|s| s.key == c.key) {
            Some(i) if old[i].print == c.print => old.swap_remove(i).judge,
            Some(i) => {
                let j = &old[i].judge;
                Judge::from_base(super::judge::Base {
                    raised: j.raised(),
                    run: 0,
                    last_start: j.latest().unwrap_or(Millis::MIN),
                })
            }
            None => Judge::default(),
        };
        new.push(CondState {
            key: c.key,
            print: c.print,
            judge,
        });
    }
    *state = (!new.is_empty()).then(|| Box::new(new));
}

/// Counts of the records emitted, by [`ConditionState`] order.
pub type Counts = [u64; 3];

/// Reused between calls: no allocation per window for the events.
#[derive(Default)]
pub struct Scratch {
    events: Vec<Event<Reads>>,
    /// Records waiting for their window result to go out first.
    pub said: Vec<Output>,
}

/// Judges one window result of a device; the records it makes go to `scratch.said`.
pub fn judge(
    conds: &[Condition],
    step: Option<Millis>,
    state: &mut DeviceConditions,
    r: &WindowResult,
    at: Millis,
    scratch: &mut Scratch,
) -> Counts {
    let mut counts = [0; 3];
    if conds.is_empty() && state.is_none() {
        return counts;
    }
    align(conds, state);
    let Some(states) = state.as_mut() else {
        return counts;
    };
    let Scratch { events, said } = scratch;
    for (c, s) in conds.iter().zip(states.iter_mut()) {
        let rule = Rule {
            for_windows: c.def.for_windows,
            step,
        };
        let reads = c.reads(r);
        let v = c.verdict(r, reads.as_slice());
        s.judge.window(rule, v, reads, events);
        for e in events.drain(..) {
            let (t, reads, st) = match &e {
                Event::Emit(t, reads) => (
                    t,
                    reads,
                    match t.state {
                        State::Raised => ConditionState::Raised,
                        State::Cleared => ConditionState::Cleared,
                    },
                ),
                Event::Retract(t, reads) => (t, reads, ConditionState::Retracted),
            };
            counts[st as usize] += 1;
            said.emit(Output::Condition(ConditionOut {
                name: Arc::clone(&c.shared),
                group: r.group.clone(),
                device: r.device.clone(),
                state: st,
                window_start: t.start,
                window_end: t.end,
                values: c.values(t.state, reads.as_slice()),
                at,
            }));
        }
    }
    counts
}

/// Windows starting before `before` can no longer be revised: folded in.
/// Returns whether the state changed.
pub fn settle(
    conds: &[Condition],
    step: Option<Millis>,
    state: &mut DeviceConditions,
    before: Millis,
) -> bool {
    let Some(states) = state.as_mut() else {
        return false;
    };
    let mut changed = false;
    for s in states.iter_mut() {
        let for_windows = conds
            .iter()
            .find(|c| c.print == s.print)
            .map_or(1, |c| c.def.for_windows);
        let kept = s.judge.kept();
        s.judge.settle(Rule { for_windows, step }, before);
        changed |= s.judge.kept() != kept;
    }
    changed
}

/// Windows judged and still revisable (memory figures).
pub fn kept(state: &DeviceConditions) -> usize {
    state
        .iter()
        .flat_map(|v| v.iter())
        .map(|c| c.judge.kept())
        .sum()
}
