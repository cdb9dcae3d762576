//! Payload decoding (docs/reference.md#input): a JSON object or CBOR map into a [`Decoded`]
//! value. Bad input is an `Err(DecodeError)` value, never a panic. Fields are
//! filed straight into a reused output as they stream by: no tree is built,
//! nothing is allocated on the hot path.

use std::fmt;

use serde::de::DeserializeSeed;

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
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
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
        out.clear();
        if bytes.len() > MAX_PAYLOAD {
            // No size in the detail: the journal keeps only the first 64 KiB + 1.
            return Err(DecodeError("payload exceeds 64 KiB".to_owned()));
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
            // Not UTF-8: not JSON, and serde's path words the error.
            let text = std::str::from_utf8(bytes).ok();
            match text.and_then(|t| self.decode_json_prefix(t, out)) {
                Some(end) if fast::blank_from(bytes, end) => Ok(()),
                _ => self.decode_serde(bytes, out),
            }
        }
    }

    /// A JSON payload through serde: every shape, and the wording of every error.
    fn decode_serde(&self, bytes: &[u8], out: &mut Decoded) -> Result<(), DecodeError> {
        out.clear();
        let mut de = serde_json::Deserializer::from_slice(bytes);
        JsonSeed { dec: self, out }
            .deserialize(&mut de)
            .and_then(|()| de.end())
            .map_err(|e| DecodeError(format!("json: {e}")))
    }

    /// The JSON object at the start of `b` decoded into `out` in one pass when it is
    /// the common flat shape and `[payload]` reads it as JSON: its length, and `out`
    /// as [`Decoder::decode_into`] of those bytes leaves it. None: not that case.
    pub fn decode_json_prefix(&self, b: &str, out: &mut Decoded) -> Option<usize> {
        if self.format == PayloadFormat::Cbor || !b.starts_with('{') {
            return None;
        }
        out.clear();
        let mut field = |name: &str, v: Scalar<'_>| self.field(out, name, v).is_ok();
        fast::object(b, 0, &mut field).filter(|&n| n <= MAX_PAYLOAD)
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
            if name.len() > MAX_METRIC_NAME {
                return Err(format!("field name longer than {MAX_METRIC_NAME} bytes"));
            }
            // Looked up by its text: the name is copied only when it is new.
            if let Some(slot) = out.metrics.iter_mut().find(|(n, _)| n.as_str() == name) {
                slot.1 = v;
            } else if out.metrics.is_full() {
                return Err(format!("more than {MAX_METRICS} metric fields"));
            } else {
                let name = MetricName::try_from(name)
                    .map_err(|_| format!("field name longer than {MAX_METRIC_NAME} bytes"))?;
                let _ = out.metrics.push((name, v));
            }
        }
        Ok(())
    }
}

impl Decoded {
    /// Nothing decoded (a reused value before the next payload).
    fn clear(&mut self) {
        self.ts = DeviceTs::Missing;
        self.seq = None;
        self.metrics.clear();
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

/// `i as f64`. Below 2^53 from two exact halves: an i128's conversion is a library
/// call, and LLVM folds an `i64` detour back into it.
fn int_to_f64(i: i128) -> f64 {
    if i.unsigned_abs() >= 1 << 53 {
        return i as f64;
    }
    #[allow(clippy::cast_possible_truncation)]
    let x = i as i64;
    #[allow(clippy::cast_possible_truncation)]
    let (hi, lo) = ((x >> 32) as i32, x as u32);
    f64::from(hi) * 4_294_967_296.0 + f64::from(lo)
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
    fn to_metric(self) -> Option<f64> {
        match self {
            Scalar::Int(i) => Some(int_to_f64(i)),
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

mod cbor;
mod fast;
pub(crate) use fast::eight_digits;
mod json;
#[cfg(test)]
mod tests;
mod timestamp;

use json::JsonSeed;
use timestamp::as_u64;
pub use timestamp::{float_to_ms, int_to_ms, parse_rfc3339};
