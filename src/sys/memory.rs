//! Giving freed heap back to the operating system.
//!
//! glibc keeps what a burst freed (10 000 windows closing in one tick pass
//! through the engine, the commit, the outbox and the uplink) inside its arenas,
//! so the resident set stayed at the burst's peak. `malloc_trim` hands whole
//! free pages back.

/// Returns free heap pages to the kernel (glibc); nothing elsewhere.
pub fn give_back() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists under its locks.
    unsafe {
        libc::malloc_trim(0);
    }
}
