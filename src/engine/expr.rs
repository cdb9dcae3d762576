//! The expressions of conditions (docs/reference.md#group_defaults-and-groupsname):
//! `FIELD.AGG` or `count` / `heartbeats` compared with numbers or each other,
//! joined by `and`, `or`, `not` and parentheses. Parsed once at config load
//! into a postfix program; evaluated on a window's values without allocating.

use std::fmt;

use crate::codec::MetricName;

/// Nesting the evaluator's fixed stack holds.
pub const MAX_DEPTH: usize = 32;
/// Operations in one expression at most.
const MAX_OPS: usize = 256;

/// An aggregate a condition may read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Agg {
    /// Readings carrying the metric.
    Count,
    /// Sum.
    Sum,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
    /// Mean.
    Mean,
    /// Value at the earliest event time.
    First,
    /// Value at the latest event time.
    Last,
    /// Population standard deviation.
    Stddev,
    /// Population variance.
    Variance,
    /// `last − first`.
    Delta,
    /// `delta` per second of event time.
    Rate,
    /// A p-value: the quantile in thousandths (500, 900, 950, 990, 999).
    P(u16),
}

impl Agg {
    /// Every aggregate by its name in results and expressions.
    pub const NAMED: [(&'static str, Agg); 16] = [
        ("count", Agg::Count),
        ("sum", Agg::Sum),
        ("min", Agg::Min),
        ("max", Agg::Max),
        ("mean", Agg::Mean),
        ("first", Agg::First),
        ("last", Agg::Last),
        ("stddev", Agg::Stddev),
        ("variance", Agg::Variance),
        ("delta", Agg::Delta),
        ("rate", Agg::Rate),
        ("p50", Agg::P(500)),
        ("p90", Agg::P(900)),
        ("p95", Agg::P(950)),
        ("p99", Agg::P(990)),
        ("p999", Agg::P(999)),
    ];

    /// The aggregate called `name`.
    pub fn named(name: &str) -> Option<Agg> {
        Self::NAMED
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, a)| *a)
    }

    /// Its name.
    pub fn name(self) -> &'static str {
        Self::NAMED
            .iter()
            .find(|(_, a)| *a == self)
            .map_or("?", |(n, _)| n)
    }

    /// One of the seven every window result carries (the others are configured per group).
    pub fn always(self) -> bool {
        matches!(
            self,
            Agg::Count | Agg::Sum | Agg::Min | Agg::Max | Agg::Mean | Agg::First | Agg::Last
        )
    }
}

/// What an expression reads from a window.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Ref {
    /// The window's readings.
    Count,
    /// The window's heartbeats.
    Heartbeats,
    /// One aggregate of one metric.
    Metric(MetricName, Agg),
}

impl fmt::Display for Ref {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ref::Count => f.write_str("count"),
            Ref::Heartbeats => f.write_str("heartbeats"),
            Ref::Metric(m, a) => write!(f, "{m}.{}", a.name()),
        }
    }
}

/// A comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cmp {
    /// `>`
    Gt,
    /// `>=`
    Ge,
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `==`
    Eq,
    /// `!=`
    Ne,
}

impl Cmp {
    fn holds(self, a: f64, b: f64) -> bool {
        match self {
            Cmp::Gt => a > b,
            Cmp::Ge => a >= b,
            Cmp::Lt => a < b,
            Cmp::Le => a <= b,
            Cmp::Eq => a == b,
            Cmp::Ne => a != b,
        }
    }
}

/// One side of a comparison.
#[derive(Debug, Clone, PartialEq)]
pub enum Operand {
    /// A number.
    Num(f64),
    /// A window's value (index into [`Expr::refs`]).
    Ref(usize),
}

#[derive(Debug, Clone, PartialEq)]
enum Op {
    Compare(Operand, Cmp, Operand),
    Not,
    And,
    Or,
}

/// A parsed expression.
#[derive(Debug, Clone, PartialEq)]
pub struct Expr {
    ops: Vec<Op>,
    refs: Vec<Ref>,
}

/// A bad expression: where (1-based character column) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExprError {
    /// Column of the offending token.
    pub column: usize,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for ExprError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "at column {}: {}", self.column, self.message)
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Num(f64),
    Word(String),
    Cmp(Cmp),
    Open,
    Close,
}

