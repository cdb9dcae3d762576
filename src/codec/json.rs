//! JSON payloads: a streaming visitor filing fields straight into the output.

use std::fmt;

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, Visitor};

use super::{Decoded, Decoder, MAX_DEPTH, MAX_METRIC_NAME, MetricName, Scalar};

/// JSON: a streaming visitor filing fields straight into the output.
pub(super) struct JsonSeed<'a> {
    pub(super) dec: &'a Decoder,
    pub(super) out: &'a mut Decoded,
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
