//! Payload decoding (SPEC §3): a JSON object or CBOR map into a [`Decoded`]
//! value. Bad input is an `Err(DecodeError)` value, never a panic. Fields are
//! filed straight into a reused output as they stream by: no tree is built,
//! nothing is allocated on the hot path.

use std::fmt;

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, Visitor};

use crate::model::Millis;

use serde::{Deserialize, Serialize};

/// Payload encoding of sensor messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PayloadFormat {
    /// JSON object.
    Json,
    /// CBOR map.
    Cbor,
    /// CBOR if the first byte is a CBOR map header, else JSON.
    Auto,
}

/// Unit of numeric device timestamps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TimestampUnit {
    /// Seconds.
    S,
    /// Milliseconds.
    Ms,
    /// Microseconds.
    Us,
    /// Nanoseconds.
    Ns,
    /// By magnitude.
    Auto,
}

/// Payload decoding settings.
#[derive(Debug, Clone)]
pub struct PayloadConfig {
    /// Encoding.
    pub format: PayloadFormat,
    /// Timestamp field name.
    pub timestamp_field: String,
    /// Timestamp unit.
    pub timestamp_unit: TimestampUnit,
    /// Sequence field name, if duplicate suppression is enabled.
    pub seq_field: Option<String>,
}

/// Largest accepted payload.
pub const MAX_PAYLOAD: usize = 64 * 1024;
/// Largest number of metric fields in one reading.
pub const MAX_METRICS: usize = 32;
/// Longest metric field name.
pub const MAX_METRIC_NAME: usize = 64;

/// A metric field name, inline.
pub type MetricName = heapless::String<MAX_METRIC_NAME>;

/// The device timestamp as found in the payload.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum DeviceTs {
    /// No timestamp field.
    Missing,
    /// Present but unusable (detail).
    Invalid(&'static str),
    /// Epoch milliseconds (not yet checked against `min_valid_epoch_ms`).
    Ms(Millis),
}

/// A decoded payload.
#[derive(Debug, Clone, PartialEq)]
pub struct Decoded {
    /// Device timestamp.
    pub ts: DeviceTs,
    /// Per-device sequence number, when present and a non-negative integer.
    pub seq: Option<u64>,
    /// Top-level numeric fields other than timestamp and sequence, in payload order.
    pub metrics: heapless::Vec<(MetricName, f64), MAX_METRICS>,
}

/// Why a payload could not be decoded (the `detail` of a `decode_error`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError(pub String);

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Decodes payloads according to `[payload]`.
#[derive(Debug, Clone)]
pub struct Decoder {
    format: PayloadFormat,
    ts_field: String,
    ts_unit: TimestampUnit,
    seq_field: Option<String>,
}

impl Decoder {
    /// A decoder for the given settings.
    pub fn new(cfg: &PayloadConfig) -> Self {
        Self {
            format: cfg.format,
            ts_field: cfg.timestamp_field.clone(),
            ts_unit: cfg.timestamp_unit,
            seq_field: cfg.seq_field.clone(),
        }
    }

    /// Name of the timestamp field.
    pub fn ts_field(&self) -> &str {
        &self.ts_field
    }

    /// Name of the sequence field, if any.
    pub fn seq_field(&self) -> Option<&str> {
        self.seq_field.as_deref()
    }

    /// Decodes one payload.
    pub fn decode(&self, bytes: &[u8]) -> Result<Decoded, DecodeError> {
        let mut out = Decoded::default();
        self.decode_into(bytes, &mut out)?;
        Ok(out)
    }

    /// Decodes one payload into `out` (reused: no allocation, no large copies).
    pub fn decode_into(&self, bytes: &[u8], out: &mut Decoded) -> Result<(), DecodeError> {
        out.ts = DeviceTs::Missing;
        out.seq = None;
        out.metrics.clear();
        if bytes.len() > MAX_PAYLOAD {
            return Err(DecodeError(format!(
                "payload of {} bytes exceeds 64 KiB",
                bytes.len()
            )));
        }
        let cbor = match self.format {
            PayloadFormat::Cbor => true,
            PayloadFormat::Json => false,
            // Major type 5 (map): 0xa0..=0xbf.
            PayloadFormat::Auto => bytes.first().is_some_and(|b| b >> 5 == 5),
        };
        if cbor {
            cbor::read_map(bytes, &mut |name, v| self.field(out, name, v))
                .map_err(|e| DecodeError(format!("cbor: {e}")))
        } else {
            let mut de = serde_json::Deserializer::from_slice(bytes);
            JsonSeed { dec: self, out }
                .deserialize(&mut de)
                .and_then(|()| de.end())
                .map_err(|e| DecodeError(format!("json: {e}")))
        }
    }

