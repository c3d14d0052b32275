//! How requests reach the DSP: [`Transport`], with [`QemuHexagon`] (the skel under `qemu-hexagon`,
//! over its stdin/stdout) here and [`FastRpc`](crate::fastrpc::FastRpc) on a phone.
use std::io::{BufWriter, Read, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::error::DspError;
use crate::proto::{self, Reply, Request};

/// A channel to a DSP that serves the skel's operations.
pub trait Transport {
    /// Sends `req` and reads its reply into `reply`, validating the frame (magic, sequence, sizes,
    /// checksum) and the status. On a failure the DSP is left for [`Self::restart`].
    fn call(&mut self, req: &Request<'_>, reply: &mut Reply) -> Result<(), DspError>;
    /// Brings the DSP back after a failure (a fresh process / session); a no-op when it is up.
    fn restart(&mut self) -> Result<(), DspError>;
    /// Drops the session (a reply the caller found wrong): the next call starts afresh.
    fn abandon(&mut self);
    /// Whether the DSP is up (a call will be attempted without a restart).
    fn is_up(&self) -> bool;
    /// Short name for reports.
    fn name(&self) -> &'static str;
}

/// The skel ELF built by `build.rs` (`FRUGAL_DSP_SKEL` at run time overrides it; cargo sets
/// `FRUGAL_HEXAGON_SKEL` itself when it runs tests); `Err(why)` when
/// there is none.
pub fn skel_path() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("FRUGAL_DSP_SKEL").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    match env!("FRUGAL_HEXAGON_SKEL") {
        "" => Err(env!("FRUGAL_HEXAGON_SKEL_WHY").to_string()),
        p => Ok(PathBuf::from(p)),
    }
}

struct Proc {
    child: Arc<Mutex<Child>>,
    tx: BufWriter<ChildStdin>,
    rx: ChildStdout,
    watch: Arc<Watch>,
}

/// A DSP call's deadline, watched by a thread started with the DSP process (once, not per call): when
/// a call's reply is late, it kills the process, so the blocked read returns and the call fails with
/// [`DspError::TimedOut`].
#[derive(Default)]
struct Watch {
    state: Mutex<WatchState>,
    cv: Condvar,
}

#[derive(Default)]
struct WatchState {
    deadline: Option<Instant>,
    fired: bool,
    quit: bool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Watch {
    fn serve(&self, child: &Mutex<Child>) {
        let mut st = lock(&self.state);
        loop {
            if st.quit {
                return;
            }
            match st.deadline {
                None => st = self.cv.wait(st).unwrap_or_else(|e| e.into_inner()),
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        st.fired = true;
                        st.deadline = None;
                        drop(st);
                        let _ = lock(child).kill();
                        st = lock(&self.state);
                    } else {
                        st = self
                            .cv
                            .wait_timeout(st, d - now)
                            .unwrap_or_else(|e| e.into_inner())
                            .0;
                    }
                }
            }
        }
    }

    /// Arms (`Some`) or disarms the deadline; disarming says whether it fired.
    fn set(&self, deadline: Option<Instant>) -> bool {
        let mut st = lock(&self.state);
        st.deadline = deadline;
        let fired = std::mem::take(&mut st.fired);
        self.cv.notify_one();
        fired
    }

    fn quit(&self) {
        lock(&self.state).quit = true;
        self.cv.notify_one();
    }
}

/// How long [`QemuHexagon`] waits for a reply by default (a GEMM of the largest operands the skel
/// takes runs in seconds under qemu).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// The skel running under `qemu-hexagon -cpu v67` (whose HVX runs the v68 kernels), spoken to over
/// its stdin and stdout. Started on the first call; a failed call kills it and the next call (or
/// [`Transport::restart`]) starts a fresh one.
pub struct QemuHexagon {
    program: PathBuf,
    args: Vec<String>,
    proc: Option<Proc>,
    seq: u32,
    /// Processes started so far.
    pub starts: u64,
    /// Calls made so far.
    pub calls: u64,
    /// Fault injection (tests): kill the process right before call number `n` (counted in `calls`).
    pub kill_before_call: Option<u64>,
    /// Fault injection (tests): call number `n` is sent as the skel's `HANG` command instead (it
    /// never answers).
    pub hang_at_call: Option<u64>,
    /// How long a call waits for its reply before the DSP counts as hung
    /// ([`DspError::TimedOut`]; the process is killed and the next call starts a fresh one).
    /// [`Duration::MAX`] waits for ever.
    pub timeout: Duration,
}

