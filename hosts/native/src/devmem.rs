//! What memory this device can give, and arenas allocated without aborting.
//!
//! With no `--budget`, `frugal train` plans for the memory the system can give now, as a phone's OS
//! would set it: the smaller of `MemAvailable` (`/proc/meminfo`) and the cgroup's room (cgroup v2
//! `memory.max − memory.current`, v1 `memory.limit_in_bytes − memory.usage_in_bytes`, the tightest of
//! the process's cgroup and its ancestors). When none of these can be read (not Linux, no procfs) the
//! budget is unlimited, as before.
//!
//! Arenas and buffers sized from a plan are allocated with `try_reserve_exact`
//! ([`alloc_zeroed`]), so a plan the allocator cannot back is a [`MemoryError`] naming the bytes
//! needed and available, never `memory allocation of N bytes failed` and SIGABRT.
use std::fmt;
use std::path::{Path, PathBuf};

use frugal_core::budget::Budget;

/// Where a device-memory figure came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceMemory {
    /// Bytes the process can still use.
    pub bytes: u64,
    /// What set it: `"MemAvailable"`, `"cgroup v2 memory.max"`, `"cgroup v1 memory.limit_in_bytes"`.
    pub source: &'static str,
}

/// `MemAvailable` from the text of `/proc/meminfo`, in bytes (the file says kB, meaning KiB).
pub fn parse_meminfo_available(text: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix("MemAvailable:")?;
        let mut it = rest.split_whitespace();
        let n: u64 = it.next()?.parse().ok()?;
        match it.next() {
            Some("kB") => n.checked_mul(1024),
            None => Some(n),
            Some(_) => None,
        }
    })
}

/// A cgroup limit file (`memory.max`, `memory.limit_in_bytes`): None for `max` or for v1's "no
/// limit" (a value of 2^60 or more, e.g. 9223372036854771712), else the bytes.
pub fn parse_cgroup_limit(text: &str) -> Option<u64> {
    let t = text.trim();
    if t == "max" {
        return None;
    }
    t.parse::<u64>().ok().filter(|&v| v < 1 << 60)
}

/// A cgroup usage file (`memory.current`, `memory.usage_in_bytes`) in bytes.
pub fn parse_cgroup_usage(text: &str) -> Option<u64> {
    text.trim().parse().ok()
}

/// The process's cgroup directories from the text of `/proc/self/cgroup`: the v2 path (`0::/a/b`)
/// and the v1 memory controller's path (`N:memory:/a/b` or a list containing `memory`).
pub fn parse_proc_cgroup(text: &str) -> (Option<String>, Option<String>) {
    let mut v2 = None;
    let mut v1 = None;
    for l in text.lines() {
        let mut f = l.splitn(3, ':');
        let (Some(id), Some(ctrl), Some(path)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        if id == "0" && ctrl.is_empty() {
            v2 = Some(path.to_string());
        } else if ctrl.split(',').any(|c| c == "memory") {
            v1 = Some(path.to_string());
        }
    }
    (v2, v1)
}

/// Room left under the tightest limit among `dir` and its ancestors up to `root`: `limit − usage` of
/// each level that has a limit (usage read at the same level; missing usage counts as 0).
fn cgroup_room(root: &Path, rel: &str, limit_file: &str, usage_file: &str) -> Option<u64> {
    let mut dir = root.join(rel.trim_start_matches('/'));
    let mut best: Option<u64> = None;
    loop {
        if let Some(limit) = read(&dir.join(limit_file))
            .as_deref()
            .and_then(parse_cgroup_limit)
        {
            let used = read(&dir.join(usage_file))
                .as_deref()
                .and_then(parse_cgroup_usage)
                .unwrap_or(0);
            let room = limit.saturating_sub(used);
            best = Some(best.map_or(room, |b| b.min(room)));
        }
        if dir == root || !dir.pop() || !dir.starts_with(root) {
            break;
        }
    }
    best
}

fn read(p: &Path) -> Option<String> {
    std::fs::read_to_string(p).ok()
}

/// The memory the system can give this process now, read from `proc` (normally `/proc`) and
/// `cgroup` (normally `/sys/fs/cgroup`): the smallest of `MemAvailable` and the cgroup room. None when
/// nothing could be read.
pub fn available_from(proc: &Path, cgroup: &Path) -> Option<DeviceMemory> {
    let mut best: Option<DeviceMemory> = None;
    let mut offer = |bytes: Option<u64>, source: &'static str| {
        if let Some(bytes) = bytes {
            if best.as_ref().is_none_or(|b| bytes < b.bytes) {
                best = Some(DeviceMemory { bytes, source });
            }
        }
    };
    offer(
        read(&proc.join("meminfo"))
            .as_deref()
            .and_then(parse_meminfo_available),
        "MemAvailable",
    );
    let (v2, v1) = read(&proc.join("self/cgroup"))
        .as_deref()
        .map(parse_proc_cgroup)
        .unwrap_or((None, None));
    if let Some(p) = v2 {
        offer(
            cgroup_room(cgroup, &p, "memory.max", "memory.current"),
            "cgroup v2 memory.max",
        );
    }
    if let Some(p) = v1 {
        let root: PathBuf = cgroup.join("memory");
        offer(
            cgroup_room(&root, &p, "memory.limit_in_bytes", "memory.usage_in_bytes"),
            "cgroup v1 memory.limit_in_bytes",
        );
    }
    best
}

