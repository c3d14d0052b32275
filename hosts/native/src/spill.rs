//! [`FileSpill`]: the native host's store for swapped-out tensors (NNTrainer §4.3, proactive swap). One
//! file in a temporary directory, a region per key; a background thread services
//! [`Spill::prefetch`] hints by reading a key into a staging buffer while the executor computes, so the
//! swap-in that follows only copies memory. That overlap is what makes proactive swapping (a lookahead
//! of a few instructions) cheaper than on-demand swapping (read right before the use).
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

/// Granularity of a key's region in the file.
const REGION_ALIGN: u64 = 4096;
/// Staging buffers kept for reuse (each as large as the largest tensor prefetched into it).
const POOL_MAX: usize = 4;

/// What a [`FileSpill`] did so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpillStats {
    /// Bytes written to the file.
    pub written: u64,
    /// Bytes returned by reads.
    pub read: u64,
    /// Reads served from a prefetched staging buffer.
    pub prefetched_reads: u64,
    /// Reads that went to the file directly (no prefetch was pending).
    pub direct_reads: u64,
    /// Nanoseconds reads spent waiting for a prefetch still in flight.
    pub wait_ns: u64,
    /// Largest total of staging buffers held at once (bytes).
    pub peak_staged: u64,
}

struct Slot {
    offset: u64,
    cap: u64,
    /// Bytes validly stored (None after a failed write).
    len: Option<usize>,
}

struct Job {
    offset: u64,
    len: usize,
    buf: Vec<u8>,
    reply: SyncSender<(Vec<u8>, io::Result<()>)>,
}

struct Pending {
    len: usize,
    reply: Receiver<(Vec<u8>, io::Result<()>)>,
}

/// A [`Spill`] backed by one temporary file, with a background reader for prefetches.
pub struct FileSpill {
    file: Arc<File>,
    path: PathBuf,
    slots: HashMap<u32, Slot>,
    end: u64,
    jobs: Option<Sender<Job>>,
    worker: Option<JoinHandle<()>>,
    pending: HashMap<u32, Pending>,
    pool: Vec<Vec<u8>>,
    staged: u64,
    stats: SpillStats,
}

impl FileSpill {
    /// A store in the system's temporary directory.
    pub fn new() -> io::Result<FileSpill> {
        Self::in_dir(&std::env::temp_dir())
    }

    /// A store whose file lives in `dir` (a fast local disk, ideally).
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
        let (tx, rx) = mpsc::channel::<Job>();
        let reader = Arc::clone(&file);
        let worker = std::thread::Builder::new()
            .name("frugal-spill".into())
            .stack_size(64 * 1024)
            .spawn(move || {
                for mut job in rx {
                    // Sizing (page faults, zeroing) happens here too, off the executor's thread.
                    job.buf.resize(job.len, 0);
                    let r = read_at(&reader, &mut job.buf, job.offset);
                    // The executor may have given up on this prefetch (an aborted step): ignore.
                    let _ = job.reply.send((job.buf, r));
                }
            })?;
        Ok(FileSpill {
            file,
            path,
            slots: HashMap::new(),
            end: 0,
            jobs: Some(tx),
            worker: Some(worker),
            pending: HashMap::new(),
            pool: Vec::new(),
            staged: 0,
            stats: SpillStats::default(),
        })
    }

    /// What the store did so far.
    pub fn stats(&self) -> SpillStats {
        self.stats
    }

    /// Bytes of file space the keys occupy.
    pub fn file_bytes(&self) -> u64 {
        self.end
    }

    /// Takes the result of the prefetch of `key`, if one is pending (waits for it).
    fn take_pending(&mut self, key: u32) -> Option<(usize, Vec<u8>, io::Result<()>)> {
        let p = self.pending.remove(&key)?;
        let t = Instant::now();
        let got = p.reply.recv();
        self.stats.wait_ns += t.elapsed().as_nanos() as u64;
        self.staged = self.staged.saturating_sub(p.len as u64);
        match got {
            Ok((buf, r)) => Some((p.len, buf, r)),
            // The worker is gone (it panicked): treat as a failed read.
            Err(_) => Some((
                p.len,
                Vec::new(),
                Err(io::Error::other("spill reader stopped")),
            )),
        }
    }

    fn recycle(&mut self, buf: Vec<u8>) {
        if buf.capacity() > 0 {
            if self.pool.len() >= POOL_MAX {
                // Keep the largest buffers.
                if let Some((i, _)) = self.pool.iter().enumerate().min_by_key(|x| x.1.capacity()) {
                    if self.pool[i].capacity() < buf.capacity() {
                        self.pool[i] = buf;
                    }
                }
            } else {
                self.pool.push(buf);
            }
        }
    }

    fn buffer(&mut self, len: usize) -> Vec<u8> {
        // The smallest pooled buffer that is large enough, else a new one.
        let best = self
            .pool
            .iter()
            .enumerate()
            .filter(|(_, b)| b.capacity() >= len)
            .min_by_key(|(_, b)| b.capacity())
            .map(|(i, _)| i);
        match best {
            Some(i) => self.pool.swap_remove(i),
            None => Vec::with_capacity(len),
        }
    }
}

