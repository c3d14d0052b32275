//! [`FileSpill`]: the native host's store for swapped-out tensors (NNTrainer §4.3, proactive swap). One
//! file in a temporary directory, a region per key, read and written with positioned I/O straight from
//! and into the arena (no copies held in the process).
//!
//! A background thread does the slow parts off the executor's thread:
//! - **prefetch**: when the executor announces a swap-in ([`Spill::lookahead`] instructions early), the
//!   thread reads the key's bytes into the kernel's page cache, so the swap-in itself is a memory copy
//!   instead of a disk read. That overlap is what makes proactive swapping cheaper than on-demand.
//! - **eviction** (optional, Linux): after a swap-out the thread writes the bytes back to disk and drops
//!   them from the page cache, so swapped-out tensors really leave RAM (as on a device that has none to
//!   spare) instead of lingering in the cache. Without it the kernel keeps them cached while memory is
//!   plentiful, and on-demand reads are memory copies too.
//!
//! The file is unlinked as soon as it is open (on Unix), so nothing is left behind even after a crash.
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use frugal_core::spill::{Spill, SpillError};

/// Granularity of a key's region in the file (a page, so eviction never touches a neighbour).
const REGION_ALIGN: u64 = 4096;
/// Bytes the background thread reads at a time when prefetching (its only buffer).
const WARM_CHUNK: usize = 256 * 1024;

/// What a [`FileSpill`] did so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpillStats {
    /// Bytes written to the file.
    pub written: u64,
    /// Bytes returned by reads.
    pub read: u64,
    /// Reads whose bytes a prefetch had brought in.
    pub prefetched_reads: u64,
    /// Reads with no prefetch before them (on demand).
    pub direct_reads: u64,
    /// Nanoseconds reads spent waiting for a prefetch still in flight.
    pub wait_ns: u64,
    /// Bytes written back and dropped from the page cache.
    pub evicted: u64,
}

struct Slot {
    offset: u64,
    cap: u64,
    /// Bytes validly stored (None after a failed write).
    len: Option<usize>,
}

enum Job {
    /// Read `len` bytes at `offset` into the page cache, then signal `done`.
    Warm {
        offset: u64,
        len: usize,
        done: SyncSender<()>,
    },
    /// Write back and drop from the page cache `len` bytes at `offset`.
    Evict { offset: u64, len: usize },
}

/// A [`Spill`] backed by one temporary file, with a background thread for prefetch and eviction.
pub struct FileSpill {
    file: Arc<File>,
    path: PathBuf,
    slots: HashMap<u32, Slot>,
    end: u64,
    lookahead: usize,
    evict: bool,
    jobs: Option<Sender<Job>>,
    worker: Option<JoinHandle<()>>,
    pending: HashMap<u32, Receiver<()>>,
    evicted: Arc<AtomicU64>,
    stats: SpillStats,
}

impl FileSpill {
    /// An on-demand store (no prefetch, no eviction) in the system's temporary directory.
    pub fn new() -> io::Result<FileSpill> {
        Self::in_dir(&std::env::temp_dir())
    }

