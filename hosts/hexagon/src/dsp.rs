//! The DSP's kernels as typed calls over a [`Transport`]: operands in, results out, every reply
//! checked for the length the call expects. Bit-exact with `frugal_core::kernels::int8`.
use frugal_core::kernels::int8::{MatRef, Rounding};
use frugal_core::ops::ConvGeom;

use crate::error::DspError;
use crate::proto::{Op, Reply, Request};
use crate::transport::Transport;

/// Calls per operation, for reports and the counting tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Calls {
    /// GEMMs.
    pub gemm: u64,
    /// Rescales.
    pub rescale: u64,
    /// Max-pool forwards and backwards.
    pub pool: u64,
    /// Quantisations.
    pub quantize: u64,
    /// Everything else (pings, im2col, max-abs, space preparations and checksums).
    pub other: u64,
    /// Of those, calls on operands in the DSP space (no operand bytes sent with them).
    pub in_space: u64,
    /// Writes into the DSP space (the operand bytes it did not hold yet).
    pub space_writes: u64,
    /// Bytes sent to the DSP.
    pub bytes_in: u64,
    /// Bytes received from it.
    pub bytes_out: u64,
}

/// A DSP behind a transport.
pub struct Dsp<T: Transport> {
    /// The transport.
    pub transport: T,
    reply: Reply,
    /// What has been asked so far.
    pub calls: Calls,
}

fn as_bytes(x: &[i8]) -> &[u8] {
    bytemuck::cast_slice(x)
}

/// The bytes a strided `rows × cols` view addresses (from its first element).
pub(crate) fn extent(x: &MatRef<'_, i8>, rows: usize, cols: usize) -> usize {
    if rows == 0 || cols == 0 {
        return 0;
    }
    ((rows - 1) * x.rs + (cols - 1) * x.cs + 1).min(x.data.len())
}

pub(crate) fn u32_of(op: &'static str, v: usize) -> Result<u32, DspError> {
    u32::try_from(v).map_err(|_| DspError::TooLarge {
        op,
        bytes: v as u64,
    })
}

/// The parameters of a GEMM request (`dsp/proto.h`).
pub(crate) fn gemm_params(
    m: usize,
    n: usize,
    k: usize,
    a: &MatRef<'_, i8>,
    b: &MatRef<'_, i8>,
    accumulate: bool,
) -> Result<[u32; 10], DspError> {
    const OP: &str = "gemm";
    let (al, bl) = (extent(a, m, k), extent(b, k, n));
    Ok([
        u32_of(OP, m)?,
        u32_of(OP, n)?,
        u32_of(OP, k)?,
        u32_of(OP, a.rs)?,
        u32_of(OP, a.cs)?,
        u32_of(OP, b.rs)?,
        u32_of(OP, b.cs)?,
        accumulate as u32,
        u32_of(OP, al)?,
        u32_of(OP, bl)?,
    ])
}

/// The parameters of a rescale request.
pub(crate) fn rescale_params(
    len: usize,
    shift: u32,
    rounding: Rounding,
    offset: u64,
) -> Result<[u32; 7], DspError> {
    let (mode, seed) = match rounding {
        Rounding::Nearest => (0, 0u64),
        Rounding::Stochastic(s) => (1, s),
    };
    Ok([
        u32_of("rescale", len)?,
        shift,
        mode,
        seed as u32,
        (seed >> 32) as u32,
        offset as u32,
        (offset >> 32) as u32,
    ])
}

impl<T: Transport> Dsp<T> {
    /// A DSP over `transport`.
    pub fn new(transport: T) -> Self {
        Self {
            transport,
            reply: Reply::default(),
            calls: Calls::default(),
        }
    }