    /// Files one top-level field.
    fn field(&self, out: &mut Decoded, name: &str, value: Scalar<'_>) -> Result<(), String> {
        if name == self.ts_field {
            out.ts = value.to_ts(self.ts_unit);
        } else if self.seq_field.as_deref() == Some(name) {
            out.seq = value.to_seq();
        } else if let Some(v) = value.to_metric() {
            if !v.is_finite() {
                return Err(format!("metric {name:?} is not finite"));
            }
            let name = MetricName::try_from(name)
                .map_err(|_| format!("field name longer than {MAX_METRIC_NAME} bytes"))?;
            if let Some(slot) = out.metrics.iter_mut().find(|(n, _)| *n == name) {
                slot.1 = v;
            } else if out.metrics.push((name, v)).is_err() {
                return Err(format!("more than {MAX_METRICS} metric fields"));
            }
        }
        Ok(())
    }
}

impl Default for Decoded {
    fn default() -> Self {
        Self {
            ts: DeviceTs::Missing,
            seq: None,
            metrics: heapless::Vec::new(),
        }
    }
}

/// Deepest nesting accepted inside a payload (deeper is garbage, not data).
pub const MAX_DEPTH: u32 = 16;

/// A top-level value, as much as decoding needs to know about it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Scalar<'a> {
    Int(i128),
    Float(f64),
    Str(&'a str),
    Other,
}

impl Scalar<'_> {
    #[allow(clippy::cast_precision_loss)]
    fn to_metric(self) -> Option<f64> {
        match self {
            Scalar::Int(i) => Some(i as f64),
            Scalar::Float(f) => Some(f),
            _ => None,
        }
    }

    fn to_seq(self) -> Option<u64> {
        match self {
            Scalar::Int(i) => u64::try_from(i).ok(),
            Scalar::Float(f) if f >= 0.0 && f.fract() == 0.0 && f < 1.8e19 => Some(as_u64(f)),
            _ => None,
        }
    }

    fn to_ts(self, unit: TimestampUnit) -> DeviceTs {
        match self {
            Scalar::Int(i) => int_to_ms(i, unit),
            Scalar::Float(f) => float_to_ms(f, unit),
            Scalar::Str(s) => parse_rfc3339(s).map_or(
                DeviceTs::Invalid("unparseable timestamp string"),
                DeviceTs::Ms,
            ),
            Scalar::Other => DeviceTs::Invalid("timestamp is not a number or string"),
        }
    }
}

/// JSON: a streaming visitor filing fields straight into the output.
struct JsonSeed<'a> {
    dec: &'a Decoder,
    out: &'a mut Decoded,
}

impl<'de> DeserializeSeed<'de> for JsonSeed<'_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for JsonSeed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key_seed(KeySeed)? {
            let value = map.next_value_seed(ValueSeed { depth: 1 })?;
            let scalar = match &value {
                JsonScalar::Int(i) => Scalar::Int(*i),
                JsonScalar::Float(f) => Scalar::Float(*f),
                JsonScalar::Str(s) => Scalar::Str(s),
                JsonScalar::Other => Scalar::Other,
            };
            self.dec
                .field(self.out, &key, scalar)
                .map_err(de::Error::custom)?;
        }
        Ok(())
    }
}

/// A field name, copied inline (JSON keys with escapes are not borrowable).
struct KeySeed;

impl<'de> DeserializeSeed<'de> for KeySeed {
    type Value = MetricName;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeySeed {
    type Value = MetricName;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a field name")
    }

    fn visit_str<E: de::Error>(self, k: &str) -> Result<Self::Value, E> {
        MetricName::try_from(k).map_err(|_| {
            E::custom(format_args!(
                "field name longer than {MAX_METRIC_NAME} bytes"
            ))
        })
    }
}

/// Longest string kept from a value (RFC 3339 timestamps are shorter).
const MAX_VALUE_STR: usize = 48;

enum JsonScalar {
    Int(i128),
    Float(f64),
    Str(heapless::String<MAX_VALUE_STR>),
    Other,
}

