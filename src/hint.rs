//! Cache hints: memory the engine is about to read asked for ahead. A hint
//! changes nothing the program does, only when data arrives; a leaf the pure
//! core may use.

/// Asks the CPU to bring the cache lines `v` spans in ahead of their use: a hint,
/// with no effect on what the program does. Replay looks up the devices of the
/// next records with it (their first touches were a quarter of its CPU time).
#[inline]
pub fn prefetch<T: ?Sized>(v: &T) {
    let (p, n) = (std::ptr::from_ref(v).cast::<u8>(), std::mem::size_of_val(v));
    let mut off = 0;
    while off < n {
        line(p.wrapping_add(off));
        off += 64;
    }
    if n > 0 {
        line(p.wrapping_add(n - 1));
    }
}

#[inline]
#[allow(unused_unsafe)]
fn line(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch never faults nor changes memory; `p` points into a live value.
    unsafe {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        _mm_prefetch::<_MM_HINT_T0>(p.cast());
    }
    #[cfg(target_arch = "aarch64")]
    // SAFETY: as above; `prfm` only hints the cache.
    unsafe {
        std::arch::asm!("prfm pldl1keep, [{0}]", in(reg) p, options(nostack, preserves_flags, readonly));
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let _ = p;
}