impl QemuHexagon {
    /// The skel built by `build.rs` under `qemu-hexagon` from `PATH`; `Err` (unavailable) when either
    /// is missing. The process starts on the first call.
    pub fn new() -> Result<Self, DspError> {
        let skel = skel_path().map_err(DspError::Unavailable)?;
        if !skel.is_file() {
            return Err(DspError::Unavailable(format!(
                "the skel {} does not exist",
                skel.display()
            )));
        }
        let qemu = std::env::var("FRUGAL_QEMU_HEXAGON").unwrap_or_else(|_| "qemu-hexagon".into());
        let found = Command::new(&qemu)
            .arg("-version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if !found.is_ok_and(|s| s.success()) {
            return Err(DspError::Unavailable(format!(
                "{qemu} is not installed (Debian: qemu-user; `cargo xtask setup`)"
            )));
        }
        Ok(Self::with_command(
            qemu.into(),
            vec!["-cpu".into(), "v67".into(), skel.display().to_string()],
        ))
    }

    /// The same DSP with `extra` arguments before qemu's own (a TCG plugin: `-plugin lib.so -d plugin
    /// -D log`).
    pub fn with_extra_args(mut self, extra: &[String]) -> Self {
        let mut args = extra.to_vec();
        args.append(&mut self.args);
        self.args = args;
        self
    }

