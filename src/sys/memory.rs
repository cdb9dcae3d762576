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

/// The process's resident set in bytes (`/proc/self/statm`), None where unreadable.
pub fn rss() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages.saturating_mul(page_size()))
}

fn page_size() -> u64 {
    // SAFETY: sysconf only reads a constant of the running kernel.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(n).ok().filter(|&n| n > 0).unwrap_or(4096)
}

/// The memory limit of this process's cgroup and its ancestors (systemd's
/// `MemoryMax=`: cgroup v2 `memory.max`, v1 `memory.limit_in_bytes`), the lowest one
/// set; None when none is.
pub fn cgroup_limit() -> Option<u64> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    cgroup_limit_in(&own, std::path::Path::new("/sys/fs/cgroup"))
}

/// [`cgroup_limit`] for a `/proc/self/cgroup` text and a cgroup file system root.
pub fn cgroup_limit_in(own: &str, root: &std::path::Path) -> Option<u64> {
    let mut lowest: Option<u64> = None;
    for line in own.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let (dir, file) = if controllers.is_empty() {
            (root.to_path_buf(), "memory.max")
        } else if controllers.split(',').any(|c| c == "memory") {
            (root.join("memory"), "memory.limit_in_bytes")
        } else {
            continue;
        };
        // The cgroup and each ancestor up to the root: the lowest limit binds.
        for rel in std::path::Path::new(path.trim_start_matches('/')).ancestors() {
            if let Ok(v) = std::fs::read_to_string(dir.join(rel).join(file))
                && let Ok(bytes) = v.trim().parse::<u64>()
                // v1 writes "no limit" as a page-rounded i64::MAX.
                && bytes < (1 << 60)
            {
                lowest = Some(lowest.map_or(bytes, |l| l.min(bytes)));
            }
        }
    }
    lowest
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lowest_limit_of_the_cgroup_and_its_ancestors_binds() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        std::fs::create_dir_all(r.join("system.slice/tidemark.service")).unwrap();
        std::fs::write(
            r.join("system.slice/tidemark.service/memory.max"),
            "268435456\n",
        )
        .unwrap();
        std::fs::write(r.join("system.slice/memory.max"), "max\n").unwrap();
        let own = "0::/system.slice/tidemark.service\n";
        assert_eq!(cgroup_limit_in(own, r), Some(256 << 20));
        std::fs::write(r.join("system.slice/memory.max"), "104857600\n").unwrap();
        assert_eq!(cgroup_limit_in(own, r), Some(100 << 20));
        std::fs::write(r.join("system.slice/tidemark.service/memory.max"), "max\n").unwrap();
        std::fs::write(r.join("system.slice/memory.max"), "max\n").unwrap();
        assert_eq!(cgroup_limit_in(own, r), None);
        // cgroup v1: the memory controller's hierarchy; "no limit" is a huge number.
        std::fs::create_dir_all(r.join("memory/tm")).unwrap();
        std::fs::write(
            r.join("memory/tm/memory.limit_in_bytes"),
            "9223372036854771712\n",
        )
        .unwrap();
        let v1 = "4:cpu,cpuacct:/tm\n3:memory:/tm\n";
        assert_eq!(cgroup_limit_in(v1, r), None);
        std::fs::write(r.join("memory/tm/memory.limit_in_bytes"), "67108864\n").unwrap();
        assert_eq!(cgroup_limit_in(v1, r), Some(64 << 20));
        assert!(rss().unwrap() > 0);
    }
}