/// [`available_from`] `/proc` and `/sys/fs/cgroup`.
pub fn available() -> Option<DeviceMemory> {
    available_from(Path::new("/proc"), Path::new("/sys/fs/cgroup"))
}

/// The budget when the user gives none: what the device can give ([`available`]), or unlimited when
/// that cannot be read. The memory is returned too, to say where the budget came from.
pub fn default_budget() -> (Budget, Option<DeviceMemory>) {
    match available() {
        Some(m) => (
            Budget::new(usize::try_from(m.bytes).unwrap_or(usize::MAX)),
            Some(m),
        ),
        None => (Budget::UNLIMITED, None),
    }
}

/// An allocation the system refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryError {
    /// What was being allocated (`"the arena"`, `"the batch buffer"`).
    pub what: &'static str,
    /// Bytes asked for.
    pub needed: usize,
    /// What the device could give when it was asked, if known.
    pub available: Option<DeviceMemory>,
}

impl fmt::Display for MemoryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "out of memory: {} needs {} bytes",
            self.what, self.needed
        )?;
        match &self.available {
            Some(m) => write!(
                f,
                " but the device can give {} bytes ({}); plan for less with --budget",
                m.bytes, m.source
            ),
            None => write!(f, " and the system refused it; plan for less with --budget"),
        }
    }
}

impl std::error::Error for MemoryError {}

