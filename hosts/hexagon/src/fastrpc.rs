//! FastRPC: the transport on a Snapdragon phone. `libcdsprpc.so` (the compute DSP's RPC library,
//! shipped on the device's vendor partition) is opened at run time, so nothing links against the
//! Hexagon SDK and the crate builds for `aarch64-linux-android` without it.
//!
//! # Interface (IDL) and the stub/skel split
//!
//! The interface is `dsp/frugal_skel.idl`:
//!
//! ```idl
//! #include "remote.idl"
//! interface frugal_skel : remote_handle64 {
//!     // One framed request in, one framed reply out: the frames of `proto` (dsp/proto.h).
//!     long call(in sequence<octet> request, rout sequence<octet> reply);
//! };
//! ```
//!
//! On the phone the *stub* is this module: instead of qaic's generated C stub it marshals the one
//! method itself through the library's generic entry points (`remote_handle64_open`, `…_invoke`,
//! `…_close`): method 2 (0 and 1 are `open`/`close` of every `remote_handle64` interface), one input
//! buffer (the request frame) and one output buffer (room for the reply frame), i.e. scalars
//! `REMOTE_SCALARS_MAKEX(0, 2, 1, 1, 0, 0)`. The *skel* is the DSP side: `libfrugal_skel.so`, built
//! with the Hexagon SDK from `dsp/kernels.c` and the `serve` function of `dsp/skel.c` (the pipe loop
//! replaced by `frugal_skel_call(request, reply)`, the same frame checks), loaded by the DSP's RPC
//! daemon when the handle `"file:///libfrugal_skel.so?frugal_skel_skel_handle_invoke&_modver=1.0"`
//! is opened. Buffers are copied by the RPC layer. The planned DSP space works as over the pipe: its
//! requests (`PREPARE`, `WRITE`, `IN_SPACE`) are frames like the kernels', served by the same
//! `serve_space` of `dsp/skel.c`, whose space would be allocated with QuRT's allocator instead of the
//! `mmap` syscall (not built: no SDK here). Mapping the host's mirror itself to the DSP (ION/dma-buf
//! through `rpcmem_alloc`, so that the `WRITE`s disappear) is not done.
//!
//! Not tested here: there is no phone, SDK or `libcdsprpc.so` on this machine; [`FastRpc::open`]
//! reports [`DspError::Unavailable`] off Android.
use crate::error::DspError;
use crate::proto::{self, Reply, Request};
use crate::transport::Transport;

/// FastRPC's `remote_scalars` word: attributes, method, input/output buffers and handles.
pub const fn remote_scalars(
    attr: u32,
    method: u32,
    n_in: u32,
    n_out: u32,
    h_in: u32,
    h_out: u32,
) -> u32 {
    ((attr & 0x7) << 29)
        | ((method & 0x1f) << 24)
        | ((n_in & 0xff) << 16)
        | ((n_out & 0xff) << 8)
        | ((h_in & 0x0f) << 4)
        | (h_out & 0x0f)
}

/// The scalars of `frugal_skel.call`.
pub const CALL_SCALARS: u32 = remote_scalars(0, 2, 1, 1, 0, 0);

/// The URI the DSP's loader resolves to the skel library.
pub const SKEL_URI: &str = "file:///libfrugal_skel.so?frugal_skel_skel_handle_invoke&_modver=1.0\0";

/// One FastRPC buffer argument (`remote_buf` inside `remote_arg`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct RemoteBuf {
    /// Its address.
    pub pv: *mut core::ffi::c_void,
    /// Its length in bytes.
    pub n_len: usize,
}

#[cfg(target_os = "android")]
mod sys {
    use super::RemoteBuf;
    pub type Open = unsafe extern "C" fn(*const core::ffi::c_char, *mut u64) -> i32;
    pub type Invoke = unsafe extern "C" fn(u64, u32, *mut RemoteBuf) -> i32;
    pub type Close = unsafe extern "C" fn(u64) -> i32;
}

/// A session with the skel on the compute DSP.
pub struct FastRpc {
    #[cfg(target_os = "android")]
    lib: libloading::Library,
    handle: Option<u64>,
    seq: u32,
    frame: Vec<u8>,
    out: Vec<u8>,
}

