//! Frozen parameters read from a read-only parameter image ([`crate::plan::params`]): the arena shrinks
//! by exactly their bytes, f32 training is bit-identical to the plan that copies them into the arena,
//! int8 and fp16 weights train exactly as their dequantised (rounded) values in the arena do — a LoRA
//! transformer's frozen base included — and images that do not fit or are corrupt are typed errors.
use alloc::vec::Vec;

use super::sparse_tests::{configs, data, mbv2_like};
use super::*;
use crate::format::plan::{decode_plan_unnamed, encode_plan};
use crate::graph::Graph;
use crate::plan::params::{read_only_tensors, split_state, ParamEncoding, ParamsError};
use crate::plan::{Plan, SpaceId};

const BATCH: usize = 4;

fn round_up(v: usize) -> usize {
    v.div_ceil(ALIGN) * ALIGN
}

/// Every persistent tensor of `ex`'s plan, little-endian f32 in state order (a checkpoint's bytes).
fn state(ex: &mut Executor<'_>, arena: &mut [u8]) -> Vec<u8> {
    let ids: Vec<TensorId> = ex.state_ids().collect();
    let mut out = Vec::new();
    for t in ids {
        for v in ex.read_vec(arena, t).unwrap() {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
    out
}

/// The sparse-update configurations that freeze something (a channel subset everywhere freezes
/// nothing whole, so it keeps every parameter in the arena).
fn frozen_configs() -> Vec<(&'static str, Vec<Option<crate::model::Update>>)> {
    let c: Vec<_> = configs()
        .into_iter()
        .filter(|(_, upd)| {
            let g = Graph::new(&mbv2_like(upd), BATCH).unwrap();
            let any = read_only_tensors(&g).next().is_some();
            any
        })
        .collect();
    assert!(c.len() >= 4, "the configurations with frozen parameters");
    c
}

/// The plain plan's initial state (seeded initialisation).
fn initial_state(plan: &Plan) -> Vec<u8> {
    let mut arena = alloc::vec![0u8; plan.needed_bytes()];
    let mut ex = Executor::new(plan, &arena).unwrap();
    ex.init_params(&mut arena, 5).unwrap();
    state(&mut ex, &mut arena)
}

/// An image at a 64-byte aligned address (as a firmware's flash section or a host's page).
struct Aligned {
    buf: Vec<u8>,
    at: usize,
    len: usize,
}

impl Aligned {
    fn new(bytes: &[u8]) -> Self {
        let mut buf = alloc::vec![0u8; bytes.len() + ALIGN];
        let at = buf.as_ptr().align_offset(ALIGN);
        buf[at..at + bytes.len()].copy_from_slice(bytes);
        Aligned {
            buf,
            at,
            len: bytes.len(),
        }
    }
    fn bytes(&self) -> &[u8] {
        &self.buf[self.at..self.at + self.len]
    }
}

/// Trains `steps` steps of `plan` from `state` (the image's tensors from `image`); returns each step's
/// loss bits, the evaluation loss bits and the final state.
fn run(plan: &Plan, state: &[u8], image: &[u8], steps: usize) -> (Vec<u32>, u32, Vec<u8>) {
    let mut arena = alloc::vec![0u8; plan.needed_bytes()];
    let mut ex = Executor::with_params(plan, &arena, CpuBackend::new(), image).unwrap();
    ex.init_params(&mut arena, 9).unwrap();
    ex.write_state(&mut arena, state).unwrap();
    let (x, y) = data(BATCH);
    let losses = (0..steps)
        .map(|_| {
            ex.train_step(&mut arena, &x, Target::Classes(&y))
                .unwrap()
                .loss
                .to_bits()
        })
        .collect();
    let eval = ex.evaluate(&mut arena, &x, Target::Classes(&y)).unwrap();
    (losses, eval.loss.to_bits(), state_of(&mut ex, &mut arena))
}

fn state_of(ex: &mut Executor<'_>, arena: &mut [u8]) -> Vec<u8> {
    state(ex, arena)
}

#[test]
fn read_only_parameters_leave_the_arena_by_exactly_their_bytes() {
    for (what, upd) in frozen_configs() {
        let plain = Plan::new(Graph::new(&mbv2_like(&upd), BATCH).unwrap());
        for enc in [ParamEncoding::F32, ParamEncoding::Int8, ParamEncoding::F16] {
            let mut ro = plain.clone();
            let moved = ro.read_only_params(enc).unwrap();
            let tensors: Vec<TensorId> = read_only_tensors(&ro.graph).collect();
            assert_eq!(moved, tensors.len(), "{what}");
            let f32_bytes: usize = tensors
                .iter()
                .map(|&t| round_up(ro.graph.tensors[t as usize].bytes))
                .sum();
            let enc_bytes: usize = tensors
                .iter()
                .map(|&t| round_up(crate::plan::params::encoded_bytes(&ro.graph, t, enc)))
                .sum();
            // The arena: smaller by exactly the f32 bytes (at the arena's alignment) of what left it,
            // but for the region int8/fp16 weights are converted into, at its top: the largest of them.
            let largest = tensors
                .iter()
                .filter_map(|&t| {
                    crate::plan::params::weight_rows(&ro.graph, t)
                        .map(|_| ro.graph.tensors[t as usize].bytes)
                })
                .max()
                .unwrap_or(0);
            let dequant = match enc {
                ParamEncoding::F32 => 0,
                ParamEncoding::Int8 | ParamEncoding::F16 => round_up(largest),
            };
            assert_eq!(
                plain.arena_bytes - ro.arena_bytes,
                f32_bytes - dequant,
                "{what} {enc:?}"
            );
            assert_eq!(
                ro.dequant_region(),
                (dequant > 0).then(|| (ro.arena_bytes - dequant, largest)),
                "{what} {enc:?}"
            );
            // The region is above every storage of the arena.
            let top = ro
                .lives
                .iter_enumerated()
                .filter(|(_, l)| l.space == SpaceId::HOST)
                .map(|(s, l)| ro.offsets[s] + l.bytes)
                .max()
                .unwrap();
            assert!(top <= ro.arena_bytes - dequant, "{what} {enc:?}");
            assert_eq!(ro.params_space(), Some((enc, enc_bytes)), "{what} {enc:?}");
            // None of them has a host storage any more; everything else kept its space.
            for (s, l) in ro.lives.iter_enumerated() {
                let is_ro = tensors.iter().any(|&t| ro.storage_at(t, 0) == Some(s));
                let want = if is_ro { enc.space() } else { SpaceId::HOST };
                assert_eq!(l.space, want, "{what} {enc:?}: storage {}", l.name);
            }
            if enc.narrow() {
                assert!(enc_bytes < f32_bytes, "{what}: {enc:?} weights take less");
            }
        }
    }
}

#[test]
fn training_from_an_f32_image_is_bit_identical_to_the_copied_in_run() {
    for (what, upd) in frozen_configs() {
        let plain = Plan::new(Graph::new(&mbv2_like(&upd), BATCH).unwrap());
        let mut ro = plain.clone();
        ro.read_only_params(ParamEncoding::F32).unwrap();
        let init = initial_state(&plain);
        let (image, rest) = split_state(&ro, &init).unwrap();
        assert!(rest.len() < init.len(), "{what}: some state left the arena");
        let image = Aligned::new(&image);
        let want = run(&plain, &init, &[], 4);
        let got = run(&ro, &rest, image.bytes(), 4);
        assert!(got == want, "{what}: losses, evaluation and final state");
        // Through the plan format (what a microcontroller decodes): the same layout, the same run.
        let spec = mbv2_like(&upd);
        let decoded = decode_plan_unnamed(&encode_plan(&spec, &ro)).unwrap();
        assert_eq!(decoded.params_fingerprint(), ro.params_fingerprint());
        assert_eq!(decoded.arena_bytes, ro.arena_bytes);
        assert!(
            run(&decoded, &rest, image.bytes(), 4) == want,
            "{what}: decoded"
        );
    }
}

#[test]
fn int8_weights_train_as_their_dequantised_values_in_the_arena() {
    for (what, upd) in frozen_configs() {
        let plain = Plan::new(Graph::new(&mbv2_like(&upd), BATCH).unwrap());
        let mut ro = plain.clone();
        ro.read_only_params(ParamEncoding::Int8).unwrap();
        let init = initial_state(&plain);
        let (image, rest) = split_state(&ro, &init).unwrap();
        let image = Aligned::new(&image);
        // The reference: the plain plan holding the dequantised weights (read back from the image).
        let mut arena = alloc::vec![0u8; ro.needed_bytes()];
        let mut ex = Executor::with_params(&ro, &arena, CpuBackend::new(), image.bytes()).unwrap();
        ex.write_state(&mut arena, &rest).unwrap();
        let dequantised = state(&mut ex, &mut arena);
        assert!(
            dequantised != init,
            "{what}: quantisation changed some weight"
        );
        assert!(
            ro.dequant_region().is_some(),
            "{what}: a dequantisation region"
        );
        let want = run(&plain, &dequantised, &[], 4);
        let got = run(&ro, &rest, image.bytes(), 4);
        assert!(got == want, "{what}: losses, evaluation and final state");
        let spec = mbv2_like(&upd);
        let decoded = decode_plan_unnamed(&encode_plan(&spec, &ro)).unwrap();
        assert_eq!(decoded.params_space(), ro.params_space());
        assert!(
            run(&decoded, &rest, image.bytes(), 4) == want,
            "{what}: decoded"
        );
    }
}

#[test]
fn an_image_that_does_not_fit_the_plan_is_a_typed_error() {
    let (_, upd) = &configs()[1];
    let plain = Plan::new(Graph::new(&mbv2_like(upd), BATCH).unwrap());
    let mut ro = plain.clone();
    ro.read_only_params(ParamEncoding::F32).unwrap();
    let mut ro8 = plain.clone();
    ro8.read_only_params(ParamEncoding::Int8).unwrap();
    let init = initial_state(&plain);
    let (image, _) = split_state(&ro, &init).unwrap();
    let arena = alloc::vec![0u8; plain.needed_bytes()];
    let err = |plan: &Plan, img: &[u8]| {
        Executor::with_params(plan, &arena, CpuBackend::new(), img)
            .err()
            .unwrap()
    };
    let good = Aligned::new(&image);
    assert!(Executor::with_params(&ro, &arena, CpuBackend::new(), good.bytes()).is_ok());
    // No image for a plan that needs one; a short one.
    let needed = image.len();
    assert_eq!(
        err(&ro, &[]),
        ExecError::Params(ParamsError::TooShort { needed, given: 0 })
    );
    let short = Aligned::new(&image[..needed - 1]);
    assert_eq!(
        err(&ro, short.bytes()),
        ExecError::Params(ParamsError::TooShort {
            needed,
            given: needed - 1
        })
    );
    // Misaligned: the same bytes one byte off.
    let mut off = alloc::vec![0u8; needed + ALIGN + 1];
    let at = off.as_ptr().align_offset(ALIGN) + 1;
    off[at..at + needed].copy_from_slice(&image);
    assert_eq!(
        err(&ro, &off[at..at + needed]),
        ExecError::Params(ParamsError::Misaligned)
    );
    // Another magic; an image for another encoding or another plan; an image for a plan without one.
    let mut bad = image.clone();
    bad[0] = b'X';
    assert_eq!(
        err(&ro, Aligned::new(&bad).bytes()),
        ExecError::Params(ParamsError::Magic)
    );
    assert!(matches!(
        err(&ro8, good.bytes()),
        ExecError::Params(ParamsError::Mismatch(_))
    ));
    let (_, other) = &configs()[0];
    let mut other_ro = Plan::new(Graph::new(&mbv2_like(other), BATCH).unwrap());
    other_ro.read_only_params(ParamEncoding::F32).unwrap();
    let (other_image, _) = split_state(
        &other_ro,
        &initial_state(&Plan::new(Graph::new(&mbv2_like(other), BATCH).unwrap())),
    )
    .unwrap();
    assert!(matches!(
        err(&ro, Aligned::new(&other_image).bytes()),
        ExecError::Params(ParamsError::Mismatch(_) | ParamsError::TooShort { .. })
    ));
    assert!(matches!(
        err(&plain, good.bytes()),
        ExecError::Params(ParamsError::Mismatch(_))
    ));
    // A state of the wrong length.
    assert!(split_state(&ro, &init[..init.len() - 4]).is_err());
}

/// The state of the plain plan holding what the image of `ro` holds (its int8 weights dequantised,
/// its fp16 weights rounded), read back through an executor of `ro`.
fn as_read_from(ro: &Plan, image: &[u8], rest: &[u8]) -> Vec<u8> {
    let mut arena = alloc::vec![0u8; ro.needed_bytes()];
    let mut ex = Executor::with_params(ro, &arena, CpuBackend::new(), image).unwrap();
    ex.write_state(&mut arena, rest).unwrap();
    state(&mut ex, &mut arena)
}

/// Tensor `t` lives in `plan`'s read-only parameter space.
fn in_image(plan: &Plan, t: TensorId) -> bool {
    plan.storage_at(t, 0)
        .is_some_and(|s| ParamEncoding::of_space(plan.lives[s].space).is_some())
}

/// Every value of `init` (state bytes) that is a narrow weight of `ro`, rounded to fp16: what the
/// fp16 image must read back as (the rest unchanged).
fn rounded_to_f16(ro: &Plan, init: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(init.len());
    let mut at = 0;
    let ids: Vec<TensorId> = ro
        .graph
        .nodes
        .iter()
        .flat_map(|n| {
            n.params
                .iter()
                .map(|p| p.value)
                .chain(n.stats.iter().copied())
        })
        .collect();
    for t in ids {
        let bytes = ro.graph.tensors[t as usize].bytes;
        let narrow = crate::plan::params::weight_rows(&ro.graph, t).is_some() && in_image(ro, t);
        for c in init[at..at + bytes].chunks_exact(4) {
            let v = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            let v = if narrow {
                ::half::f16::from_f32(v).to_f32()
            } else {
                v
            };
            out.extend_from_slice(&v.to_le_bytes());
        }
        at += bytes;
    }
    out
}

#[test]
fn fp16_weights_train_as_their_rounded_values_in_the_arena() {
    for (what, upd) in frozen_configs() {
        let plain = Plan::new(Graph::new(&mbv2_like(&upd), BATCH).unwrap());
        let mut ro = plain.clone();
        ro.read_only_params(ParamEncoding::F16).unwrap();
        assert!(ro.dequant_region().is_some(), "{what}: a conversion region");
        let init = initial_state(&plain);
        let (image, rest) = split_state(&ro, &init).unwrap();
        let image = Aligned::new(&image);
        // The image reads back as exactly the fp16-rounded weights (and everything else as it was).
        let rounded = as_read_from(&ro, image.bytes(), &rest);
        assert!(
            rounded == rounded_to_f16(&ro, &init),
            "{what}: fp16 rounding"
        );
        assert!(rounded != init, "{what}: rounding changed some weight");
        // Training: bit-identical to the plain plan holding the rounded weights in the arena.
        let want = run(&plain, &rounded, &[], 4);
        let got = run(&ro, &rest, image.bytes(), 4);
        assert!(got == want, "{what}: losses, evaluation and final state");
        let spec = mbv2_like(&upd);
        let decoded = decode_plan_unnamed(&encode_plan(&spec, &ro)).unwrap();
        assert_eq!(decoded.params_space(), ro.params_space());
        assert_eq!(decoded.params_fingerprint(), ro.params_fingerprint());
        assert!(
            run(&decoded, &rest, image.bytes(), 4) == want,
            "{what}: decoded"
        );
    }
}

#[test]
fn fp16_rounding_saturates_instead_of_overflowing() {
    use crate::plan::params::f16_bits;
    assert_eq!(f16_bits(1e9), ::half::f16::MAX.to_bits());
    assert_eq!(f16_bits(-1e9), ::half::f16::MIN.to_bits());
    assert_eq!(f16_bits(0.5), ::half::f16::from_f32(0.5).to_bits());
    assert!(::half::f16::from_bits(f16_bits(f32::NAN)).is_nan());
}

/// A plan of `spec` with its read-only parameters in an `enc` image, and that image made from the
/// plain plan's initial state (with the rest of the state).
fn fp16_image(spec: &crate::model::ModelSpec) -> (Plan, Vec<u8>, Vec<u8>) {
    let plain = Plan::new(Graph::new(spec, BATCH).unwrap());
    let mut ro = plain.clone();
    ro.read_only_params(ParamEncoding::F16).unwrap();
    let (image, rest) = split_state(&ro, &initial_state(&plain)).unwrap();
    (ro, image, rest)
}

#[test]
fn a_corrupt_fp16_image_is_a_typed_error_naming_the_node() {
    let (_, upd) = &frozen_configs()[0];
    let spec = mbv2_like(upd);
    let (ro, image, _) = fp16_image(&spec);
    let arena = alloc::vec![0u8; ro.needed_bytes()];
    assert!(
        Executor::with_params(&ro, &arena, CpuBackend::new(), Aligned::new(&image).bytes()).is_ok()
    );
    // The first fp16 weight in the image, and its node.
    let (node, t) = ro
        .graph
        .nodes
        .iter()
        .enumerate()
        .find_map(|(i, n)| {
            let p = n.params.first()?;
            (crate::plan::params::weight_rows(&ro.graph, p.value).is_some()
                && in_image(&ro, p.value))
            .then_some((i, p.value))
        })
        .unwrap();
    let at = crate::plan::params::IMAGE_HEADER + ro.offsets[ro.storage_at(t, 0).unwrap()];
    for bits in [0x7c00u16, 0xfc00, 0x7e00, 0x7c01] {
        let mut bad = image.clone();
        bad[at + 2..at + 4].copy_from_slice(&bits.to_le_bytes());
        let err = Executor::with_params(&ro, &arena, CpuBackend::new(), Aligned::new(&bad).bytes())
            .err()
            .unwrap();
        assert_eq!(
            err,
            ExecError::Params(ParamsError::NonFinite { node }),
            "{bits:#x}"
        );
    }
    // An f32 or int8 image given to the fp16 plan: another encoding.
    let plain = Plan::new(Graph::new(&spec, BATCH).unwrap());
    let mut ro8 = plain.clone();
    ro8.read_only_params(ParamEncoding::Int8).unwrap();
    let (image8, _) = split_state(&ro8, &initial_state(&plain)).unwrap();
    assert_eq!(
        Executor::with_params(
            &ro,
            &arena,
            CpuBackend::new(),
            Aligned::new(&image8).bytes()
        )
        .err()
        .unwrap(),
        ExecError::Params(ParamsError::Mismatch("another encoding"))
    );
}

#[test]
fn corrupted_fp16_images_give_typed_errors_or_run_never_panic() {
    // A deterministic fuzz: random bytes of the header and body overwritten. Creating the executor is
    // Ok or a typed error; a step on an accepted image runs to an Ok or a typed error, never a panic
    // (a corrupt but finite image is just other weights).
    let (_, upd) = &frozen_configs()[0];
    let (ro, image, rest) = fp16_image(&mbv2_like(upd));
    let (x, y) = data(BATCH);
    let mut rng = crate::rng::Rng::new(3);
    let (mut refused, mut ran) = (0, 0);
    for _ in 0..64 {
        let mut bad = image.clone();
        for _ in 0..1 + rng.below(4) {
            // Half the writes in the header, half in the body.
            let i = if rng.below(2) == 0 {
                rng.below(32) as usize
            } else {
                rng.below(bad.len() as u64) as usize
            };
            bad[i] = rng.below(256) as u8;
        }
        let bad = Aligned::new(&bad);
        let mut arena = alloc::vec![0u8; ro.needed_bytes()];
        match Executor::with_params(&ro, &arena, CpuBackend::new(), bad.bytes()) {
            Err(ExecError::Params(_)) => refused += 1,
            Err(e) => panic!("an untyped refusal: {e:?}"),
            Ok(mut ex) => {
                ex.write_state(&mut arena, &rest).unwrap();
                let _ = ex.train_step(&mut arena, &x, Target::Classes(&y));
                ran += 1;
            }
        }
    }
    assert!(refused > 0 && ran > 0, "{refused} refused, {ran} ran");
}

/// A 2-block LoRA GPT's frozen base (embeddings, LayerNorms, the LoRA Linears' base weights and
/// biases, the frozen MLP and head) read from an image in each encoding trains bit-identically to the
/// plain plan holding what the image reads back as.
#[cfg(feature = "seq")]
#[test]
fn a_lora_transformer_trains_from_its_frozen_base_in_an_image() {
    use super::seq_tests::{gpt, tokens};
    let spec = gpt(11, 6, 8, 2, 2, false, true);
    let plain = Plan::new(Graph::new(&spec, BATCH).unwrap());
    let init = initial_state(&plain);
    let (x, y) = tokens(BATCH, 6, 11);
    let run_seq = |plan: &Plan, st: &[u8], image: &[u8]| {
        let mut arena = alloc::vec![0u8; plan.needed_bytes()];
        let mut ex = Executor::with_params(plan, &arena, CpuBackend::new(), image).unwrap();
        ex.init_params(&mut arena, 9).unwrap();
        ex.write_state(&mut arena, st).unwrap();
        let losses: Vec<u32> = (0..3)
            .map(|_| {
                ex.train_step(&mut arena, &x, Target::Classes(&y))
                    .unwrap()
                    .loss
                    .to_bits()
            })
            .collect();
        (losses, state(&mut ex, &mut arena))
    };
    for enc in [ParamEncoding::F32, ParamEncoding::Int8, ParamEncoding::F16] {
        let mut ro = plain.clone();
        let moved = ro.read_only_params(enc).unwrap();
        // Everything but the 8 adapters (and their optimizer state) left the arena.
        assert_eq!(moved, read_only_tensors(&ro.graph).count());
        assert!(ro.arena_bytes < plain.arena_bytes, "{enc:?}");
        let (image, rest) = split_state(&ro, &init).unwrap();
        let image = Aligned::new(&image);
        if enc == ParamEncoding::F32 {
            // Initialised with the plain plan's seed, the arena's tensors (the adapters) start as in
            // the plain plan: the image's tensors' random draws are skipped, not left out.
            let mut arena = alloc::vec![0u8; ro.needed_bytes()];
            let mut ex =
                Executor::with_params(&ro, &arena, CpuBackend::new(), image.bytes()).unwrap();
            ex.init_params(&mut arena, 5).unwrap();
            assert!(state(&mut ex, &mut arena) == init, "initialisation");
        }
        let held = as_read_from(&ro, image.bytes(), &rest);
        assert_eq!(held == init, enc == ParamEncoding::F32, "{enc:?}");
        if enc == ParamEncoding::F16 {
            assert!(held == rounded_to_f16(&ro, &init));
        }
        let want = run_seq(&plain, &held, &[]);
        let got = run_seq(&ro, &rest, image.bytes());
        assert!(got == want, "{enc:?}: losses and final state");
        let first = f32::from_bits(got.0[0]);
        let last = f32::from_bits(got.0[2]);
        assert!(
            last < first,
            "{enc:?}: the adapters learn ({first} → {last})"
        );
    }
}