    /// Like [`FileSpill::new`], with the file in `dir` (a fast local disk, ideally).
    pub fn in_dir(dir: &Path) -> io::Result<FileSpill> {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let name = format!(
            "frugal-spill-{}-{}.bin",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let path = dir.join(name);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        // On Unix the open handle keeps the data; the name goes now so a crash leaves nothing behind.
        #[cfg(unix)]
        let _ = std::fs::remove_file(&path);
        let file = Arc::new(file);
        let evicted = Arc::new(AtomicU64::new(0));
        let (tx, rx) = mpsc::channel::<Job>();
        let worker = {
            let file = Arc::clone(&file);
            let evicted = Arc::clone(&evicted);
            std::thread::Builder::new()
                .name("frugal-spill".into())
                .stack_size(64 * 1024)
                .spawn(move || background(&file, &rx, &evicted))?
        };
        Ok(FileSpill {
            file,
            path,
            slots: HashMap::new(),
            end: 0,
            lookahead: 0,
            evict: false,
            jobs: Some(tx),
            worker: Some(worker),
            pending: HashMap::new(),
            evicted,
            stats: SpillStats::default(),
        })
    }

    /// Asks the executor to announce each swap-in `n` instructions early, and prefetches it then
    /// (proactive swapping); 0 is on-demand.
    pub fn with_lookahead(mut self, n: usize) -> FileSpill {
        self.lookahead = n;
        self
    }

    /// Writes every swapped-out tensor back to disk and drops it from the page cache (Linux; elsewhere
    /// a no-op), so its bytes really leave RAM.
    pub fn evicting(mut self, on: bool) -> FileSpill {
        self.evict = on && cfg!(target_os = "linux");
        self
    }

    /// What the store did so far.
    pub fn stats(&self) -> SpillStats {
        SpillStats {
            evicted: self.evicted.load(Ordering::Relaxed),
            ..self.stats
        }
    }

    /// Bytes of file space the keys occupy.
    pub fn file_bytes(&self) -> u64 {
        self.end
    }

    fn send(&self, job: Job) -> bool {
        self.jobs.as_ref().is_some_and(|j| j.send(job).is_ok())
    }

    /// Waits for the prefetch of `key`, if one is pending; true if there was one.
    fn wait_pending(&mut self, key: u32) -> bool {
        let Some(done) = self.pending.remove(&key) else {
            return false;
        };
        let t = Instant::now();
        // An error means the worker is gone; the read then simply goes to the file.
        let _ = done.recv();
        self.stats.wait_ns += t.elapsed().as_nanos() as u64;
        true
    }
}

/// The background thread: prefetches and evictions, in the order they were asked for.
fn background(file: &File, jobs: &Receiver<Job>, evicted: &AtomicU64) {
    let mut chunk: Vec<u8> = Vec::new();
    for job in jobs {
        match job {
            Job::Warm { offset, len, done } => {
                chunk.resize(WARM_CHUNK.min(len), 0);
                let mut at = 0usize;
                while at < len {
                    let n = chunk.len().min(len - at);
                    // A failed prefetch is not an error: the read that follows reports it.
                    if read_at(file, &mut chunk[..n], offset + at as u64).is_err() {
                        break;
                    }
                    at += n;
                }
                // The executor may have given up on this prefetch (an aborted step): ignore.
                let _ = done.send(());
            }
            Job::Evict { offset, len } => {
                if evict(file, offset, len) {
                    evicted.fetch_add(len as u64, Ordering::Relaxed);
                }
            }
        }
    }
}

impl Spill for FileSpill {
    fn write(&mut self, key: u32, data: &[u8]) -> Result<(), SpillError> {
        // A prefetch of the key's previous bytes is stale now; let it finish first.
        self.wait_pending(key);
        let len = data.len() as u64;
        let slot = match self.slots.get_mut(&key) {
            Some(s) if s.cap >= len => s,
            _ => {
                let cap = len.div_ceil(REGION_ALIGN).max(1) * REGION_ALIGN;
                let offset = self.end;
                self.end += cap;
                self.slots.insert(
                    key,
                    Slot {
                        offset,
                        cap,
                        len: None,
                    },
                );
                self.slots.get_mut(&key).expect("just inserted")
            }
        };
        slot.len = None;
        write_at(&self.file, data, slot.offset).map_err(|e| SpillError::Write {
            key,
            os: e.raw_os_error(),
        })?;
        slot.len = Some(data.len());
        let offset = slot.offset;
        self.stats.written += len;
        if self.evict {
            self.send(Job::Evict {
                offset,
                len: data.len(),
            });
        }
        Ok(())
    }

    fn read(&mut self, key: u32, out: &mut [u8]) -> Result<(), SpillError> {
        let offset = match self.slots.get(&key) {
            Some(Slot {
                offset,
                len: Some(len),
                ..
            }) if *len == out.len() => *offset,
            _ => {
                return Err(SpillError::Missing {
                    key,
                    len: out.len(),
                })
            }
        };
        if self.wait_pending(key) {
            self.stats.prefetched_reads += 1;
        } else {
            self.stats.direct_reads += 1;
        }
        read_at(&self.file, out, offset).map_err(|e| SpillError::Read {
            key,
            os: e.raw_os_error(),
        })?;
        self.stats.read += out.len() as u64;
        Ok(())
    }

    fn prefetch(&mut self, key: u32, len: usize) {
        if self.pending.contains_key(&key) {
            return;
        }
        let Some(&Slot {
            offset,
            len: Some(stored),
            ..
        }) = self.slots.get(&key)
        else {
            return;
        };
        if stored != len {
            return;
        }
        let (done, rx) = mpsc::sync_channel(1);
        if self.send(Job::Warm { offset, len, done }) {
            self.pending.insert(key, rx);
        }
    }