    fn call(
        &mut self,
        op: Op,
        params: &[u32],
        payload: &[&[u8]],
        want_len: usize,
        want_results: usize,
    ) -> Result<&Reply, DspError> {
        self.calls.bytes_in += payload.iter().map(|p| p.len() as u64).sum::<u64>();
        self.transport.call(
            &Request {
                op,
                params,
                payload,
                reply_len: want_len,
            },
            &mut self.reply,
        )?;
        if self.reply.payload.len() != want_len {
            self.transport_failed();
            return Err(DspError::BadReply {
                op: op.name(),
                what: "reply payload has the wrong length",
            });
        }
        if self.reply.nresults != want_results {
            self.transport_failed();
            return Err(DspError::BadReply {
                op: op.name(),
                what: "reply has the wrong number of results",
            });
        }
        self.calls.bytes_out += want_len as u64;
        Ok(&self.reply)
    }

    fn transport_failed(&mut self) {
        // A well-framed reply of the wrong shape: the skel and host disagree; start afresh next time.
        self.transport.abandon();
    }

    /// The protocol version the skel speaks.
    pub fn ping(&mut self) -> Result<u32, DspError> {
        self.calls.other += 1;
        Ok(self.call(Op::Ping, &[], &[], 0, 1)?.results[0])
    }

    /// `C[m×n] (row stride ldc) = (accumulate ? C : 0) + A·B` on the DSP (HVX `vrmpy`). Operands are
    /// copied per call (the transport), C comes back dense.
    #[allow(clippy::too_many_arguments)]
    pub fn igemm(
        &mut self,
        m: usize,
        n: usize,
        k: usize,
        a: MatRef<'_, i8>,
        b: MatRef<'_, i8>,
        c: &mut [i32],
        ldc: usize,
        accumulate: bool,
        cbuf: &mut Vec<i32>,
    ) -> Result<(), DspError> {
        self.calls.gemm += 1;
        let (al, bl) = (extent(&a, m, k), extent(&b, k, n));
        let params = gemm_params(m, n, k, &a, &b, accumulate)?;
        cbuf.clear();
        if accumulate {
            for i in 0..m {
                cbuf.extend_from_slice(&c[i * ldc..i * ldc + n]);
            }
        }
        let cbytes: &[u8] = bytemuck::cast_slice(cbuf);
        let r = self.call(
            Op::Gemm,
            &params,
            &[as_bytes(&a.data[..al]), as_bytes(&b.data[..bl]), cbytes],
            m * n * 4,
            0,
        )?;
        for (i, row) in r.payload.chunks_exact(4 * n.max(1)).enumerate().take(m) {
            for (d, v) in c[i * ldc..i * ldc + n].iter_mut().zip(row.chunks_exact(4)) {
                *d = i32::from_le_bytes([v[0], v[1], v[2], v[3]]);
            }
        }
        Ok(())
    }

    /// [`rescale_i32_to_i8`](frugal_core::kernels::int8::rescale_i32_to_i8) on the DSP; returns the
    /// clamped count.
    pub fn rescale(
        &mut self,
        src: &[i32],
        shift: u32,
        rounding: Rounding,
        offset: u64,
        dst: &mut [i8],
    ) -> Result<usize, DspError> {
        self.calls.rescale += 1;
        let params = rescale_params(src.len(), shift, rounding, offset)?;
        let r = self.call(
            Op::Rescale,
            &params,
            &[bytemuck::cast_slice(src)],
            src.len(),
            1,
        )?;
        for (d, &v) in dst.iter_mut().zip(&r.payload) {
            *d = v as i8;
        }
        Ok(r.results[0] as usize)
    }

    /// `max |x|` on the DSP.
    pub fn max_abs(&mut self, x: &[i32]) -> Result<u32, DspError> {
        self.calls.other += 1;
        let r = self.call(Op::MaxAbs, &[], &[bytemuck::cast_slice(x)], 0, 1)?;
        Ok(r.results[0])
    }