    /// Any program speaking the protocol on stdin/stdout (tests give it ones that misbehave).
    pub fn with_command(program: PathBuf, args: Vec<String>) -> Self {
        Self {
            program,
            args,
            proc: None,
            seq: 0,
            starts: 0,
            calls: 0,
            kill_before_call: None,
            hang_at_call: None,
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// Ends the DSP process cleanly: closes its input (the skel exits at the end of input) and waits
    /// for it, so what qemu logs is complete. The next call starts a fresh one.
    pub fn finish(&mut self) -> Result<(), DspError> {
        if let Some(p) = self.proc.take() {
            let Proc {
                child,
                tx,
                rx,
                watch,
            } = p;
            watch.quit();
            drop(tx);
            drop(rx);
            let st = lock(&child).wait().map_err(DspError::Spawn)?;
            if !st.success() {
                return Err(DspError::Died {
                    op: "exit",
                    detail: format!("the skel exited with {st}"),
                });
            }
        }
        Ok(())
    }

    /// Kills the DSP process (as a crash would).
    pub fn kill(&mut self) {
        if let Some(p) = self.proc.take() {
            p.watch.quit();
            let mut c = lock(&p.child);
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn start(&mut self) -> Result<(), DspError> {
        let mut child = Command::new(&self.program)
            .args(&self.args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(DspError::Spawn)?;
        let (Some(tx), Some(rx)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(DspError::Unavailable("the DSP process has no pipes".into()));
        };
        let child = Arc::new(Mutex::new(child));
        let watch = Arc::new(Watch::default());
        let (w, c) = (watch.clone(), child.clone());
        let spawned = std::thread::Builder::new()
            .name("frugal-dsp-watch".into())
            .spawn(move || w.serve(&c));
        if let Err(e) = spawned {
            let mut c = lock(&child);
            let _ = c.kill();
            let _ = c.wait();
            return Err(DspError::Spawn(e));
        }
        self.proc = Some(Proc {
            child,
            tx: BufWriter::with_capacity(1 << 16, tx),
            rx,
            watch,
        });
        self.starts += 1;
        Ok(())
    }

    fn exchange(&mut self, req: &Request<'_>, reply: &mut Reply) -> Result<(), DspError> {
        let op = req.op.name();
        let died = |e: std::io::Error| DspError::Died {
            op,
            detail: e.to_string(),
        };
        let bad = |what| DspError::BadReply { op, what };
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let p = self
            .proc
            .as_mut()
            .ok_or_else(|| DspError::Unavailable("not started".into()))?;
        let header = proto::request_header(req, seq);
        p.tx.write_all(&header).map_err(died)?;
        for w in req.params {
            p.tx.write_all(&w.to_le_bytes()).map_err(died)?;
        }
        for piece in req.payload {
            p.tx.write_all(piece).map_err(died)?;
        }
        p.tx.flush().map_err(died)?;
        let mut hb = [0u8; proto::HEADER_WORDS * 4];
        p.rx.read_exact(&mut hb).map_err(died)?;
        let h = proto::parse_reply_header(&hb).map_err(bad)?;
        if h.seq != seq {
            return Err(bad("answers another request"));
        }
        if h.status == 0 && h.len as usize != req.reply_len {
            return Err(bad("reply payload has the wrong length"));
        }
        let mut rb = [0u8; proto::MAX_RESULTS * 4];
        let rb = &mut rb[..h.nresults as usize * 4];
        p.rx.read_exact(rb).map_err(died)?;
        reply.payload.clear();
        reply.payload.resize(h.len as usize, 0);
        p.rx.read_exact(&mut reply.payload).map_err(died)?;
        if proto::fnv(proto::fnv(proto::FNV_INIT, rb), &reply.payload) != h.sum {
            return Err(bad("checksum mismatch"));
        }
        if h.status != 0 {
            return Err(DspError::Refused {
                op,
                status: h.status,
            });
        }
        reply.nresults = h.nresults as usize;
        for (r, b) in reply.results.iter_mut().zip(rb.chunks_exact(4)) {
            *r = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
        Ok(())
    }
}

impl Transport for QemuHexagon {
    fn call(&mut self, req: &Request<'_>, reply: &mut Reply) -> Result<(), DspError> {
        if req.params.len() > proto::MAX_PARAMS {
            return Err(DspError::TooLarge {
                op: req.op.name(),
                bytes: 4 * req.params.len() as u64,
            });
        }
        let bytes: u64 = req.payload.iter().map(|p| p.len() as u64).sum();
        if bytes > proto::SKEL_ARENA {
            return Err(DspError::TooLarge {
                op: req.op.name(),
                bytes,
            });
        }
        if self.proc.is_none() {
            self.start()?;
        }
        self.calls += 1;
        if self.kill_before_call == Some(self.calls) {
            if let Some(p) = self.proc.as_mut() {
                let mut c = lock(&p.child);
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        let hang = Request {
            op: proto::Op::Hang,
            params: &[],
            payload: &[],
            reply_len: 0,
        };
        let sent = if self.hang_at_call == Some(self.calls) {
            &hang
        } else {
            req
        };
        let watch = self.proc.as_ref().map(|p| p.watch.clone());
        if let Some(w) = &watch {
            // A time-out too long to represent waits for ever.
            w.set(Instant::now().checked_add(self.timeout));
        }
        let mut r = self.exchange(sent, reply);
        if watch.is_some_and(|w| w.set(None)) {
            r = Err(DspError::TimedOut {
                op: req.op.name(),
                after: self.timeout,
            });
        }
        if r.is_err() {
            // Out of step or dead: never reuse the process.
            self.kill();
        }
        r
    }

    fn restart(&mut self) -> Result<(), DspError> {
        if self.proc.is_none() {
            self.start()?;
        }
        Ok(())
    }

    fn abandon(&mut self) {
        self.kill();
    }

    fn is_up(&self) -> bool {
        self.proc.is_some()
    }

    fn name(&self) -> &'static str {
        "qemu-hexagon"
    }
}

impl Drop for QemuHexagon {
    fn drop(&mut self) {
        self.kill();
    }
}