    fn lookahead(&self) -> usize {
        self.lookahead
    }
}

impl Drop for FileSpill {
    fn drop(&mut self) {
        self.pending.clear();
        self.jobs = None; // ends the worker's loop
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
        #[cfg(not(unix))]
        let _ = std::fs::remove_file(&self.path);
    }
}

impl std::fmt::Debug for FileSpill {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileSpill")
            .field("path", &self.path)
            .field("keys", &self.slots.len())
            .field("file_bytes", &self.end)
            .field("lookahead", &self.lookahead)
            .field("evict", &self.evict)
            .field("stats", &self.stats())
            .finish()
    }
}

/// Writes `len` bytes at `offset` back to disk and drops them from the page cache; true if done.
#[cfg(target_os = "linux")]
fn evict(file: &File, offset: u64, len: usize) -> bool {
    use std::os::unix::io::AsRawFd;
    let fd = file.as_raw_fd();
    let (Ok(off), Ok(n)) = (
        libc::off64_t::try_from(offset),
        libc::off64_t::try_from(len),
    ) else {
        return false;
    };
    let flags = libc::SYNC_FILE_RANGE_WAIT_BEFORE
        | libc::SYNC_FILE_RANGE_WRITE
        | libc::SYNC_FILE_RANGE_WAIT_AFTER;
    // SAFETY: plain system calls on an open descriptor this thread's `File` keeps alive; no memory is
    // passed.
    unsafe {
        libc::sync_file_range(fd, off, n, flags) == 0
            && libc::posix_fadvise64(fd, off, n, libc::POSIX_FADV_DONTNEED) == 0
    }
}

#[cfg(not(target_os = "linux"))]
fn evict(_: &File, _: u64, _: usize) -> bool {
    false
}

#[cfg(unix)]
fn read_at(f: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(f, buf, offset)
}

#[cfg(unix)]
fn write_at(f: &File, buf: &[u8], offset: u64) -> io::Result<()> {
    std::os::unix::fs::FileExt::write_all_at(f, buf, offset)
}

#[cfg(windows)]
fn read_at(f: &File, mut buf: &mut [u8], mut offset: u64) -> io::Result<()> {
    use std::os::windows::fs::FileExt;
    while !buf.is_empty() {
        match f.seek_read(buf, offset)? {
            0 => return Err(io::ErrorKind::UnexpectedEof.into()),
            n => {
                buf = &mut buf[n..];
                offset += n as u64;
            }
        }
    }
    Ok(())
}

