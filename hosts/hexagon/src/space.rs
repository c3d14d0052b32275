//! The planned DSP space as the host keeps track of it.
//!
//! A DSP plan ([`DspPlan`](crate::DspPlan)) lays the storages of its DSP-placed nodes out in their own
//! memory space ([`DSP_SPACE`](crate::DSP_SPACE)). The skel maps that space once per plan
//! ([`Dsp::prepare_space`]); the host keeps a *mirror* of it (the integer bookkeeping of a DSP
//! instruction — exponents, bias adds, alignment — runs on the host, on the mirror) and a *record*
//! (`shadow`) of what the DSP's copy holds, byte for byte. A kernel whose operands all lie in the
//! mirror runs on the DSP's copy ([`Op::InSpace`]): only the operand bytes that differ from the record
//! travel first (one [`Dsp::write_space`] of the differing span), the output is written into the space
//! by the DSP and comes back (the host's bookkeeping reads it), and the record follows both. A weight
//! the DSP read in one call is not sent again until the host changes it (its update, once a step); an
//! output the DSP produced is not sent back to it. Operands outside the mirror (the host's f32 batch)
//! go inline as before.
use frugal_core::kernels::int8::{MatRef, Rounding};
use frugal_core::ops::ConvGeom;

use crate::dsp::{extent, gemm_params, im2col_params, rescale_params, Dsp};
use crate::error::DspError;
use crate::proto::Op;
use crate::transport::Transport;

/// The host's record of the DSP space (see the module documentation).
#[derive(Default)]
pub(crate) struct Resident {
    /// Address and length of the host's mirror of the space (length 0: no planned space).
    pub base: usize,
    pub len: usize,
    /// What the DSP's space holds.
    pub shadow: Vec<u8>,
    /// The DSP holds a space of `shadow.len()` bytes (mapped in its current process).
    pub ready: bool,
    /// What the skel answered to the last preparation: (generation, spaces mapped).
    pub prepared: (u32, u32),
}

fn bytes_of<T: bytemuck::Pod>(x: &[T]) -> &[u8] {
    bytemuck::cast_slice(x)
}

impl Resident {
    /// The offset in the space of `bytes` bytes at `p` when they lie in the mirror.
    fn at(&self, p: *const u8, bytes: usize) -> Option<usize> {
        if !self.ready || bytes == 0 {
            return None;
        }
        let off = (p as usize).checked_sub(self.base)?;
        (off.checked_add(bytes)? <= self.len).then_some(off)
    }

    /// Sends the span of `data` (at `off` of the space) the DSP does not hold yet.
    fn sync<T: Transport>(
        &mut self,
        dsp: &mut Dsp<T>,
        off: usize,
        data: &[u8],
    ) -> Result<(), DspError> {
        let have = &self.shadow[off..off + data.len()];
        let Some(i0) = data.iter().zip(have).position(|(a, b)| a != b) else {
            return Ok(());
        };
        let i1 = data
            .iter()
            .zip(have)
            .rposition(|(a, b)| a != b)
            .unwrap_or(i0);
        dsp.write_space(off + i0, &data[i0..=i1])?;
        self.shadow[off + i0..=off + i1].copy_from_slice(&data[i0..=i1]);
        Ok(())
    }

    /// Records `bytes` the DSP wrote at `off`.
    fn record(&mut self, off: usize, bytes: &[u8]) {
        self.shadow[off..off + bytes.len()].copy_from_slice(bytes);
    }