/// A field value: scalars are kept, anything nested is consumed (bounded depth).
#[derive(Clone, Copy)]
struct ValueSeed {
    depth: u32,
}

impl ValueSeed {
    fn deeper<E: de::Error>(self) -> Result<Self, E> {
        if self.depth >= MAX_DEPTH {
            return Err(E::custom(format_args!(
                "nested deeper than {MAX_DEPTH} levels"
            )));
        }
        Ok(Self {
            depth: self.depth + 1,
        })
    }
}

impl<'de> DeserializeSeed<'de> for ValueSeed {
    type Value = JsonScalar;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<JsonScalar, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ValueSeed {
    type Value = JsonScalar;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any value")
    }
    fn visit_i64<E>(self, v: i64) -> Result<JsonScalar, E> {
        Ok(JsonScalar::Int(i128::from(v)))
    }
    fn visit_u64<E>(self, v: u64) -> Result<JsonScalar, E> {
        Ok(JsonScalar::Int(i128::from(v)))
    }
    fn visit_f64<E>(self, v: f64) -> Result<JsonScalar, E> {
        Ok(JsonScalar::Float(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<JsonScalar, E> {
        Ok(heapless::String::try_from(v).map_or(JsonScalar::Other, JsonScalar::Str))
    }
    fn visit_bool<E>(self, _: bool) -> Result<JsonScalar, E> {
        Ok(JsonScalar::Other)
    }
    fn visit_unit<E>(self) -> Result<JsonScalar, E> {
        Ok(JsonScalar::Other)
    }
    fn visit_seq<A: de::SeqAccess<'de>>(self, mut a: A) -> Result<JsonScalar, A::Error> {
        let inner = self.deeper()?;
        while a.next_element_seed(inner)?.is_some() {}
        Ok(JsonScalar::Other)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<JsonScalar, A::Error> {
        let inner = self.deeper()?;
        while a.next_key::<IgnoredAny>()?.is_some() {
            a.next_value_seed(inner)?;
        }
        Ok(JsonScalar::Other)
    }
}

/// A minimal zero-copy reader of a CBOR map's top-level fields (RFC 8949):
/// only what decoding needs, every length checked against the input.
mod cbor {
    use super::{MAX_DEPTH, Scalar};

    struct Reader<'a> {
        b: &'a [u8],
        pos: usize,
    }

    /// Major type, additional info, argument (None: indefinite length).
    type Head = (u8, u8, Option<u64>);

    impl<'a> Reader<'a> {
        fn byte(&mut self) -> Result<u8, String> {
            let b = *self.b.get(self.pos).ok_or("truncated")?;
            self.pos += 1;
            Ok(b)
        }

        fn take(&mut self, n: u64) -> Result<&'a [u8], String> {
            let n = usize::try_from(n).map_err(|_| "length out of range")?;
            let end = self
                .pos
                .checked_add(n)
                .filter(|&e| e <= self.b.len())
                .ok_or("truncated")?;
            let s = &self.b[self.pos..end];
            self.pos = end;
            Ok(s)
        }

        fn head(&mut self) -> Result<Head, String> {
            let ib = self.byte()?;
            let (major, info) = (ib >> 5, ib & 0x1f);
            let arg = match info {
                0..=23 => Some(u64::from(info)),
                24..=27 => {
                    let bytes = self.take(1 << (info - 24))?;
                    Some(bytes.iter().fold(0u64, |a, b| (a << 8) | u64::from(*b)))
                }
                31 if matches!(major, 2..=5 | 7) => None,
                _ => {
                    return Err(format!(
                        "invalid additional info {info} for major type {major}"
                    ));
                }
            };
            Ok((major, info, arg))
        }

        /// Items still available bound any count (each item takes at least one byte).
        fn count(&self, n: u64, per_item: u64) -> Result<u64, String> {
            let left = (self.b.len() - self.pos) as u64;
            if n.saturating_mul(per_item) > left {
                return Err("truncated".into());
            }
            Ok(n)
        }

        fn at_break(&mut self) -> Result<bool, String> {
            if *self.b.get(self.pos).ok_or("truncated")? == 0xff {
                self.pos += 1;
                return Ok(true);
            }
            Ok(false)
        }

        /// Reads one value; nested containers are skipped.
        fn value(&mut self, depth: u32) -> Result<Scalar<'a>, String> {
            let (major, info, arg) = self.head()?;
            Ok(match (major, arg) {
                (0, Some(n)) => Scalar::Int(i128::from(n)),
                (1, Some(n)) => Scalar::Int(-1 - i128::from(n)),
                (2, Some(n)) => {
                    self.take(n)?;
                    Scalar::Other
                }
                (3, Some(n)) => {
                    let s =
                        std::str::from_utf8(self.take(n)?).map_err(|_| "invalid UTF-8 in text")?;
                    Scalar::Str(s)
                }
                (2 | 3, None) => {
                    // Indefinite-length string: chunks of the same major type.
                    while !self.at_break()? {
                        let (m, _, a) = self.head()?;
                        let n = a
                            .filter(|_| m == major)
                            .ok_or("bad indefinite string chunk")?;
                        self.take(n)?;
                    }
                    Scalar::Other
                }
                (4 | 5, a) => {
                    if depth >= MAX_DEPTH {
                        return Err(format!("nested deeper than {MAX_DEPTH} levels"));
                    }
                    let per = if major == 5 { 2 } else { 1 };
                    match a {
                        Some(n) => {
                            for _ in 0..self.count(n, per)? * per {
                                self.value(depth + 1)?;
                            }
                        }
                        None => {
                            while !self.at_break()? {
                                for _ in 0..per {
                                    self.value(depth + 1)?;
                                }
                            }
                        }
                    }
                    Scalar::Other
                }
                // Tags (e.g. epoch time) are transparent.
                (6, Some(_)) => {
                    if depth >= MAX_DEPTH {
                        return Err(format!("nested deeper than {MAX_DEPTH} levels"));
                    }
                    self.value(depth + 1)?
                }
                (7, Some(bits)) => match info {
                    25 => Scalar::Float(f16_to_f64(u16::try_from(bits).unwrap_or(0))),
                    26 => {
                        Scalar::Float(f64::from(f32::from_bits(u32::try_from(bits).unwrap_or(0))))
                    }
                    27 => Scalar::Float(f64::from_bits(bits)),
                    _ => Scalar::Other,
                },
                (7, None) => return Err("unexpected break".into()),
                _ => return Err(format!("malformed item of major type {major}")),
            })
        }
    }