#[cfg(windows)]
fn write_at(f: &File, mut buf: &[u8], mut offset: u64) -> io::Result<()> {
    use std::os::windows::fs::FileExt;
    while !buf.is_empty() {
        match f.seek_write(buf, offset)? {
            0 => return Err(io::ErrorKind::WriteZero.into()),
            n => {
                buf = &buf[n..];
                offset += n as u64;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use frugal_core::exec::{Executor, Target};
    use frugal_core::graph::Graph;
    use frugal_core::model::{Dims, LayerKind, LayerSpec, LossKind, ModelSpec, OptimizerSpec, Src};
    use frugal_core::plan::Plan;
    use frugal_core::policy::swap::plan_swap;

    fn pattern(n: usize, seed: u8) -> Vec<u8> {
        (0..n).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect()
    }

    #[test]
    fn round_trips_with_and_without_prefetch_and_eviction() {
        for evict in [false, true] {
            round_trips(FileSpill::new().unwrap().evicting(evict));
        }
    }

    fn round_trips(mut s: FileSpill) {
        let a = pattern(10_000, 1);
        let b = pattern(300, 2);
        s.write(7, &a).unwrap();
        s.write(9, &b).unwrap();
        let mut out = vec![0u8; a.len()];
        s.read(7, &mut out).unwrap();
        assert_eq!(out, a);
        s.prefetch(9, b.len());
        let mut out = vec![0u8; b.len()];
        s.read(9, &mut out).unwrap();
        assert_eq!(out, b);
        let st = s.stats();
        assert_eq!((st.direct_reads, st.prefetched_reads), (1, 1));
        assert_eq!(st.written, 10_300);
        // A larger value for a key moves it; a smaller one reuses its region.
        let c = pattern(20_000, 3);
        s.write(9, &c).unwrap();
        let mut out = vec![0u8; c.len()];
        s.read(9, &mut out).unwrap();
        assert_eq!(out, c);
        s.write(7, &b).unwrap();
        let mut out = vec![0u8; b.len()];
        s.read(7, &mut out).unwrap();
        assert_eq!(out, b);
    }

    #[test]
    fn stale_prefetches_and_missing_keys() {
        let mut s = FileSpill::new().unwrap();
        s.write(1, &pattern(5000, 1)).unwrap();
        s.prefetch(1, 5000);
        // Rewritten before the read: the read must see the new bytes.
        let fresh = pattern(5000, 9);
        s.write(1, &fresh).unwrap();
        let mut out = vec![0u8; 5000];
        s.read(1, &mut out).unwrap();
        assert_eq!(out, fresh);
        // Unknown key, wrong length, prefetch of an unknown key: typed errors, no panics.
        assert_eq!(
            s.read(2, &mut out),
            Err(SpillError::Missing { key: 2, len: 5000 })
        );
        let mut short = vec![0u8; 10];
        assert!(matches!(
            s.read(1, &mut short),
            Err(SpillError::Missing { .. })
        ));
        s.prefetch(3, 10);
        // A prefetch never read (an aborted step) is dropped with the store.
        s.prefetch(1, 5000);
    }

    #[test]
    fn a_swap_plan_trains_bit_identically_through_a_file() {
        // Four conv-relu pairs then pool and linear, batch 32: the saved activations, not one layer's
        // working set, make the plain peak, so swapping shrinks the arena.
        let layer = |name: String, kind, src| LayerSpec {
            name,
            kind,
            inputs: vec![src],
            trainable: true,
            update: frugal_core::model::Update::All,
        };
        let conv = LayerKind::Conv2d {
            out: 4,
            kernel: [3, 3],
            stride: [1, 1],
            padding: [1, 1],
            groups: 1,
            bias: true,
        };
        let mut layers = Vec::new();
        for i in 0..4 {
            let src = if i == 0 {
                Src::Input
            } else {
                Src::Layer(layers.len() as u32 - 1)
            };
            layers.push(layer(format!("c{i}"), conv.clone(), src));
            let src = Src::Layer(layers.len() as u32 - 1);
            layers.push(layer(format!("r{i}"), LayerKind::Relu, src));
        }
        let pool = LayerKind::MaxPool2d {
            kernel: [2, 2],
            stride: [2, 2],
        };
        let n = layers.len() as u32;
        layers.push(layer("p".into(), pool, Src::Layer(n - 1)));
        layers.push(layer("f".into(), LayerKind::Flatten, Src::Layer(n)));
        let fc = LayerKind::Linear { out: 3, bias: true };
        layers.push(layer("fc".into(), fc, Src::Layer(n + 1)));
        let spec = ModelSpec {
            input: Dims::new(2, 8, 8),
            layers,
            loss: LossKind::SoftmaxCrossEntropy,
            optimizer: OptimizerSpec::Sgd {
                lr: 0.05,
                momentum: 0.9,
                weight_decay: 0.0,
            },
            seed: 1,
        };
        let batch = 32;
        let g = Graph::new(&spec, batch).unwrap();
        let x: Vec<f32> = (0..batch * 128)
            .map(|i| ((i * 37 % 101) as f32) / 50.0 - 1.0)
            .collect();
        let y: Vec<u32> = (0..batch as u32).map(|i| i % 3).collect();
        let run = |plan: &Plan, mut spill: Option<&mut FileSpill>| -> Vec<u32> {
            let mut arena = vec![0u8; plan.needed_bytes()];
            let mut ex = Executor::new(plan, &arena).unwrap();
            ex.init_params(&mut arena, 3).unwrap();
            let mut out = Vec::new();
            for _ in 0..3 {
                let st = match spill.as_deref_mut() {
                    Some(s) => ex.train_step_spilled(&mut arena, &x, Target::Classes(&y), s),
                    None => ex.train_step(&mut arena, &x, Target::Classes(&y)),
                };
                out.push(st.unwrap().loss.to_bits());
            }
            for (_, _, t) in ex.state_tensors().collect::<Vec<_>>() {
                out.extend(ex.read(&mut arena, t).unwrap().iter().map(|v| v.to_bits()));
            }
            out
        };
        let plain = Plan::new(g.clone());
        let want = run(&plain, None);
        for lookahead in [0, 3] {
            let (Ok(p) | Err(p)) = plan_swap(&g, 0, 0);
            assert!(p.arena_bytes < plain.arena_bytes);
            let mut s = FileSpill::new()
                .unwrap()
                .with_lookahead(lookahead)
                .evicting(true);
            assert_eq!(run(&p, Some(&mut s)), want, "lookahead {lookahead}");
            let st = s.stats();
            assert!(
                st.written > 0 && st.read == st.written,
                "lookahead {lookahead}: {st:?}"
            );
            if lookahead > 0 {
                assert!(st.prefetched_reads > 0 && st.direct_reads == 0, "{st:?}");
            } else {
                assert_eq!(st.prefetched_reads, 0);
            }
        }
    }
}
