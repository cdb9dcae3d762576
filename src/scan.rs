//! Byte scans eight bytes at a time, for the short strings of every message
//! (topics, JSON keys and values): a byte loop cost more than the rest of
//! their handling.

const ONES: u64 = 0x0101_0101_0101_0101;
const TOPS: u64 = ONES << 7;

/// A top bit in the lowest byte of `x` that is zero (and maybe in bytes above it).
fn zero_byte(x: u64) -> u64 {
    x.wrapping_sub(ONES) & !x & TOPS
}

/// The length of the run at the start of `b` of bytes JSON keeps as they are in
/// a string: not `"`, `\` or a control byte below 0x20.
pub fn plain_run(b: &[u8]) -> usize {
    let mut at = 0;
    while let Some(c) = b.get(at..at + 8) {
        let x = u64::from_le_bytes(c.try_into().unwrap_or_default());
        // Below 0x20: x − 0x20 borrows into the top bit of a byte whose own top bit is clear.
        let stop = zero_byte(x ^ (ONES * u64::from(b'"')))
            | zero_byte(x ^ (ONES * u64::from(b'\\')))
            | (x.wrapping_sub(ONES * 0x20) & !x & TOPS);
        if stop != 0 {
            return at + (stop.trailing_zeros() / 8) as usize;
        }
        at += 8;
    }
    at + b[at..]
        .iter()
        .position(|&c| c == b'"' || c == b'\\' || c < 0x20)
        .unwrap_or(b.len() - at)
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// The run ends where a byte loop finds the first quote, backslash or
        /// control byte, over lengths either side of eight and the bytes next to them.
        #[test]
        fn plain_run_stops_where_a_byte_loop_stops(
            b in proptest::collection::vec(proptest::prop_oneof![
                1 => proptest::prelude::Just(b'"'), 1 => proptest::prelude::Just(b'\\'),
                1 => proptest::prelude::Just(0x1fu8), 1 => proptest::prelude::Just(0u8),
                2 => proptest::prelude::Just(0x20u8), 2 => proptest::prelude::Just(0x21u8),
                2 => proptest::prelude::Just(0x5du8), 2 => proptest::prelude::Just(0xa2u8),
                2 => proptest::prelude::Just(0xffu8), 2 => proptest::prelude::Just(0x80u8),
                30 => proptest::prelude::any::<u8>(),
            ], 0..40),
        ) {
            let want = b.iter().position(|&c| c == b'"' || c == b'\\' || c < 0x20).unwrap_or(b.len());
            proptest::prop_assert_eq!(plain_run(&b), want);
        }
    }
}