fn lex(src: &str) -> Result<Vec<(usize, Tok)>, ExprError> {
    let chars: Vec<(usize, char)> = src.char_indices().collect();
    let col = |i: usize| {
        src[..chars.get(i).map_or(src.len(), |c| c.0)]
            .chars()
            .count()
            + 1
    };
    let err = |i: usize, m: String| ExprError {
        column: col(i),
        message: m,
    };
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i].1;
        let start = i;
        if c.is_whitespace() {
            i += 1;
            continue;
        }
        let two = chars.get(i + 1).map(|c| c.1);
        let tok = match (c, two) {
            ('(', _) => Tok::Open,
            (')', _) => Tok::Close,
            ('>', Some('=')) | ('<', Some('=')) | ('=', Some('=')) | ('!', Some('=')) => {
                i += 1;
                Tok::Cmp(match c {
                    '>' => Cmp::Ge,
                    '<' => Cmp::Le,
                    '=' => Cmp::Eq,
                    _ => Cmp::Ne,
                })
            }
            ('>', _) => Tok::Cmp(Cmp::Gt),
            ('<', _) => Tok::Cmp(Cmp::Lt),
            _ if c.is_ascii_digit()
                || c == '-'
                || (c == '.' && two.is_some_and(|d| d.is_ascii_digit())) =>
            {
                while i + 1 < chars.len() && {
                    let d = chars[i + 1].1;
                    d.is_ascii_alphanumeric()
                        || d == '.'
                        || ((d == '-' || d == '+') && matches!(chars[i].1, 'e' | 'E'))
                } {
                    i += 1;
                }
                let text: String = chars[start..=i].iter().map(|c| c.1).collect();
                match text.parse::<f64>() {
                    Ok(n) if n.is_finite() => Tok::Num(n),
                    _ => return Err(err(start, format!("{text:?} is not a number"))),
                }
            }
            _ if c.is_alphanumeric() || c == '_' => {
                while i + 1 < chars.len() && {
                    let d = chars[i + 1].1;
                    d.is_alphanumeric() || matches!(d, '_' | '-' | '.' | ':')
                } {
                    i += 1;
                }
                Tok::Word(chars[start..=i].iter().map(|c| c.1).collect())
            }
            _ => return Err(err(start, format!("unexpected {c:?}"))),
        };
        out.push((col(start), tok));
        i += 1;
    }
    Ok(out)
}

struct Parser {
    toks: Vec<(usize, Tok)>,
    at: usize,
    end: usize,
    ops: Vec<Op>,
    refs: Vec<Ref>,
}

impl Parser {
    fn column(&self) -> usize {
        self.toks.get(self.at).map_or(self.end, |t| t.0)
    }

    fn fail<T>(&self, message: impl Into<String>) -> Result<T, ExprError> {
        Err(ExprError {
            column: self.column(),
            message: message.into(),
        })
    }

    fn peek_word(&self, w: &str) -> bool {
        matches!(self.toks.get(self.at), Some((_, Tok::Word(x))) if x == w)
    }

    fn push(&mut self, op: Op) -> Result<(), ExprError> {
        if self.ops.len() >= MAX_OPS {
            return self.fail(format!("longer than {MAX_OPS} operations"));
        }
        self.ops.push(op);
        Ok(())
    }

    fn or(&mut self, depth: usize) -> Result<(), ExprError> {
        self.and(depth)?;
        while self.peek_word("or") {
            self.at += 1;
            self.and(depth + 1)?;
            self.push(Op::Or)?;
        }
        Ok(())
    }

    fn and(&mut self, depth: usize) -> Result<(), ExprError> {
        self.not(depth)?;
        while self.peek_word("and") {
            self.at += 1;
            self.not(depth + 1)?;
            self.push(Op::And)?;
        }
        Ok(())
    }

    fn not(&mut self, depth: usize) -> Result<(), ExprError> {
        if depth >= MAX_DEPTH {
            return self.fail(format!("nested deeper than {MAX_DEPTH}"));
        }
        if self.peek_word("not") {
            self.at += 1;
            self.not(depth + 1)?;
            return self.push(Op::Not);
        }
        if matches!(self.toks.get(self.at), Some((_, Tok::Open))) {
            self.at += 1;
            self.or(depth + 1)?;
            if !matches!(self.toks.get(self.at), Some((_, Tok::Close))) {
                return self.fail("expected )");
            }
            self.at += 1;
            return Ok(());
        }
        let a = self.operand()?;
        let Some((_, Tok::Cmp(c))) = self.toks.get(self.at).cloned() else {
            return self.fail("expected a comparison (> >= < <= == !=)");
        };
        self.at += 1;
        let b = self.operand()?;
        self.push(Op::Compare(a, c, b))
    }