impl FastRpc {
    /// Opens `libcdsprpc.so` and a handle to the skel; [`DspError::Unavailable`] when either fails
    /// (no DSP, no skel on the device, or not Android).
    pub fn open() -> Result<Self, DspError> {
        #[cfg(target_os = "android")]
        {
            // SAFETY: loading the vendor's RPC library runs its initialisers, which is its documented
            // use; no Rust state is shared with them.
            let lib = unsafe { libloading::Library::new("libcdsprpc.so") }
                .map_err(|e| DspError::Unavailable(format!("libcdsprpc.so: {e}")))?;
            let mut me = Self {
                lib,
                handle: None,
                seq: 0,
                frame: Vec::new(),
                out: Vec::new(),
            };
            me.restart()?;
            Ok(me)
        }
        #[cfg(not(target_os = "android"))]
        {
            Err(DspError::Unavailable(
                "FastRPC needs Android's libcdsprpc.so".into(),
            ))
        }
    }

    #[cfg(target_os = "android")]
    fn invoke(&mut self, h: u64, op: &'static str) -> Result<(), DspError> {
        // SAFETY: the symbol has the C signature of `remote_handle64_invoke` (remote.h).
        let invoke: libloading::Symbol<'_, sys::Invoke> =
            unsafe { self.lib.get(b"remote_handle64_invoke\0") }
                .map_err(|e| DspError::Unavailable(format!("remote_handle64_invoke: {e}")))?;
        let mut args = [
            RemoteBuf {
                pv: self.frame.as_mut_ptr().cast(),
                n_len: self.frame.len(),
            },
            RemoteBuf {
                pv: self.out.as_mut_ptr().cast(),
                n_len: self.out.len(),
            },
        ];
        // SAFETY: both buffers live for the call, with the lengths given; the scalars say one input
        // and one output buffer, which is what `args` holds.
        let rc = unsafe { invoke(h, CALL_SCALARS, args.as_mut_ptr()) };
        if rc != 0 {
            return Err(DspError::Died {
                op,
                detail: format!("remote_handle64_invoke returned {rc:#x}"),
            });
        }
        Ok(())
    }

    fn close(&mut self) {
        #[cfg(target_os = "android")]
        if let Some(h) = self.handle.take() {
            // SAFETY: the symbol has the C signature of `remote_handle64_close`.
            if let Ok(close) = unsafe { self.lib.get::<sys::Close>(b"remote_handle64_close\0") } {
                // SAFETY: `h` was opened by `remote_handle64_open` and is closed once.
                unsafe { close(h) };
            }
        }
        self.handle = None;
    }
}

impl Transport for FastRpc {
    fn call(&mut self, req: &Request<'_>, reply: &mut Reply) -> Result<(), DspError> {
        let op = req.op.name();
        let h = match self.handle {
            Some(h) => h,
            None => {
                self.restart()?;
                self.handle
                    .ok_or_else(|| DspError::Unavailable("no handle".into()))?
            }
        };
        self.seq = self.seq.wrapping_add(1);
        proto::request_frame(req, self.seq, &mut self.frame);
        let want = proto::HEADER_WORDS * 4 + proto::MAX_RESULTS * 4 + req.reply_len;
        self.out.clear();
        self.out.resize(want, 0);
        #[cfg(target_os = "android")]
        if let Err(e) = self.invoke(h, op) {
            self.close();
            return Err(e);
        }
        let _ = h;
        let r = proto::parse_reply_frame(&self.out, self.seq, reply);
        match r {
            Ok(hd) if hd.status != 0 => Err(DspError::Refused {
                op,
                status: hd.status,
            }),
            Ok(_) => Ok(()),
            Err(what) => {
                self.close();
                Err(DspError::BadReply { op, what })
            }
        }
    }

    fn restart(&mut self) -> Result<(), DspError> {
        if self.handle.is_some() {
            return Ok(());
        }
        #[cfg(target_os = "android")]
        {
            // SAFETY: the symbol has the C signature of `remote_handle64_open` (remote.h).
            let open: libloading::Symbol<'_, sys::Open> =
                unsafe { self.lib.get(b"remote_handle64_open\0") }
                    .map_err(|e| DspError::Unavailable(format!("remote_handle64_open: {e}")))?;
            let mut h = 0u64;
            // SAFETY: the URI is NUL-terminated and `h` is a valid out-pointer.
            let rc = unsafe { open(SKEL_URI.as_ptr().cast(), &mut h) };
            if rc != 0 {
                return Err(DspError::Unavailable(format!(
                    "opening the skel failed ({rc:#x})"
                )));
            }
            self.handle = Some(h);
            Ok(())
        }
        #[cfg(not(target_os = "android"))]
        Err(DspError::Unavailable(
            "FastRPC needs Android's libcdsprpc.so".into(),
        ))
    }

    fn abandon(&mut self) {
        self.close();
    }

    fn is_up(&self) -> bool {
        self.handle.is_some()
    }

    fn name(&self) -> &'static str {
        "fastrpc"
    }
}

impl Drop for FastRpc {
    fn drop(&mut self) {
        self.close();
    }
}
