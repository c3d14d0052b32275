//! The int8 convolution fast path for *flat* geometries — stride 1 with output rows as wide as the input
//! rows (horizontal `same` padding), the shape of small-image CNNs — on CPUs where the packing-free
//! products [`igemm_pairs`] and [`igemm_dot`] run SIMD code ([`has_simd_pairs`]).
//!
//! In a flat convolution every kernel tap reads the input plane shifted by one constant offset. With each
//! plane copied once between zero bytes, an im2col row of a sample is a single contiguous copy of `P`
//! bytes, masked where its column falls outside the image; it is written straight in the layout the
//! product reads — depth pairs interleaved for the forward ([`igemm_pairs`], no packing), plain rows for
//! the weight gradient ([`igemm_dot`] against the block's `dY` rows, one contiguous depth each). The derivative of a
//! stride-1 convolution is the convolution of `dY` with the flipped, transposed kernel and padding
//! `k − 1 − p`, so it runs through the forward's code with no col2im.
//!
//! The products are exact integers like the general path's, so which path runs never changes a value:
//! the executor's results are bit-identical on every target.
use super::conv_dims;
use super::ops::{copy_small, gather_dy};
use crate::kernels::int8::{
    has_simd_pairs, igemm_dot, igemm_pairs, pair_word, FlatTaps, IgemmKernel, RowWriter,
};
use crate::ops::ConvGeom;

/// Bytes of the column masks (a stack buffer): one row of `P` per kernel column.
pub(crate) const MASKS: usize = 4096;

/// A flat geometry and the constants of its padded planes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Flat {
    g: ConvGeom,
    /// Output positions per sample (`oh·w`).
    p: usize,
    /// Input plane (`h·w`).
    hw: usize,
    /// Zero bytes before every plane (and after the last): at least the largest shift either way.
    pad: usize,
    /// `ph·w + pw`: a tap `(ki, kj)` reads the plane from `ki·w + kj − lead`.
    lead: usize,
    /// The im2col row writers.
    rows: RowWriter,
}

/// The geometry of the derivative as a convolution: `dY` (`cout` channels of `oh × ow`) with the flipped,
/// transposed kernel gives `dX` (`cin` channels of `h × w`). `None` where that is not a flat convolution
/// (`ph ≥ kh` or `pw ≥ kw`).
pub(crate) fn transposed(g: &ConvGeom) -> Option<ConvGeom> {
    let t = ConvGeom::new(
        g.cout,
        g.oh,
        g.ow,
        g.cin,
        g.kh,
        g.kw,
        1,
        1,
        (g.kh - 1).checked_sub(g.ph)?,
        (g.kw - 1).checked_sub(g.pw)?,
        g.groups,
    )?;
    (t.oh == g.h && t.ow == g.w).then_some(t)
}

impl Flat {
    /// The fast path's constants for `g`, or `None` when it does not apply (not flat, masks too large
    /// for their stack buffer, or no SIMD products on this CPU).
    pub(crate) fn new(g: &ConvGeom) -> Option<Self> {
        if g.sh != 1 || g.sw != 1 || g.ow != g.w || !has_simd_pairs(IgemmKernel::selected()) {
            return None;
        }
        let (hw, p) = (g.h * g.w, g.oh * g.w);
        let lead = g.ph * g.w + g.pw;
        // The last byte any tap reads, relative to the plane: (oh−1+kh−1)·w + (w−1+kw−1) − lead.
        let last = ((g.oh + g.kh - 2) * g.w + g.w + g.kw - 2).saturating_sub(lead);
        let pad = lead.max((last + 1).saturating_sub(hw));
        (g.kw * p <= MASKS).then_some(Self {
            g: *g,
            p,
            hw,
            pad,
            lead,
            rows: RowWriter::selected(),
        })
    }

    /// Depth pairs of one group's im2col.
    pub(crate) fn kp(&self) -> usize {
        conv_dims(&self.g).2.div_ceil(2)
    }

    /// Column masks: row `kj` holds −1 where output column `ox + kj − pw` is inside the image, 0 where
    /// not.
    pub(crate) fn masks(&self, m: &mut [i8; MASKS]) {
        let (g, p) = (&self.g, self.p);
        for kj in 0..g.kw {
            for (pos, v) in m[kj * p..(kj + 1) * p].iter_mut().enumerate() {
                let ix = (pos % g.w + kj) as isize - g.pw as isize;
                *v = if (0..g.w as isize).contains(&ix) {
                    -1
                } else {
                    0
                };
            }
        }
    }

    /// The weights of group-major rows `W[co][kg]` as depth-pair words `[cout][kp]`.
    pub(crate) fn weight_words(&self, w: &[i8], words: &mut [i32]) {
        let (_, _, kg, _) = conv_dims(&self.g);
        let kp = self.kp();
        for (row, dst) in w[..self.g.cout * kg]
            .chunks_exact(kg)
            .zip(words.chunks_exact_mut(kp))
        {
            for (q, d) in dst.iter_mut().enumerate() {
                let hi = row.get(2 * q + 1).copied().unwrap_or(0);
                *d = pair_word(row[2 * q], hi);
            }
        }
    }