    /// [`maxpool2x2`](frugal_core::kernels::int8::maxpool2x2) on the DSP.
    pub fn maxpool2x2(
        &mut self,
        x: &[i8],
        w: usize,
        pairs: usize,
        y: &mut [i8],
        idx: &mut [u8],
    ) -> Result<(), DspError> {
        const OP: &str = "max-pool";
        self.calls.pool += 1;
        let outn = pairs * (w / 2);
        let r = self.call(
            Op::MaxPool,
            &[u32_of(OP, w)?, u32_of(OP, pairs)?],
            &[as_bytes(&x[..pairs * 2 * w])],
            2 * outn,
            0,
        )?;
        let (yv, iv) = r.payload.split_at(outn);
        for (d, &v) in y[..outn].iter_mut().zip(yv) {
            *d = v as i8;
        }
        idx[..outn].copy_from_slice(iv);
        Ok(())
    }

    /// [`maxpool2x2_grad`](frugal_core::kernels::int8::maxpool2x2_grad) on the DSP.
    pub fn maxpool2x2_grad(
        &mut self,
        dy: &[i8],
        idx: &[u8],
        w: usize,
        pairs: usize,
        dx: &mut [i8],
    ) -> Result<(), DspError> {
        const OP: &str = "max-pool backward";
        self.calls.pool += 1;
        let (outn, xn) = (pairs * (w / 2), pairs * 2 * w);
        let r = self.call(
            Op::MaxPoolGrad,
            &[u32_of(OP, w)?, u32_of(OP, pairs)?],
            &[as_bytes(&dy[..outn]), &idx[..outn], as_bytes(&dx[..xn])],
            xn,
            0,
        )?;
        for (d, &v) in dx[..xn].iter_mut().zip(&r.payload) {
            *d = v as i8;
        }
        Ok(())
    }

    /// [`quantize_f32`](frugal_core::kernels::int8::quantize_f32) on the DSP.
    pub fn quantize(&mut self, src: &[f32], k: f32, dst: &mut [i8]) -> Result<(), DspError> {
        const OP: &str = "quantise";
        self.calls.quantize += 1;
        let r = self.call(
            Op::Quantize,
            &[u32_of(OP, src.len())?, k.to_bits()],
            &[bytemuck::cast_slice(src)],
            src.len(),
            0,
        )?;
        for (d, &v) in dst.iter_mut().zip(&r.payload) {
            *d = v as i8;
        }
        Ok(())
    }

    /// Frees the DSP space and maps a zeroed one of `bytes` (once per plan); returns the space's
    /// generation (prepares so far in this DSP process) and how many spaces are mapped (1, or 0 for
    /// an empty one).
    pub fn prepare_space(&mut self, bytes: usize) -> Result<(u32, u32), DspError> {
        self.calls.other += 1;
        let b = u32_of("prepare", bytes)?;
        let r = self.call(Op::Prepare, &[b], &[], 0, 3)?;
        if r.results[1] != b {
            return Err(DspError::BadReply {
                op: "prepare",
                what: "the space has another size than asked",
            });
        }
        Ok((r.results[0], r.results[2]))
    }

    /// Writes `bytes` at `off` of the DSP space.
    pub fn write_space(&mut self, off: usize, bytes: &[u8]) -> Result<(), DspError> {
        const OP: &str = "space write";
        self.calls.space_writes += 1;
        let params = [1, u32_of(OP, off)?, u32_of(OP, bytes.len())?];
        self.call(Op::Write, &params, &[bytes], 0, 0)?;
        Ok(())
    }

    /// FNV-1a of the whole DSP space and its bytes.
    pub fn space_sum(&mut self) -> Result<(u32, usize), DspError> {
        self.calls.other += 1;
        let r = self.call(Op::SpaceSum, &[], &[], 0, 2)?;
        Ok((r.results[0], r.results[1] as usize))
    }