    /// [`Dsp::igemm`] on the space's copies; `None` when an operand is not in the mirror.
    #[allow(clippy::too_many_arguments)]
    pub fn igemm<T: Transport>(
        &mut self,
        dsp: &mut Dsp<T>,
        m: usize,
        n: usize,
        k: usize,
        a: MatRef<'_, i8>,
        b: MatRef<'_, i8>,
        c: &mut [i32],
        ldc: usize,
        accumulate: bool,
    ) -> Option<Result<(), DspError>> {
        if m == 0 || n == 0 || k == 0 {
            return None;
        }
        let (al, bl, cl) = (extent(&a, m, k), extent(&b, k, n), (m - 1) * ldc + n);
        let (ab, bb) = (bytes_of(&a.data[..al]), bytes_of(&b.data[..bl]));
        let cb = bytes_of(c.get(..cl)?);
        let (oa, ob, oc) = (
            self.at(ab.as_ptr(), al)?,
            self.at(bb.as_ptr(), bl)?,
            self.at(cb.as_ptr(), 4 * cl)?,
        );
        let mut run = || {
            dsp.calls.gemm += 1;
            let params = gemm_params(m, n, k, &a, &b, accumulate)?;
            self.sync(dsp, oa, ab)?;
            self.sync(dsp, ob, bb)?;
            if accumulate {
                self.sync(dsp, oc, bytes_of(&c[..cl]))?;
            }
            let cs = [oc, 4 * n, m, 4 * ldc];
            let srcs = [[oa, al, 1, al], [ob, bl, 1, bl], cs];
            let srcs = if accumulate { &srcs[..] } else { &srcs[..2] };
            let r = dsp.in_space(Op::Gemm, false, srcs, &[cs], &params, 4 * m * n, 0)?;
            for (i, row) in r.payload.chunks_exact(4 * n).enumerate() {
                for (d, v) in c[i * ldc..i * ldc + n].iter_mut().zip(row.chunks_exact(4)) {
                    *d = i32::from_le_bytes([v[0], v[1], v[2], v[3]]);
                }
                let at = oc + 4 * i * ldc;
                self.shadow[at..at + 4 * n].copy_from_slice(row);
            }
            Ok(())
        };
        Some(run())
    }

    /// [`Dsp::rescale`] on the space's copies.
    pub fn rescale<T: Transport>(
        &mut self,
        dsp: &mut Dsp<T>,
        src: &[i32],
        shift: u32,
        rounding: Rounding,
        offset: u64,
        dst: &mut [i8],
    ) -> Option<Result<usize, DspError>> {
        let n = src.len();
        let sb = bytes_of(src);
        let os = self.at(sb.as_ptr(), 4 * n)?;
        let od = self.at(bytes_of(dst.get(..n)?).as_ptr(), n)?;
        let mut run = || {
            dsp.calls.rescale += 1;
            let params = rescale_params(n, shift, rounding, offset)?;
            self.sync(dsp, os, sb)?;
            let r = dsp.in_space(
                Op::Rescale,
                false,
                &[[os, 4 * n, 1, 4 * n]],
                &[[od, n, 1, n]],
                &params,
                n,
                1,
            )?;
            for (d, &v) in dst.iter_mut().zip(&r.payload) {
                *d = v as i8;
            }
            let clamped = r.results[0] as usize;
            let Self { shadow, .. } = self;
            shadow[od..od + n].copy_from_slice(&r.payload);
            Ok(clamped)
        };
        Some(run())
    }

    /// [`Dsp::maxpool2x2`] on the space's copies.
    pub fn maxpool2x2<T: Transport>(
        &mut self,
        dsp: &mut Dsp<T>,
        x: &[i8],
        w: usize,
        pairs: usize,
        y: &mut [i8],
        idx: &mut [u8],
    ) -> Option<Result<(), DspError>> {
        let (outn, xn) = (pairs * (w / 2), pairs * 2 * w);
        let xb = bytes_of(x.get(..xn)?);
        let ox = self.at(xb.as_ptr(), xn)?;
        let oy = self.at(bytes_of(y.get(..outn)?).as_ptr(), outn)?;
        let oi = self.at(idx.get(..outn)?.as_ptr(), outn)?;
        let mut run = || {
            dsp.calls.pool += 1;
            let params = [w as u32, pairs as u32];
            self.sync(dsp, ox, xb)?;
            let r = dsp.in_space(
                Op::MaxPool,
                false,
                &[[ox, xn, 1, xn]],
                &[[oy, outn, 1, outn], [oi, outn, 1, outn]],
                &params,
                2 * outn,
                0,
            )?;
            let (yv, iv) = r.payload.split_at(outn);
            for (d, &v) in y[..outn].iter_mut().zip(yv) {
                *d = v as i8;
            }
            idx[..outn].copy_from_slice(iv);
            let Self { shadow, .. } = self;
            shadow[oy..oy + outn].copy_from_slice(yv);
            shadow[oi..oi + outn].copy_from_slice(iv);
            Ok(())
        };
        Some(run())
    }

