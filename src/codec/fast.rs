//! The common JSON payload read in one pass without serde: a flat object of
//! numbers, short strings and literals, no escapes, no nesting. Anything else
//! (and any field the decoder refuses) gives `None`, and the payload goes the
//! serde path, which files the same fields and words its own errors.

use super::{MAX_METRIC_NAME, Scalar};

/// Powers of ten exact in an f64.
const POW10: [f64; 23] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16,
    1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
];

/// Longest string value kept (as the serde path keeps it).
const MAX_VALUE_STR: usize = 48;

/// Only JSON whitespace from `at` on.
pub(super) fn blank_from(b: &[u8], at: usize) -> bool {
    ws(b, at) == b.len()
}

fn ws(b: &[u8], mut at: usize) -> usize {
    while at < b.len() && matches!(b[at], b' ' | b'\t' | b'\n' | b'\r') {
        at += 1;
    }
    at
}

/// The object starting at the first non-blank byte of `b[at..]`: each field to
/// `field` in order; the offset after its `}`.
pub(super) fn object(
    text: &str,
    at: usize,
    field: &mut dyn FnMut(&str, Scalar<'_>) -> bool,
) -> Option<usize> {
    let b = text.as_bytes();
    let mut at = ws(b, at);
    if b.get(at) != Some(&b'{') {
        return None;
    }
    at = ws(b, at + 1);
    if b.get(at) == Some(&b'}') {
        return Some(at + 1);
    }
    loop {
        if b.get(at) != Some(&b'"') {
            return None;
        }
        let (name, next) = string(text, at + 1)?;
        // serde's key check refuses it whatever the value: its path words the error.
        if name.len() > MAX_METRIC_NAME {
            return None;
        }
        at = ws(b, next);
        if b.get(at) != Some(&b':') {
            return None;
        }
        at = ws(b, at + 1);
        let (value, next) = match *b.get(at)? {
            b'"' => {
                let (s, next) = string(text, at + 1)?;
                let v = if s.len() <= MAX_VALUE_STR {
                    Scalar::Str(s)
                } else {
                    Scalar::Other
                };
                (v, next)
            }
            b'-' | b'0'..=b'9' => number(b, at)?,
            b't' => (Scalar::Other, literal(b, at, b"true")?),
            b'f' => (Scalar::Other, literal(b, at, b"false")?),
            b'n' => (Scalar::Other, literal(b, at, b"null")?),
            _ => return None,
        };
        if !field(name, value) {
            return None;
        }
        at = ws(b, next);
        match b.get(at) {
            Some(b',') => at = ws(b, at + 1),
            Some(b'}') => return Some(at + 1),
            _ => return None,
        }
    }
}

/// Eight ASCII digits as their value; None unless all eight are digits.
pub(crate) fn eight_digits(c: &[u8]) -> Option<u64> {
    let x = u64::from_le_bytes(c.try_into().ok()?);
    // A byte below '0' or above '9' sets a top bit in one of the two.
    if (x.wrapping_add(0x4646_4646_4646_4646) | x.wrapping_sub(0x3030_3030_3030_3030))
        & 0x8080_8080_8080_8080
        != 0
    {
        return None;
    }
    let v = x.wrapping_sub(0x3030_3030_3030_3030);
    // Pairs, then fours, then the eight: the first byte is the most significant digit.
    let v = v.wrapping_mul(10).wrapping_add(v >> 8);
    let lo = (v & 0x0000_00FF_0000_00FF).wrapping_mul(0x000F_4240_0000_0064);
    let hi = ((v >> 16) & 0x0000_00FF_0000_00FF).wrapping_mul(0x0000_2710_0000_0001);
    Some(lo.wrapping_add(hi) >> 32)
}

fn literal(b: &[u8], at: usize, word: &[u8]) -> Option<usize> {
    (b.get(at..at + word.len()) == Some(word)).then_some(at + word.len())
}

/// A string's text from just after its opening quote, and the offset after its
/// closing one; None with an escape or a control byte. (Quotes are ASCII: the
/// slice is whole characters of text already known to be UTF-8.)
#[inline(always)]
fn string(text: &str, start: usize) -> Option<(&str, usize)> {
    let b = text.as_bytes();
    let mut at = start;
    // A byte loop: keys and values here are a few bytes (crate::scan costs more on those).
    loop {
        match *b.get(at)? {
            b'"' => break,
            b'\\' | 0..=0x1f => return None,
            _ => at += 1,
        }
    }
    Some((text.get(start..at)?, at + 1))
}

/// A number as serde_json reads it (integers as integers, the rest as the
/// correctly rounded f64), where one exact operation gives it: at most 18
/// integer digits, or 15 significant digits within 10^±22. Else None.
fn number(b: &[u8], mut at: usize) -> Option<(Scalar<'static>, usize)> {
    let neg = b[at] == b'-';
    if neg {
        at += 1;
    }
    let digits = |at: &mut usize, sig: &mut u64, n: &mut u32| {
        // Eight at a time while they stay within 18 significant digits; the rest one by one.
        while let Some(v) = b.get(*at..*at + 8).and_then(eight_digits) {
            let k = match (*sig, v) {
                (1.., _) => 8,
                (0, 0) => 0,
                (0, v) => v.ilog10() + 1,
            };
            if *n + k > 18 {
                break;
            }
            *sig = *sig * 100_000_000 + v;
            *n += k;
            *at += 8;
        }
        while let Some(d @ b'0'..=b'9') = b.get(*at) {
            if *n >= 18 {
                return false;
            }
            *sig = *sig * 10 + u64::from(d - b'0');
            if *sig > 0 {
                *n += 1;
            }
            *at += 1;
        }
        true
    };
    let (mut sig, mut n) = (0u64, 0u32);
    let int_start = at;
    if !digits(&mut at, &mut sig, &mut n) || at == int_start {
        return None;
    }
    // serde_json refuses a leading zero.
    if b[int_start] == b'0' && at - int_start > 1 {
        return None;
    }
    let mut exp10: i32 = 0;
    let mut float = false;
    if b.get(at) == Some(&b'.') {
        float = true;
        at += 1;
        let frac_start = at;
        if !digits(&mut at, &mut sig, &mut n) || at == frac_start {
            return None;
        }
        exp10 = exp10.saturating_sub(i32::try_from(at - frac_start).ok()?);
    }
    if matches!(b.get(at), Some(b'e' | b'E')) {
        float = true;
        at += 1;
        let eneg = match b.get(at) {
            Some(b'-') => {
                at += 1;
                true
            }
            Some(b'+') => {
                at += 1;
                false
            }
            _ => false,
        };
        let (mut e, start) = (0i32, at);
        while let Some(d @ b'0'..=b'9') = b.get(at) {
            if at - start >= 3 {
                return None;
            }
            e = e * 10 + i32::from(d - b'0');
            at += 1;
        }
        if at == start {
            return None;
        }
        exp10 = exp10.saturating_add(if eneg { -e } else { e });
    }
    if !float {
        // "-0" is a float to serde_json.
        if neg && sig == 0 {
            return None;
        }
        let i = i128::from(sig);
        return Some((Scalar::Int(if neg { -i } else { i }), at));
    }
    if n > 15 {
        return None;
    }
    let pow = *POW10.get(usize::try_from(exp10.unsigned_abs()).ok()?)?;
    #[allow(clippy::cast_precision_loss)]
    let m = sig as f64;
    let f = if exp10 >= 0 { m * pow } else { m / pow };
    Some((Scalar::Float(if neg { -f } else { f }), at))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(s: &str) -> Option<Vec<String>> {
        let mut got = Vec::new();
        let end = object(s, 0, &mut |k, v| {
            got.push(format!("{k}={v:?}"));
            true
        })?;
        Some(got).filter(|_| s.as_bytes()[end..].iter().all(u8::is_ascii_whitespace))
    }

    #[test]
    fn the_simple_shapes_are_read_and_the_rest_left_to_serde() {
        assert_eq!(
            fields(r#" { "ts" : 1700000000000, "t":-21.5,"h":"x","ok":true ,"n":null} "#).unwrap(),
            [
                "ts=Int(1700000000000)",
                "t=Float(-21.5)",
                r#"h=Str("x")"#,
                "ok=Other",
                "n=Other"
            ]
        );
        assert_eq!(fields("{}").unwrap(), Vec::<String>::new());
        for s in [
            r#"{"a":{"b":1}}"#,
            r#"{"a":[1]}"#,
            r#"{"a\u0041":1}"#,
            r#"{"a":"\n"}"#,
            r#"{"a":01}"#,
            r#"{"a":-0}"#,
            r#"{"a":1.}"#,
            r#"{"a":1e}"#,
            r#"{"a":1,}"#,
            r#"{"a":1 "b":2}"#,
            r#"{"a":tru}"#,
            r#"{"a":12a}"#,
            r#"{"a":1.23456789012345678}"#,
            r#"{"a":1e400}"#,
            r#"{"a":1234567890123456789}"#,
            "{\"a\":1",
            "[1]",
        ] {
            assert_eq!(fields(s), None, "{s}");
        }
    }

    proptest::proptest! {
        /// Eight bytes read at once are what reading them one by one gives.
        #[test]
        fn eight_digits_read_as_one_by_one(c in proptest::collection::vec(proptest::prop_oneof![b'0'..=b'9', proptest::num::u8::ANY], 8)) {
            let want = c.iter().all(u8::is_ascii_digit).then(|| c.iter().fold(0u64, |v, &d| v * 10 + u64::from(d - b'0')));
            proptest::prop_assert_eq!(eight_digits(&c), want);
        }

        /// Long runs of digits, leading zeros among them, read as serde_json reads
        /// them wherever the one pass takes them.
        #[test]
        fn digit_runs_read_as_serde_json_reads_them(s in "-?(0|[1-9][0-9]{0,24})(\\.[0-9]{1,24})?([eE][-+]?[0-9]{1,3})?") {
            let text = format!("{{\"v\":{s}}}");
            let mut got = None;
            let taken = object(&text, 0, &mut |_, v| { got = Some(format!("{v:?}")); true }).is_some();
            // Out of f64's range: serde refuses it, and so must the one pass.
            let Ok(want) = serde_json::from_str::<serde_json::Value>(&text) else {
                proptest::prop_assert!(!taken, "{}", text);
                return Ok(());
            };
            if taken {
                let expect = match want["v"].as_i64() {
                    Some(i) if !s.contains(['.', 'e', 'E']) => format!("Int({i})"),
                    _ => format!("Float({:?})", want["v"].as_f64().unwrap()),
                };
                proptest::prop_assert_eq!(got.unwrap(), expect, "{}", text);
            }
        }

        /// Wherever the one pass reads a number, it reads serde_json's value, bit for bit.
        #[test]
        fn a_number_reads_as_serde_json_reads_it(
            int in -99_999_999_999i64..99_999_999_999,
            frac in proptest::option::of(0u32..1_000_000),
            zeros in 0usize..4,
            exp in proptest::option::of(-30i32..30),
        ) {
            let mut s = int.to_string();
            if let Some(f) = frac {
                s.push('.');
                s.push_str(&"0".repeat(zeros));
                s.push_str(&f.to_string());
            }
            if let Some(e) = exp {
                s.push_str(&format!("e{e}"));
            }
            let text = format!("{{\"v\":{s}}}");
            let want: serde_json::Value = serde_json::from_str(&text).unwrap();
            let want = &want["v"];
            let mut got = None;
            if object(&text, 0, &mut |_, v| { got = Some(format!("{v:?}")); true }).is_some() {
                let got = got.unwrap();
                let expect = match want.as_i64() {
                    Some(i) if !s.contains(['.', 'e']) => format!("Int({i})"),
                    _ => format!("Float({:?})", want.as_f64().unwrap()),
                };
                proptest::prop_assert_eq!(got, expect, "{}", text);
            }
        }
    }
}