    /// `inner` with its operands gathered from the DSP space (`srcs`, in the order its payload takes
    /// them) and its output scattered there (`dsts`, in order); each span is `[offset, row bytes,
    /// rows, row stride]`. The output also comes back in the reply, unless `quiet` (`want_len` 0: the
    /// host computes the same bytes itself).
    #[allow(clippy::too_many_arguments)]
    pub fn in_space(
        &mut self,
        inner: Op,
        quiet: bool,
        srcs: &[[usize; 4]],
        dsts: &[[usize; 4]],
        inner_params: &[u32],
        want_len: usize,
        want_results: usize,
    ) -> Result<&Reply, DspError> {
        let op = inner.name();
        self.calls.in_space += 1;
        let mut params = [0u32; crate::proto::MAX_PARAMS];
        let np = 3 + 4 * (srcs.len() + dsts.len()) + inner_params.len();
        if np > params.len() {
            return Err(DspError::TooLarge {
                op,
                bytes: 4 * np as u64,
            });
        }
        params[0] = inner as u32 | if quiet { crate::proto::QUIET } else { 0 };
        params[1] = srcs.len() as u32;
        params[2] = dsts.len() as u32;
        let mut at = 3;
        for sp in srcs.iter().chain(dsts) {
            for &v in sp {
                params[at] = u32_of(op, v)?;
                at += 1;
            }
        }
        params[at..np].copy_from_slice(inner_params);
        self.call(Op::InSpace, &params[..np], &[], want_len, want_results)
    }

    /// im2col of group `grp` of `samples` samples: `cols[kg][samples·oh·ow]` (dense), zero padding.
    pub fn im2col(
        &mut self,
        g: &ConvGeom,
        x: &[i8],
        samples: usize,
        grp: usize,
        cols: &mut [i8],
    ) -> Result<(), DspError> {
        let span = samples * g.oh * g.ow;
        self.im2col_ld(geom_of(g), x, samples, grp, cols, span)
    }

    /// [`Self::im2col`] into rows `ld` apart (`ld ≥ samples·oh·ow`; the rest of each row untouched),
    /// the geometry as `[cin, h, w, cout, kh, kw, sh, sw, ph, pw, groups, oh, ow]`.
    pub fn im2col_ld(
        &mut self,
        geom: [usize; 13],
        x: &[i8],
        samples: usize,
        grp: usize,
        cols: &mut [i8],
        ld: usize,
    ) -> Result<(), DspError> {
        self.calls.other += 1;
        let (params, xn, kg, span) = im2col_params(geom, samples, grp)?;
        let r = self.call(Op::Im2col, &params, &[as_bytes(&x[..xn])], kg * span, 0)?;
        for (row, src) in cols
            .chunks_mut(ld.max(1))
            .zip(r.payload.chunks_exact(span.max(1)))
        {
            for (d, &v) in row[..span].iter_mut().zip(src) {
                *d = v as i8;
            }
        }
        Ok(())
    }
}

/// `[cin, h, w, cout, kh, kw, sh, sw, ph, pw, groups, oh, ow]` of `g`.
pub(crate) fn geom_of(g: &ConvGeom) -> [usize; 13] {
    [
        g.cin, g.h, g.w, g.cout, g.kh, g.kw, g.sh, g.sw, g.ph, g.pw, g.groups, g.oh, g.ow,
    ]
}

/// The parameters of an im2col request, the input bytes it reads, and its output rows and row
/// length.
pub(crate) fn im2col_params(
    geom: [usize; 13],
    samples: usize,
    grp: usize,
) -> Result<([u32; 15], usize, usize, usize), DspError> {
    const OP: &str = "im2col";
    let [cin, h, w, _, kh, kw, _, _, _, _, groups, oh, ow] = geom;
    let mut params = [0u32; 15];
    for (p, &d) in params.iter_mut().zip(geom.iter().chain(&[samples, grp])) {
        *p = u32_of(OP, d)?;
    }
    let kg = cin / groups.max(1) * kh * kw;
    Ok((params, samples * cin * h * w, kg, samples * oh * ow))
}
