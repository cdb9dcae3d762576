//! LEB128 varints of the packed state (fired windows, clock buckets).

/// Appends `x`, seven bits a byte, low first.
pub(crate) fn put(out: &mut Vec<u8>, mut x: u64) {
    while x >= 0x80 {
        #[allow(clippy::cast_possible_truncation)]
        out.push((x as u8) | 0x80);
        x >>= 7;
    }
    #[allow(clippy::cast_possible_truncation)]
    out.push(x as u8);
}

/// The varint at `at` of bytes this process wrote (panics past their end); `at` moves past it.
pub(crate) fn read(b: &[u8], at: &mut usize) -> u64 {
    let mut x = 0u64;
    let mut shift = 0;
    loop {
        let byte = b[*at];
        *at += 1;
        x |= u64::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            return x;
        }
        shift += 7;
    }
}

/// The varint at `at` of stored bytes: None when they end or run past 64 bits.
pub(crate) fn get(bytes: &[u8], at: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *bytes.get(*at)?;
        *at += 1;
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// Bytes [`put`] writes for `x`.
pub(crate) fn len(x: u64) -> usize {
    (64 - (x | 1).leading_zeros() as usize).div_ceil(7)
}