    fn operand(&mut self) -> Result<Operand, ExprError> {
        let Some((_, t)) = self.toks.get(self.at).cloned() else {
            return self.fail("expected a value (FIELD.AGG, count, heartbeats or a number)");
        };
        let r = match t {
            Tok::Num(n) => {
                self.at += 1;
                return Ok(Operand::Num(n));
            }
            Tok::Word(w) if w == "count" => Ref::Count,
            Tok::Word(w) if w == "heartbeats" => Ref::Heartbeats,
            Tok::Word(w) if !matches!(w.as_str(), "and" | "or" | "not") => {
                let Some((field, agg)) = w.rsplit_once('.') else {
                    return self.fail(format!(
                        "{w:?}: expected FIELD.AGG (e.g. temp.mean), count or heartbeats"
                    ));
                };
                let Some(agg) = Agg::named(agg) else {
                    let known: Vec<&str> = Agg::NAMED.iter().map(|(n, _)| *n).collect();
                    return self.fail(format!(
                        "{agg:?} is not an aggregate (one of {})",
                        known.join(", ")
                    ));
                };
                let Ok(field) = MetricName::try_from(field) else {
                    return self.fail(format!("{field:?} is longer than a field name may be"));
                };
                if field.is_empty() {
                    return self.fail("a field name before the dot");
                }
                Ref::Metric(field, agg)
            }
            _ => return self.fail("expected a value (FIELD.AGG, count, heartbeats or a number)"),
        };
        self.at += 1;
        let i = match self.refs.iter().position(|x| *x == r) {
            Some(i) => i,
            None => {
                self.refs.push(r);
                self.refs.len() - 1
            }
        };
        Ok(Operand::Ref(i))
    }
}

impl Expr {
    /// Parses `src`; the error names the column.
    pub fn parse(src: &str) -> Result<Expr, ExprError> {
        let toks = lex(src)?;
        let mut p = Parser {
            toks,
            at: 0,
            end: src.chars().count() + 1,
            ops: Vec::new(),
            refs: Vec::new(),
        };
        if p.toks.is_empty() {
            return p.fail("empty expression");
        }
        p.or(0)?;
        if p.at < p.toks.len() {
            return p.fail("expected and, or, or the end");
        }
        // The evaluator's stack: at most one value per nesting level, checked once here.
        let mut n = 0usize;
        for op in &p.ops {
            n = match op {
                Op::Compare(..) => n + 1,
                Op::Not => n,
                Op::And | Op::Or => n - 1,
            };
            if n > MAX_DEPTH + 1 {
                return p.fail(format!("nested deeper than {MAX_DEPTH}"));
            }
        }
        Ok(Expr {
            ops: p.ops,
            refs: p.refs,
        })
    }

    /// What it reads, each once; [`Expr::eval`] asks for them by index.
    pub fn refs(&self) -> &[Ref] {
        &self.refs
    }

    /// Whether it holds; `value(i)` is the window's value of `refs()[i]` (None:
    /// absent, and a comparison reading it is false). No allocation.
    pub fn eval(&self, value: impl Fn(usize) -> Option<f64>) -> bool {
        let mut stack = [false; MAX_DEPTH + 2];
        let mut n = 0usize;
        let side = |o: &Operand| match o {
            Operand::Num(x) => Some(*x),
            Operand::Ref(i) => value(*i),
        };
        for op in &self.ops {
            match op {
                Op::Compare(a, c, b) => {
                    let r = matches!((side(a), side(b)), (Some(x), Some(y)) if c.holds(x, y));
                    stack[n] = r;
                    n += 1;
                }
                Op::Not => stack[n - 1] = !stack[n - 1],
                Op::And => {
                    n -= 1;
                    stack[n - 1] = stack[n - 1] && stack[n];
                }
                Op::Or => {
                    n -= 1;
                    stack[n - 1] = stack[n - 1] || stack[n];
                }
            }
        }
        n == 1 && stack[0]
    }
}

#[cfg(test)]
#[path = "expr_tests.rs"]
mod tests;