    /// Calls `field(name, value)` for each top-level entry with a text key.
    pub(super) fn read_map<'a>(
        bytes: &'a [u8],
        field: &mut dyn FnMut(&str, Scalar<'a>) -> Result<(), String>,
    ) -> Result<(), String> {
        let mut r = Reader { b: bytes, pos: 0 };
        let (major, _, n) = r.head()?;
        if major != 5 {
            return Err("top level is not a map".into());
        }
        let mut remaining = match n {
            Some(n) => Some(r.count(n, 2)?),
            None => None,
        };
        loop {
            match &mut remaining {
                Some(0) => break,
                Some(n) => *n -= 1,
                None => {
                    if r.at_break()? {
                        break;
                    }
                }
            }
            let key = r.value(1)?;
            let value = r.value(1)?;
            if let Scalar::Str(name) = key {
                field(name, value)?;
            }
        }
        if r.pos != bytes.len() {
            return Err(format!("{} trailing bytes", bytes.len() - r.pos));
        }
        Ok(())
    }

    #[allow(clippy::cast_precision_loss)]
    fn f16_to_f64(h: u16) -> f64 {
        let sign = if h & 0x8000 == 0 { 1.0 } else { -1.0 };
        let exp = i32::from((h >> 10) & 0x1f);
        let mant = f64::from(h & 0x3ff);
        match exp {
            0 => sign * mant * 2f64.powi(-24),
            31 if mant == 0.0 => sign * f64::INFINITY,
            31 => f64::NAN,
            _ => sign * (1.0 + mant / 1024.0) * 2f64.powi(exp - 15),
        }
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn half_floats_decode() {
            assert_eq!(super::f16_to_f64(0x3c00), 1.0);
            assert_eq!(super::f16_to_f64(0xc000), -2.0);
            assert_eq!(super::f16_to_f64(0x3555), 0.333_251_953_125);
            assert!(super::f16_to_f64(0x7e00).is_nan());
        }
    }
}

