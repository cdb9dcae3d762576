//! Byte scans eight bytes at a time, for the short strings of every message
//! (topic levels, capture topics, output strings): a byte loop cost more than
//! the rest of their handling.

const ONES: u64 = 0x0101_0101_0101_0101;
const TOPS: u64 = ONES << 7;

/// A top bit in the lowest byte of `x` that is zero (and maybe in bytes above it).
fn zero_byte(x: u64) -> u64 {
    x.wrapping_sub(ONES) & !x & TOPS
}

/// The first `byte` in `b` (topic levels: a byte loop cost more than the rest of a topic's match).
pub fn find(b: &[u8], byte: u8) -> Option<usize> {
    let mut at = 0;
    while let Some(c) = b.get(at..at + 8) {
        let z = zero_byte(word(c) ^ (ONES * u64::from(byte)));
        if z != 0 {
            return Some(at + (z.trailing_zeros() / 8) as usize);
        }
        at += 8;
    }
    b[at..].iter().position(|&c| c == byte).map(|i| at + i)
}

fn word(c: &[u8]) -> u64 {
    u64::from_le_bytes(c.try_into().unwrap_or_default())
}

/// The length of the run at the start of `b` of bytes JSON keeps as they are in
/// a string: not `"`, `\` or a control byte below 0x20.
pub fn plain_run(b: &[u8]) -> usize {
    let mut at = 0;
    while let Some(c) = b.get(at..at + 8) {
        let x = word(c);
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
        /// `find` gives the first `/` a byte loop finds, over lengths either side of
        /// eight and the bytes next to `/` (and its top-bit twin).
        #[test]
        fn find_gives_the_first_one(
            b in proptest::collection::vec(proptest::prop_oneof![
                1 => proptest::prelude::Just(b'/'), 2 => proptest::prelude::Just(b'.'),
                2 => proptest::prelude::Just(b'0'), 2 => proptest::prelude::Just(0xafu8),
                2 => proptest::prelude::Just(0u8), 2 => proptest::prelude::Just(0xffu8),
                20 => proptest::prelude::any::<u8>(),
            ], 0..40),
        ) {
            proptest::prop_assert_eq!(find(&b, b'/'), b.iter().position(|&c| c == b'/'));
        }

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
