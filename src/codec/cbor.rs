//! A minimal zero-copy reader of a CBOR map's top-level fields (RFC 8949):
//! only what decoding needs, every length checked against the input.
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
                let s = std::str::from_utf8(self.take(n)?).map_err(|_| "invalid UTF-8 in text")?;
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
                26 => Scalar::Float(f64::from(f32::from_bits(u32::try_from(bits).unwrap_or(0)))),
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