    /// [`Dsp::maxpool2x2_grad`] on the space's copies.
    pub fn maxpool2x2_grad<T: Transport>(
        &mut self,
        dsp: &mut Dsp<T>,
        dy: &[i8],
        idx: &[u8],
        w: usize,
        pairs: usize,
        dx: &mut [i8],
    ) -> Option<Result<(), DspError>> {
        let (outn, xn) = (pairs * (w / 2), pairs * 2 * w);
        let (dyb, ib) = (bytes_of(dy.get(..outn)?), idx.get(..outn)?);
        let (ody, oi) = (self.at(dyb.as_ptr(), outn)?, self.at(ib.as_ptr(), outn)?);
        let odx = self.at(bytes_of(dx.get(..xn)?).as_ptr(), xn)?;
        let mut run = || {
            dsp.calls.pool += 1;
            let params = [w as u32, pairs as u32];
            self.sync(dsp, ody, dyb)?;
            self.sync(dsp, oi, ib)?;
            self.sync(dsp, odx, bytes_of(&dx[..xn]))?;
            let r = dsp.in_space(
                Op::MaxPoolGrad,
                false,
                &[[ody, outn, 1, outn], [oi, outn, 1, outn], [odx, xn, 1, xn]],
                &[[odx, xn, 1, xn]],
                &params,
                xn,
                0,
            )?;
            for (d, &v) in dx[..xn].iter_mut().zip(&r.payload) {
                *d = v as i8;
            }
            self.record(odx, bytes_of(&dx[..xn]));
            Ok(())
        };
        Some(run())
    }

    /// [`Dsp::im2col_ld`] from the space's copy of `x` into its `cols`, the columns staying there:
    /// the host lays out the same columns in its mirror with the CPU's im2col (bit-exact with the
    /// DSP's, the conformance suite) instead of receiving them — they are `kh·kw` times the input.
    #[allow(clippy::too_many_arguments)]
    pub fn im2col<T: Transport>(
        &mut self,
        dsp: &mut Dsp<T>,
        geom: [usize; 13],
        x: &[i8],
        samples: usize,
        grp: usize,
        cols: &mut [i8],
        ld: usize,
    ) -> Option<Result<(), DspError>> {
        let [cin, h, w, cout, kh, kw, sh, sw, ph, pw, groups, ..] = geom;
        let g = ConvGeom::new(cin, h, w, cout, kh, kw, sh, sw, ph, pw, groups)?;
        if crate::dsp::geom_of(&g) != geom {
            return None;
        }
        let (params, xn, kg, span) = match im2col_params(geom, samples, grp) {
            Ok(p) => p,
            Err(e) => return Some(Err(e)),
        };
        if kg == 0 || span == 0 || ld < span {
            return None;
        }
        let xb = bytes_of(x.get(..xn)?);
        let ox = self.at(xb.as_ptr(), xn)?;
        let cl = (kg - 1) * ld + span;
        let oc = self.at(bytes_of(cols.get(..cl)?).as_ptr(), cl)?;
        let mut run = || {
            dsp.calls.other += 1;
            self.sync(dsp, ox, xb)?;
            dsp.in_space(
                Op::Im2col,
                true,
                &[[ox, xn, 1, xn]],
                &[[oc, span, kg, ld]],
                &params,
                0,
                0,
            )?;
            // The CPU's im2col (the offload is busy serving this call, so it runs on the CPU).
            frugal_core::quant::ops::im2col(&g, x, samples, grp, cols, ld);
            for i in 0..kg {
                let at = oc + i * ld;
                self.shadow[at..at + span].copy_from_slice(bytes_of(&cols[i * ld..i * ld + span]));
            }
            Ok(())
        };
        Some(run())
    }
}
