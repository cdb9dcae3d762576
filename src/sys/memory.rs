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

/// Blocks at least this large come straight from the kernel and go back to it when freed.
const MMAP_THRESHOLD: libc::c_int = 128 * 1024;

/// One arena for every thread. glibc gives each thread that allocates while another
/// holds the lock an arena of its own (up to 8 per core); the store thread, the
/// runtime's workers and the uplink's then each keep a burst's freed room apart.
/// The engine allocates nothing per reading, so the shared lock is rarely taken.
const ARENAS: libc::c_int = 1;

/// Fixes glibc's arenas at [`ARENAS`] and its mmap threshold at 128 KiB. Left to
/// itself glibc raises the threshold to the largest block freed so far (up to
/// 32 MiB), after which a burst's large buffers (a tick's window results, their journal record, a checkpoint's device
/// list) are carved from the arenas and stay resident after they are freed.
/// Call before other threads start.
pub fn tune() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets the allocator's parameters; called before other threads.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
        libc::mallopt(libc::M_ARENA_MAX, ARENAS);
    }
}

/// Drops a reused buffer's room once a burst has grown it past `keep` elements:
/// room kept for a rare burst is resident for the life of the process.
pub fn shed<T>(v: &mut Vec<T>, keep: usize) {
    if v.capacity() > keep.saturating_mul(2) {
        v.shrink_to(keep.max(v.len()));
    }
}

/// [`shed`] for a queue: once a burst has passed through it, its room goes back.
pub fn shed_queue<T>(q: &mut std::collections::VecDeque<T>, keep: usize) {
    if q.capacity() > keep.saturating_mul(2).max(q.len().saturating_mul(4)) {
        q.shrink_to(keep.max(q.len()));
    }
}