/// `n` zeroed values, or a [`MemoryError`] (naming `what`) when the allocator refuses.
pub fn alloc_zeroed<T: Clone + Default>(
    n: usize,
    what: &'static str,
) -> Result<Vec<T>, MemoryError> {
    let mut v = Vec::new();
    let bytes = n.saturating_mul(std::mem::size_of::<T>());
    if v.try_reserve_exact(n).is_err() {
        return Err(MemoryError {
            what,
            needed: bytes,
            available: available(),
        });
    }
    v.resize(n, T::default());
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::scratch_dir;

    const MEMINFO: &str = "MemTotal:       16314444 kB\nMemFree:         1204364 kB\nMemAvailable:    9876543 kB\nBuffers:          321000 kB\n";

    #[test]
    fn meminfo_available_is_read_in_bytes() {
        assert_eq!(parse_meminfo_available(MEMINFO), Some(9_876_543 * 1024));
        assert_eq!(parse_meminfo_available("MemTotal: 5 kB\n"), None);
        assert_eq!(parse_meminfo_available("MemAvailable: lots kB\n"), None);
        assert_eq!(parse_meminfo_available("MemAvailable: 5 MB\n"), None);
        assert_eq!(
            parse_meminfo_available("MemAvailable: 18446744073709551615 kB\n"),
            None,
            "an overflowing figure is unreadable, not wrapped"
        );
    }

    #[test]
    fn cgroup_limits_max_and_v1_unlimited_are_no_limit() {
        assert_eq!(parse_cgroup_limit("max\n"), None);
        assert_eq!(parse_cgroup_limit("9223372036854771712\n"), None);
        assert_eq!(parse_cgroup_limit("536870912\n"), Some(512 << 20));
        assert_eq!(parse_cgroup_limit("garbage"), None);
        assert_eq!(parse_cgroup_usage(" 1048576\n"), Some(1 << 20));
    }

    #[test]
    fn proc_self_cgroup_names_the_v2_and_v1_memory_paths() {
        let v2 = "0::/user.slice/session-1.scope\n";
        assert_eq!(
            parse_proc_cgroup(v2),
            (Some("/user.slice/session-1.scope".into()), None)
        );
        let v1 = "12:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n1:name=systemd:/docker/abc\n";
        assert_eq!(parse_proc_cgroup(v1), (None, Some("/docker/abc".into())));
        assert_eq!(parse_proc_cgroup("junk\n\n"), (None, None));
    }

    fn fake(dir: &Path, files: &[(&str, &str)]) {
        for (p, text) in files {
            let p = dir.join(p);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
    }

    #[test]
    fn the_tightest_of_meminfo_and_the_cgroup_hierarchy_wins() {
        let d = scratch_dir("devmem-v2");
        let (proc, cg) = (d.join("proc"), d.join("cg"));
        fake(
            &d,
            &[
                ("proc/meminfo", MEMINFO),
                ("proc/self/cgroup", "0::/a/b\n"),
                // The parent's limit is tighter than the child's: it counts.
                ("cg/a/memory.max", "1073741824\n"),
                ("cg/a/memory.current", "805306368\n"),
                ("cg/a/b/memory.max", "max\n"),
                ("cg/a/b/memory.current", "1000\n"),
            ],
        );
        let m = available_from(&proc, &cg).unwrap();
        assert_eq!(m.bytes, (1 << 30) - (768 << 20));
        assert_eq!(m.source, "cgroup v2 memory.max");
        // A cgroup with room to spare leaves MemAvailable in charge.
        fake(&d, &[("cg/a/memory.current", "0\n")]);
        let m = available_from(&proc, &cg).unwrap();
        assert_eq!((m.bytes, m.source), (1 << 30, "cgroup v2 memory.max"));
        fake(&d, &[("cg/a/memory.max", "max\n")]);
        let m = available_from(&proc, &cg).unwrap();
        assert_eq!((m.bytes, m.source), (9_876_543 * 1024, "MemAvailable"));
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn cgroup_v1_limit_minus_usage() {
        let d = scratch_dir("devmem-v1");
        fake(
            &d,
            &[
                ("proc/self/cgroup", "4:memory:/docker/x\n"),
                ("cg/memory/docker/x/memory.limit_in_bytes", "268435456\n"),
                ("cg/memory/docker/x/memory.usage_in_bytes", "67108864\n"),
                ("cg/memory/memory.limit_in_bytes", "9223372036854771712\n"),
            ],
        );
        let m = available_from(&d.join("proc"), &d.join("cg")).unwrap();
        assert_eq!(
            (m.bytes, m.source),
            (192 << 20, "cgroup v1 memory.limit_in_bytes")
        );
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn nothing_readable_means_no_figure() {
        let d = scratch_dir("devmem-none");
        assert_eq!(available_from(&d.join("proc"), &d.join("cg")), None);
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn an_impossible_allocation_is_an_error_naming_the_bytes() {
        let e = alloc_zeroed::<u8>(usize::MAX / 2, "the arena").unwrap_err();
        assert_eq!(e.needed, usize::MAX / 2);
        let msg = e.to_string();
        assert!(
            msg.contains("the arena needs") && msg.contains(&e.needed.to_string()),
            "{msg}"
        );
        assert_eq!(alloc_zeroed::<f32>(3, "x").unwrap(), vec![0.0; 3]);
    }

    #[test]
    fn this_machine_reports_some_memory() {
        // Linux CI has /proc/meminfo; the figure is positive.
        if cfg!(target_os = "linux") {
            assert!(available().is_some_and(|m| m.bytes > 0));
        }
    }
}