impl Spill for FileSpill {
    fn write(&mut self, key: u32, data: &[u8]) -> Result<(), SpillError> {
        // A prefetch of the key's previous bytes is stale now.
        if let Some((_, buf, _)) = self.take_pending(key) {
            self.recycle(buf);
        }
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
        self.stats.written += len;
        Ok(())
    }

    fn read(&mut self, key: u32, out: &mut [u8]) -> Result<(), SpillError> {
        let (offset, len) = match self.slots.get(&key) {
            Some(Slot {
                offset,
                len: Some(len),
                ..
            }) if *len == out.len() => (*offset, *len),
            _ => {
                return Err(SpillError::Missing {
                    key,
                    len: out.len(),
                })
            }
        };
        match self.take_pending(key) {
            Some((plen, buf, Ok(()))) if plen == len => {
                out.copy_from_slice(&buf);
                self.recycle(buf);
                self.stats.prefetched_reads += 1;
            }
            other => {
                // No prefetch, another length, or it failed: read directly (and report that error).
                if let Some((_, buf, _)) = other {
                    self.recycle(buf);
                }
                read_at(&self.file, out, offset).map_err(|e| SpillError::Read {
                    key,
                    os: e.raw_os_error(),
                })?;
                self.stats.direct_reads += 1;
            }
        }
        self.stats.read += len as u64;
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
        let buf = self.buffer(len);
        let (reply, rx) = mpsc::sync_channel(1);
        let sent = self.jobs.as_ref().map(|j| {
            j.send(Job {
                offset,
                len,
                buf,
                reply,
            })
        });
        match sent {
            Some(Ok(())) => {
                self.pending.insert(key, Pending { len, reply: rx });
                self.staged += len as u64;
                self.stats.peak_staged = self.stats.peak_staged.max(self.staged);
            }
            // The worker is gone: the read will go to the file directly.
            Some(Err(mpsc::SendError(job))) => self.recycle(job.buf),
            None => {}
        }
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
            .field("stats", &self.stats)
            .finish()
    }
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
    fn round_trips_with_and_without_prefetch() {
        let mut s = FileSpill::new().unwrap();
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
            let (Ok(p) | Err(p)) = plan_swap(&g, lookahead, 0);
            assert!(p.arena_bytes < plain.arena_bytes, "lookahead {lookahead}");
            let mut s = FileSpill::new().unwrap();
            assert_eq!(run(&p, Some(&mut s)), want, "lookahead {lookahead}");
            let st = s.stats();
            assert!(
                st.written > 0 && st.read == st.written,
                "lookahead {lookahead}: {st:?}"
            );
            if lookahead > 0 {
                assert!(st.prefetched_reads > 0, "{st:?}");
            } else {
                assert_eq!(st.prefetched_reads, 0);
            }
        }
    }
}
