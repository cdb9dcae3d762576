//! Device timestamps: numbers in a unit, RFC 3339 strings.

use super::{DeviceTs, TimestampUnit};
use crate::model::Millis;

pub(super) fn as_u64(v: f64) -> u64 {
    v as u64
}

fn unit_for(magnitude: f64, unit: TimestampUnit) -> TimestampUnit {
    match unit {
        TimestampUnit::Auto if magnitude < 1e11 => TimestampUnit::S,
        TimestampUnit::Auto if magnitude < 1e14 => TimestampUnit::Ms,
        TimestampUnit::Auto if magnitude < 1e17 => TimestampUnit::Us,
        TimestampUnit::Auto => TimestampUnit::Ns,
        u => u,
    }
}

/// [`unit_for`] of a positive integer: compared as an integer below 2^53, where
/// its f64 is exact (an i128's conversion to f64 is a slow library call).
fn unit_for_int(v: i128, unit: TimestampUnit) -> TimestampUnit {
    if v >= 1 << 53 {
        return unit_for(v as f64, unit);
    }
    match unit {
        TimestampUnit::Auto if v < 100_000_000_000 => TimestampUnit::S,
        TimestampUnit::Auto if v < 100_000_000_000_000 => TimestampUnit::Ms,
        // 2^53 is below 10^17.
        TimestampUnit::Auto => TimestampUnit::Us,
        u => u,
    }
}

// Beyond this (year ~2255) a timestamp is nonsense; keeps later i64 math safe.
const MAX_TS_MS: i128 = 9_000_000_000_000;

/// Converts an integer epoch in `unit` to milliseconds.
pub fn int_to_ms(v: i128, unit: TimestampUnit) -> DeviceTs {
    if v <= 0 {
        return DeviceTs::Invalid("timestamp <= 0");
    }
    let ms = match unit_for_int(v, unit) {
        TimestampUnit::S => v.saturating_mul(1000),
        TimestampUnit::Us => v / 1000,
        TimestampUnit::Ns => v / 1_000_000,
        _ => v,
    };
    if ms <= 0 {
        return DeviceTs::Invalid("timestamp <= 0");
    }
    if ms > MAX_TS_MS {
        return DeviceTs::Invalid("timestamp out of range");
    }
    DeviceTs::Ms(ms as i64)
}

/// Converts a float epoch in `unit` to milliseconds (rounded).
pub fn float_to_ms(v: f64, unit: TimestampUnit) -> DeviceTs {
    if !v.is_finite() {
        return DeviceTs::Invalid("timestamp is not finite");
    }
    if v <= 0.0 {
        return DeviceTs::Invalid("timestamp <= 0");
    }
    let ms = match unit_for(v, unit) {
        TimestampUnit::S => v * 1000.0,
        TimestampUnit::Us => v / 1000.0,
        TimestampUnit::Ns => v / 1e6,
        _ => v,
    }
    .round();
    if ms <= 0.0 {
        return DeviceTs::Invalid("timestamp <= 0");
    }
    if ms > MAX_TS_MS as f64 {
        return DeviceTs::Invalid("timestamp out of range");
    }
    DeviceTs::Ms(ms as i64)
}

/// Parses RFC 3339 (`2025-11-30T05:00:00.123Z`, `...+02:00`) into epoch milliseconds.
pub fn parse_rfc3339(s: &str) -> Option<Millis> {
    let b = s.as_bytes();
    if b.len() < 20 || b.len() > 64 {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let part = b.get(r)?;
        if !part.iter().all(u8::is_ascii_digit) {
            return None;
        }
        Some(part.iter().fold(0i64, |a, d| a * 10 + i64::from(d - b'0')))
    };
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    if b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    let (hour, min, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    if !(1..=12).contains(&month) || day < 1 || day > days_in_month(year, month) {
        return None;
    }
    if hour > 23 || min > 59 || sec > 60 {
        return None;
    }
    let mut i = 19;
    let mut frac_ms = 0i64;
    if b[i] == b'.' {
        i += 1;
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            if i - start < 3 {
                frac_ms = frac_ms * 10 + i64::from(b[i] - b'0');
            }
            i += 1;
        }
        let digits = i - start;
        if digits == 0 {
            return None;
        }
        for _ in digits..3 {
            frac_ms *= 10;
        }
    }
    let offset_min = match b.get(i..)? {
        [b'Z' | b'z'] => 0,
        [sign @ (b'+' | b'-'), h1, h2, b':', m1, m2] => {
            let d = |c: &u8| c.is_ascii_digit().then(|| i64::from(c - b'0'));
            let (oh, om) = (d(h1)? * 10 + d(h2)?, d(m1)? * 10 + d(m2)?);
            if oh > 23 || om > 59 {
                return None;
            }
            let o = oh * 60 + om;
            if *sign == b'-' { -o } else { o }
        }
        _ => return None,
    };
    let days = days_from_civil(year, month, day);
    // A leap second is folded into the next second's start.
    let secs = days * 86_400 + hour * 3600 + min * 60 + sec - offset_min * 60;
    Some(secs * 1000 + frac_ms)
}

fn days_in_month(y: i64, m: i64) -> i64 {
    match m {
        2 if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod unit_tests {
    use super::*;
    use proptest::prelude::Strategy;

    proptest::proptest! {
        /// An integer's unit is the one its f64 magnitude gives, at every threshold.
        #[test]
        fn integer_units_are_the_float_ones(
            v in proptest::prop_oneof![
                1i128..=1 << 60,
                (0usize..4).prop_flat_map(|i| {
                    let t = [100_000_000_000i128, 100_000_000_000_000, 1 << 53, 100_000_000_000_000_000][i];
                    (t - 3)..(t + 3)
                }),
            ],
            unit in proptest::sample::select(vec![TimestampUnit::Auto, TimestampUnit::S, TimestampUnit::Ms, TimestampUnit::Us, TimestampUnit::Ns]),
        ) {
            proptest::prop_assert_eq!(unit_for_int(v, unit), unit_for(v as f64, unit));
        }
    }
}