#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
fn as_u64(v: f64) -> u64 {
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

// Beyond this (year ~2255) a timestamp is nonsense; keeps later i64 math safe.
const MAX_TS_MS: i128 = 9_000_000_000_000;

/// Converts an integer epoch in `unit` to milliseconds.
#[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation)]
pub fn int_to_ms(v: i128, unit: TimestampUnit) -> DeviceTs {
    if v <= 0 {
        return DeviceTs::Invalid("timestamp <= 0");
    }
    let ms = match unit_for(v as f64, unit) {
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
#[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation)]
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
mod tests {
    use super::*;

    fn build_decoder(format: PayloadFormat, unit: TimestampUnit) -> Decoder {
        Decoder::new(&PayloadConfig {
            format,
            timestamp_field: "ts".into(),
            timestamp_unit: unit,
            seq_field: Some("seq".into()),
        })
    }

    fn cbor(v: &serde_json::Value) -> Vec<u8> {
        let mut out = Vec::new();
        ciborium::ser::into_writer(v, &mut out).unwrap();
        out
    }

    fn ts_of(d: &Decoder, payload: &[u8]) -> DeviceTs {
        d.decode(payload).unwrap().ts
    }

    #[test]
    fn json_reading_yields_timestamp_seq_and_numeric_metrics_only() {
        let d = build_decoder(PayloadFormat::Auto, TimestampUnit::Auto);
        let p = d
            .decode(br#"{"ts": 1764480000123, "seq": 17, "temp": 21.5, "hum": 40, "ok": true, "name": "x", "nested": {"a": 1}, "arr": [1,2]}"#)
            .unwrap();
        assert_eq!(p.ts, DeviceTs::Ms(1_764_480_000_123));
        assert_eq!(p.seq, Some(17));
        let names: Vec<(&str, f64)> = p.metrics.iter().map(|(n, v)| (n.as_str(), *v)).collect();
        assert_eq!(names, vec![("temp", 21.5), ("hum", 40.0)]);
    }

    #[test]
    fn cbor_reading_decodes_like_json_in_auto_and_cbor_modes() {
        let v = serde_json::json!({"ts": 1_764_480_000_123_i64, "seq": 3, "temp": -4.25});
        for f in [PayloadFormat::Auto, PayloadFormat::Cbor] {
            let d = build_decoder(f, TimestampUnit::Auto);
            let p = d.decode(&cbor(&v)).unwrap();
            assert_eq!(p.ts, DeviceTs::Ms(1_764_480_000_123));
            assert_eq!(p.seq, Some(3));
            assert_eq!(p.metrics[0].1, -4.25);
        }
        let json = build_decoder(PayloadFormat::Json, TimestampUnit::Auto);
        assert!(
            json.decode(&cbor(&v)).is_err(),
            "json mode must not accept CBOR"
        );
        let only_cbor = build_decoder(PayloadFormat::Cbor, TimestampUnit::Auto);
        assert!(
            only_cbor.decode(br#"{"ts":1}"#).is_err(),
            "cbor mode must not accept JSON"
        );
    }

    #[test]
    fn auto_unit_is_chosen_by_magnitude() {
        let d = build_decoder(PayloadFormat::Json, TimestampUnit::Auto);
        assert_eq!(
            ts_of(&d, br#"{"ts": 1764480000}"#),
            DeviceTs::Ms(1_764_480_000_000)
        );
        assert_eq!(
            ts_of(&d, br#"{"ts": 1764480000.123}"#),
            DeviceTs::Ms(1_764_480_000_123)
        );
        assert_eq!(
            ts_of(&d, br#"{"ts": 1764480000123}"#),
            DeviceTs::Ms(1_764_480_000_123)
        );
        assert_eq!(
            ts_of(&d, br#"{"ts": 1764480000123456}"#),
            DeviceTs::Ms(1_764_480_000_123)
        );
        assert_eq!(
            ts_of(&d, br#"{"ts": 1764480000123456789}"#),
            DeviceTs::Ms(1_764_480_000_123)
        );
        assert_eq!(
            ts_of(&d, br#"{"ts": 1.764480000123e12}"#),
            DeviceTs::Ms(1_764_480_000_123)
        );
    }

    #[test]
    fn explicit_units_are_obeyed() {
        let cases = [
            (TimestampUnit::S, "1764480000", 1_764_480_000_000),
            (TimestampUnit::S, "1.5", 1_500),
            (TimestampUnit::Ms, "1764480000", 1_764_480_000),
            (TimestampUnit::Us, "1764480000123456", 1_764_480_000_123),
            (TimestampUnit::Ns, "1764480000123456789", 1_764_480_000_123),
        ];
        for (unit, ts, want) in cases {
            let d = build_decoder(PayloadFormat::Json, unit);
            let body = format!(r#"{{"ts": {ts}}}"#);
            assert_eq!(
                ts_of(&d, body.as_bytes()),
                DeviceTs::Ms(want),
                "{unit:?} {ts}"
            );
        }
    }

    #[test]
    fn rfc3339_strings_with_z_and_offsets_parse() {
        let d = build_decoder(PayloadFormat::Json, TimestampUnit::Auto);
        let want = DeviceTs::Ms(1_764_480_000_123);
        assert_eq!(ts_of(&d, br#"{"ts": "2025-11-30T05:20:00.123Z"}"#), want);
        assert_eq!(
            ts_of(&d, br#"{"ts": "2025-11-30T07:20:00.123+02:00"}"#),
            want
        );
        assert_eq!(
            ts_of(&d, br#"{"ts": "2025-11-29T23:50:00.123-05:30"}"#),
            want
        );
        assert_eq!(
            ts_of(&d, br#"{"ts": "2025-11-30T05:20:00.123456789z"}"#),
            want
        );
        assert_eq!(
            ts_of(&d, br#"{"ts": "2025-11-30T05:20:00Z"}"#),
            DeviceTs::Ms(1_764_480_000_000)
        );
        assert_eq!(
            parse_rfc3339("2024-02-29T00:00:00Z"),
            Some(1_709_164_800_000)
        );
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), Some(0));
        for bad in [
            "2025-13-01T00:00:00Z",
            "2025-02-30T00:00:00Z",
            "2025-11-30T24:00:00Z",
            "2025-11-30T05:20:00",
            "2025-11-30T05:20:00.Z",
            "2025-11-30T05:20:00+0200",
            "yesterday at noon",
            "",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
    }

    #[test]
    fn unusable_timestamps_are_invalid_not_errors() {
        let d = build_decoder(PayloadFormat::Json, TimestampUnit::Auto);
        assert_eq!(ts_of(&d, br#"{"temp": 1}"#), DeviceTs::Missing);
        for body in [
            &br#"{"ts": "soon"}"#[..],
            br#"{"ts": 0}"#,
            br#"{"ts": -5}"#,
            br#"{"ts": null}"#,
            br#"{"ts": true}"#,
            br#"{"ts": [1]}"#,
            br#"{"ts": 1e300}"#,
        ] {
            assert!(
                matches!(ts_of(&d, body), DeviceTs::Invalid(_)),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
        // {"ts": NaN} as CBOR (JSON cannot express it).
        let mut nan_map = vec![0xa1, 0x62, b't', b's', 0xfb];
        nan_map.extend_from_slice(&f64::NAN.to_be_bytes());
        let auto = build_decoder(PayloadFormat::Auto, TimestampUnit::Auto);
        assert!(matches!(ts_of(&auto, &nan_map), DeviceTs::Invalid(_)));
    }

    #[test]
    fn non_objects_and_garbage_are_decode_errors() {
        let d = build_decoder(PayloadFormat::Auto, TimestampUnit::Auto);
        let deep = format!("{{\"a\":{}1{}}}", "[".repeat(500), "]".repeat(500));
        let too_many: String = (0..40)
            .map(|i| format!("\"m{i}\":{i}"))
            .collect::<Vec<_>>()
            .join(",");
        let long_name = format!("{{\"{}\":1}}", "n".repeat(65));
        for body in [
            &b"[1,2]"[..],
            b"42",
            b"\"str\"",
            b"",
            b"{\"ts\": 17",
            b"{\"ts\": 1} trailing",
            b"\xff\xfe",
            deep.as_bytes(),
            format!("{{{too_many}}}").as_bytes(),
            long_name.as_bytes(),
            &[0xa1, 0x61, b'x'],
            &[0xa1, 0x61, b'x', 0x01, 0x00],
        ] {
            assert!(
                d.decode(body).is_err(),
                "{:?}",
                String::from_utf8_lossy(body)
            );
        }
        let big = vec![b' '; MAX_PAYLOAD + 1];
        assert!(d.decode(&big).unwrap_err().0.contains("64 KiB"));
    }

    #[test]
    fn seq_that_is_not_a_non_negative_integer_is_ignored() {
        let d = build_decoder(PayloadFormat::Json, TimestampUnit::Auto);
        assert_eq!(
            d.decode(br#"{"ts":1764480000000,"seq":-1}"#).unwrap().seq,
            None
        );
        assert_eq!(
            d.decode(br#"{"ts":1764480000000,"seq":"7"}"#).unwrap().seq,
            None
        );
        assert_eq!(
            d.decode(br#"{"ts":1764480000000,"seq":1.5}"#).unwrap().seq,
            None
        );
        assert_eq!(
            d.decode(br#"{"ts":1764480000000,"seq":0}"#).unwrap().seq,
            Some(0)
        );
    }

    #[test]
    fn cbor_indefinite_lengths_tags_and_nesting_are_handled() {
        let d = build_decoder(PayloadFormat::Auto, TimestampUnit::Auto);
        // {_ "ts": 1(1764480000), "t": [_ 1, {"x": h'00'}], "s": (_ "a" "b"), "v": 1.5f16 }
        let mut b = vec![0xbf, 0x62, b't', b's', 0xc1, 0x1a];
        b.extend_from_slice(&1_764_480_000u32.to_be_bytes());
        b.extend_from_slice(&[0x61, b't', 0x9f, 0x01, 0xa1, 0x61, b'x', 0x41, 0x00, 0xff]);
        b.extend_from_slice(&[0x61, b's', 0x7f, 0x61, b'a', 0x61, b'b', 0xff]);
        b.extend_from_slice(&[0x61, b'v', 0xf9, 0x3e, 0x00, 0xff]);
        let p = d.decode(&b).unwrap();
        assert_eq!(p.ts, DeviceTs::Ms(1_764_480_000_000));
        assert_eq!(p.metrics.len(), 1);
        assert_eq!((p.metrics[0].0.as_str(), p.metrics[0].1), ("v", 1.5));
        // A map claiming more entries than bytes exist is truncated, not a huge loop.
        assert!(
            d.decode(&[0xbb, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff])
                .is_err()
        );
        // Deep nesting is garbage.
        let mut deep = vec![0xa1, 0x61, b'a'];
        deep.extend(std::iter::repeat_n(0x81, 100));
        deep.push(0x01);
        assert!(d.decode(&deep).unwrap_err().0.contains("nested"));
    }

    fn json_value() -> impl proptest::strategy::Strategy<Value = serde_json::Value> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::from),
            any::<i64>().prop_map(serde_json::Value::from),
            any::<u64>().prop_map(serde_json::Value::from),
            (-1e12f64..1e12).prop_map(serde_json::Value::from),
            "[a-z0-9:.TZ+-]{0,30}".prop_map(serde_json::Value::from),
        ];
        leaf.prop_recursive(3, 16, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
                proptest::collection::btree_map("[a-z]{1,3}", inner, 0..4)
                    .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest::proptest! {
        /// The CBOR reader and the JSON visitor agree on every object.
        #[test]
        fn cbor_and_json_encodings_decode_alike(
            fields in proptest::collection::btree_map("[a-z]{1,4}|ts|seq", json_value(), 0..12)
        ) {
            let obj = serde_json::Value::Object(fields.into_iter().collect());
            let d = build_decoder(PayloadFormat::Auto, TimestampUnit::Auto);
            let from_json = d.decode(&serde_json::to_vec(&obj).unwrap());
            let from_cbor = d.decode(&cbor(&obj));
            proptest::prop_assert_eq!(from_json.is_ok(), from_cbor.is_ok());
            if let (Ok(a), Ok(b)) = (from_json, from_cbor) {
                proptest::prop_assert_eq!(a, b);
            }
        }
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            for f in [PayloadFormat::Auto, PayloadFormat::Json, PayloadFormat::Cbor] {
                let _ = build_decoder(f, TimestampUnit::Auto).decode(&bytes);
            }
        }

        #[test]
        fn arbitrary_cbor_maps_never_panic(prefix in 0xa0u8..=0xbf, rest in proptest::collection::vec(proptest::num::u8::ANY, 0..256)) {
            let mut bytes = vec![prefix];
            bytes.extend(rest);
            let _ = build_decoder(PayloadFormat::Auto, TimestampUnit::Auto).decode(&bytes);
        }

        #[test]
        fn arbitrary_timestamp_strings_never_panic(s in "\\PC{0,40}") {
            let _ = parse_rfc3339(&s);
        }
    }
}