    /// For the derivative (`self` is [`transposed`] of `g`): the words of the flipped, transposed kernel,
    /// `W'[ci][(co_l, ki, kj)] = W[co][ci_l][kh−1−ki][kw−1−kj]`, as `[cin][kp]`.
    pub(crate) fn transposed_words(&self, g: &ConvGeom, w: &[i8], words: &mut [i32]) {
        let (cin_g, cout_g, kg, _) = conv_dims(g);
        let (kk, kp) = (g.kh * g.kw, self.kp());
        for (ci, dst) in words.chunks_exact_mut(kp).take(g.cin).enumerate() {
            let (grp, ci_l) = (ci / cin_g, ci % cin_g);
            // Row (co_l, ki, kj) in order reads tap (kh−1−ki, kw−1−kj): the taps backwards.
            let mut taps = (0..cout_g).flat_map(|co_l| {
                let base = (grp * cout_g + co_l) * kg + ci_l * kk;
                w[base..base + kk].iter().rev().copied()
            });
            for d in dst.iter_mut() {
                let lo = taps.next().unwrap_or(0);
                *d = pair_word(lo, taps.next().unwrap_or(0));
            }
        }
    }

    /// Bytes of one group's pair-interleaved im2col of `samples` samples (`kp` rows of `2·samples·P`).
    pub(crate) fn x2_len(&self, samples: usize) -> usize {
        self.kp() * 2 * samples * self.p
    }

    /// Bytes of the padded planes of one group of `samples` samples: every plane after `pad` zero bytes,
    /// and `pad` zero bytes after the last.
    pub(crate) fn planes_len(&self, samples: usize) -> usize {
        let cin_g = self.g.cin / self.g.groups;
        self.pad + samples * cin_g * (self.hw + self.pad)
    }

    /// Zeroes the padded planes of `samples` samples in `buf`: once per op, after which
    /// [`Self::load_planes`] only writes the planes and the zero bytes between them stay.
    pub(crate) fn clear_planes(&self, buf: &mut [i8], samples: usize) {
        buf[..self.planes_len(samples)].fill(0);
    }

    /// Copies group `grp`'s planes of `samples` samples of `x` into `buf` (cleared by
    /// [`Self::clear_planes`] for at least `samples` samples), each after `pad` zero bytes.
    fn load_planes(&self, x: &[i8], samples: usize, grp: usize, buf: &mut [i8]) {
        let g = &self.g;
        let (cin_g, hw, pad) = (g.cin / g.groups, self.hw, self.pad);
        for s in 0..samples {
            let src = &x[(s * g.cin + grp * cin_g) * hw..(s * g.cin + (grp + 1) * cin_g) * hw];
            let at = pad + s * cin_g * (hw + pad);
            for (c, plane) in src.chunks_exact(hw).enumerate() {
                let d = at + c * (hw + pad);
                copy_small(&mut buf[d..d + hw], plane);
            }
        }
    }

    /// The taps of one group's im2col over the planes [`Self::load_planes`] wrote.
    fn taps(&self) -> FlatTaps {
        let g = &self.g;
        let (cin_g, _, kg, p) = conv_dims(g);
        let plane = self.hw + self.pad;
        FlatTaps {
            rows: kg,
            kh: g.kh,
            kw: g.kw,
            w: g.w,
            plane,
            sample: cin_g * plane,
            // pad ≥ lead: the subtraction does not wrap.
            first: self.pad - self.lead,
            p,
        }
    }

    /// The forward products of one tile and group: the pair-interleaved im2col of `samples` samples of
    /// `x` (group `grp`'s channels, padded into `buf`) into `x2`, then `acc[co][s·P + pos] = Σ W·cols`
    /// for the group's `cout_g` rows of `acc` (row stride `samples·P`, added to them with `accumulate`);
    /// `words` are the group's rows.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn fwd_group(
        &self,
        x: &[i8],
        samples: usize,
        grp: usize,
        words: &[i32],
        masks: &[i8; MASKS],
        buf: &mut [i8],
        x2: &mut [i8],
        acc: &mut [i32],
        accumulate: bool,
    ) {
        let g = &self.g;
        let (_, cout_g, _, p) = conv_dims(g);
        let (kp, ld) = (self.kp(), samples * p);
        self.load_planes(x, samples, grp, buf);
        let buf = &buf[..self.planes_len(samples)];
        self.rows
            .im2col_pairs(&self.taps(), samples, buf, &masks[..], x2, 2 * ld);
        igemm_pairs(
            cout_g,
            ld,
            kp,
            words,
            kp,
            &x2[..kp * 2 * ld],
            2 * ld,
            &mut acc[..cout_g * ld],
            ld,
            accumulate,
        );
    }

    /// The weight gradient of one block of `samples` samples and group `grp`: `dw[co][kg] (+)= Σ dY·cols`
    /// with the plain im2col in `cols` (`kg` rows of `samples·P`, padded planes in `buf`) and the group's
    /// channels of `dy` (`[samples][cout][P]` from the block's first sample) gathered into `dyc` (`cout_g`
    /// rows of `samples·P`, one contiguous depth per output).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn grad_w_group(
        &self,
        x: &[i8],
        dy: &[i8],
        samples: usize,
        grp: usize,
        masks: &[i8; MASKS],
        buf: &mut [i8],
        cols: &mut [i8],
        dyc: &mut [i8],
        dw: &mut [i32],
        accumulate: bool,
    ) {
        let g = &self.g;
        let (_, cout_g, kg, p) = conv_dims(g);
        let ld = samples * p;
        self.load_planes(x, samples, grp, buf);
        let buf = &buf[..self.planes_len(samples)];
        self.rows
            .im2col(&self.taps(), samples, buf, &masks[..], cols, ld);
        gather_dy(g, dy, samples, grp, dyc, ld);
        igemm_dot(
            cout_g,
            kg,
            1,
            ld,
            &dyc[..cout_g * ld],
            ld,
            0,
            &cols[..kg * ld],
            ld,
            0,
            &mut dw[..cout_g * kg],
            kg,
            accumulate,
        );
    }
}
