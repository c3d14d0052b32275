//! Plan files and plan tables (Melon §4.4: the plans for a ladder of budgets are computed once and stored
//! beside the model, so a device picks one instead of planning).
//!
//! A plan is fully determined by its model, its micro-batch size, its micro-batch count, its program and
//! whether in-place sharing was on; lifetimes are recomputed on decode (deterministically) and the stored
//! layout (offsets, arena size, strategy name) replaces the computed one after it has been checked.
//!
//! Layouts, all little-endian, each file framed as in [`super::frame`] (magic, version, reserved,
//! payload length, payload, CRC-32 of the payload):
//!
//! ```text
//! plan file   = frame(b"FRGP", 5, model | body)
//! table file  = frame(b"FRGT", 5, model | entries: u32 | { budget: u64 | body } × entries)
//! model       = len: u32 | encode_model(spec) (itself a framed b"FRGM" file of `len` bytes)
//! body        = micro-batch size: u32 | precision: u8 | update_bits: u8 | kernels: u8 | grad_tile: u32
//!             | attention: u8                                                     (version 5)
//!             | micro_batches: u16 | in_place: u8 (0/1)
//!             | instrs: u32 | { node: u16 | phase: u8 | mb: u16 | placement: u8
//!                             | step: u16, only for phases 11 and 12 } × instrs
//!             | storages: u32 | offset: u64 × storages
//!             | arena_bytes: u64
//!             | strategy length: u8 | strategy name bytes
//!             | spaces: u8 | { space id: u8 | align: u32 | bytes: u64 } × spaces      (version 4)
//!             | { space id: u8 } × storages, only when spaces > 0                   (version 4)
//! ```
//!
//! Memory spaces (version 4; earlier files have none): the layouts of the spaces other than the host
//! arena ([`crate::plan::space`]), then each storage's space; its offset is within that space. A space id
//! is never 0 (the host) nor repeated, its alignment a power of two from 64 bytes to 1 MiB; each space's
//! storages are checked against its own size and alignment.
//!
//! Precision (version 2; version-1 files have no such bytes and decode as f32) is coded 0 f32, 1 int8
//! with float master weights, 2 int8 with the integer update, whose `update_bits` (1..=7) follows; the
//! byte after a code other than 2 must be 0. The graph is realised in that precision
//! ([`Graph::with_precision`]), so tensor sizes, scratch and storages are those of an int8 run.
//!
//! Kernels and grad_tile (version 3; earlier files have neither and decode as 0) size the int8 scratch:
//! kernels says which GEMM kernels it serves ([`KernelFamily`]: 0 any kernel, what hosts plan with; 1
//! the portable kernel only, for microcontrollers), grad_tile how many i32 elements a Linear weight
//! gradient accumulates at once ([`GraphOptions::grad_tile`], 0 the whole gradient). An f32 plan must
//! have 0 in both.
//!
//! Attention (version 5; earlier files have none and decode as 0): 0 the attention layers save their
//! probabilities for the backward, 1 they save only their rows' softmax statistics and the backward
//! recomputes the probabilities tile by tile ([`GraphOptions::attn_recompute`]); it changes the saved
//! tensors' sizes and the scratch, so the graph is realised with it. 1 needs a model with an attention
//! layer (so one plan has one encoding); other values are rejected.
//!
//! Phases are coded 0 F, 1 loss, 2 CG, 3 CD, 4 apply, 5 recompute, 6 swap-out, 7 swap-in, 8 pack to
//! fp16, 9 unpack, 10 move between memory spaces; a swap's, pack's or move's `node` is the id of the
//! tensor it moves (an in-arena, non-persistent tensor of the model; a pack's half copy is re-created in
//! program order on decode). A move must have a value to move: a storage of its group that ends where the
//! move begins the next ([`Plan::move_storages`]). Like packs before it, the move phase came without a
//! version bump: no earlier file holds code 10, and an older decoder rejects it as an unknown phase.
//!
//! A recurrent layer (LSTM, GRU) runs as time steps: 11 a forward step, 12 a backward step (through
//! time), each followed by its step (`u16`, below the layer's sequence length). They too came without a
//! version bump: an older file has neither code (and no step bytes), an older decoder rejects them as
//! unknown phases. A recurrent layer has no other forward, recompute or derivative instruction and no
//! other layer has steps; an older file whose recurrent layer runs whole (its plan made before the
//! layer was unrolled) is refused as such, typed, rather than run.
//!
//! Decoding trusts nothing: every enum value, node index and micro-batch index is checked, the storage
//! count must match the storages recomputed from the program, and the stored layout must be aligned, fit
//! its arena, and never give two storages alive at the same execution order overlapping bytes.
use alloc::vec::Vec;

use super::{decode_model, encode_model, FormatError, Reader};
use crate::backend::Placement;
use crate::graph::{Graph, GraphError, GraphOptions, TensorId, TensorKind};
use crate::kernels::int8::KernelFamily;
use crate::model::{Int8Update, LayerKind, ModelSpec, Precision};
use crate::plan::params::{self, ParamEncoding};
use crate::plan::{
    lifetimes, lower_bound, share_groups, strategies, IdVec, Instr, Phase, Plan, SpaceId,
    SpaceLayout, StorageId, TensorLife, ALIGN, LOSS_NODE,
};

/// Magic of an encoded [`Plan`].
pub const PLAN_MAGIC: [u8; 4] = *b"FRGP";
/// Current plan encoding version.
pub const PLAN_VERSION: u16 = 5;
/// Magic of an encoded [`PlanTable`].
pub const TABLE_MAGIC: [u8; 4] = *b"FRGT";
/// Current plan-table encoding version.
pub const TABLE_VERSION: u16 = 5;
/// Most instructions a decoded plan may have.
pub const MAX_INSTRS: usize = 1 << 20;
/// Largest micro-batch size a decoded plan may have.
pub const MAX_BATCH: usize = 1 << 20;
/// Most entries a decoded plan table may have.
pub const MAX_TABLE_ENTRIES: usize = 4096;
/// Strategy name given to a decoded layout whose name is not one of [`strategies`].
pub const STORED_STRATEGY: &str = "stored";

pub use crate::plan::table::{PlanEntry, PlanTable};

fn put_u8(out: &mut Vec<u8>, v: u8) {
    out.push(v);
}
fn put_u16(out: &mut Vec<u8>, v: u16) {
    out.extend_from_slice(&v.to_le_bytes());
}
fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}
fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_model(out: &mut Vec<u8>, spec: &ModelSpec) {
    let m = encode_model(spec);
    put_u32(out, m.len() as u32);
    out.extend_from_slice(&m);
}

fn placement_code(p: Placement) -> u8 {
    match p {
        Placement::Cpu => 0,
        Placement::Gpu => 1,
        Placement::Dsp => 2,
    }
}

/// The two precision bytes of a plan body: the code and the integer update's bit width (else 0).
pub fn precision_code(p: Precision) -> [u8; 2] {
    match p {
        Precision::F32 => [0, 0],
        Precision::Int8(Int8Update::FloatMaster) => [1, 0],
        Precision::Int8(Int8Update::Integer { update_bits }) => [2, update_bits],
    }
}

/// Reads the two precision bytes; `at` is the offset of the first.
fn get_precision(r: &mut Reader<'_>) -> Result<Precision, FormatError> {
    let at = r.at();
    let code = r.u8("precision")?;
    let bits_at = r.at();
    let bits = r.u8("precision.update_bits")?;
    match (code, bits) {
        (0, 0) => Ok(Precision::F32),
        (1, 0) => Ok(Precision::Int8(Int8Update::FloatMaster)),
        (2, 1..=7) => Ok(Precision::Int8(Int8Update::Integer { update_bits: bits })),
        (2, _) => Err(bad(
            "precision.update_bits",
            bits_at,
            "the integer update needs 1 to 7 bits",
        )),
        (0 | 1, _) => Err(bad(
            "precision.update_bits",
            bits_at,
            "must be 0 unless the precision is int8 with the integer update",
        )),
        _ => Err(bad("precision", at, "unknown precision")),
    }
}

/// The kernels byte of a plan body (version 3).
pub fn kernels_code(k: KernelFamily) -> u8 {
    match k {
        KernelFamily::Any => 0,
        KernelFamily::Portable => 1,
    }
}

/// Reads the kernels byte; only int8 plans may size their scratch for a narrower family.
fn get_kernels(r: &mut Reader<'_>, precision: Precision) -> Result<KernelFamily, FormatError> {
    let at = r.at();
    match (r.u8("kernels")?, precision) {
        (0, _) => Ok(KernelFamily::Any),
        (1, Precision::Int8(_)) => Ok(KernelFamily::Portable),
        (1, Precision::F32) => Err(bad(
            "kernels",
            at,
            "must be 0 in an f32 plan (only int8 scratch depends on the kernels)",
        )),
        _ => Err(bad("kernels", at, "unknown kernel family")),
    }
}

fn phase_code(p: Phase) -> u8 {
    match p {
        Phase::Forward => 0,
        Phase::Loss => 1,
        Phase::GradW => 2,
        Phase::GradX => 3,
        Phase::Apply => 4,
        Phase::Recompute => 5,
        Phase::SpillOut => 6,
        Phase::SpillIn => 7,
        Phase::Pack => 8,
        Phase::Unpack => 9,
        Phase::Move => 10,
        Phase::StepFwd => 11,
        Phase::StepBwd => 12,
    }
}

/// Writes the plan body (everything but the model). The in-place flag is 1 when the plan's sharing roots
/// are those of in-place merging (`share_groups(graph, true)`), else 0; plans built with other roots
/// cannot be represented and decode with the roots of `share_groups(graph, false)`.
fn put_body(out: &mut Vec<u8>, plan: &Plan) {
    put_u32(out, u32::try_from(plan.graph.batch).unwrap_or(u32::MAX));
    out.extend_from_slice(&precision_code(plan.graph.precision));
    put_u8(out, kernels_code(plan.graph.kernels));
    put_u32(out, u32::try_from(plan.graph.grad_tile).unwrap_or(u32::MAX));
    put_u8(out, plan.graph.attn_recompute() as u8);
    put_u16(out, plan.micro_batches);
    put_u8(out, (plan.roots == share_groups(&plan.graph, true)) as u8);
    put_u32(out, plan.program.len() as u32);
    for ins in &plan.program {
        put_u16(out, ins.node);
        put_u8(out, phase_code(ins.phase));
        put_u16(out, ins.mb);
        put_u8(out, placement_code(ins.placement));
        if matches!(ins.phase, Phase::StepFwd | Phase::StepBwd) {
            put_u16(out, ins.step);
        }
    }
    put_u32(out, plan.offsets.len() as u32);
    for &o in &plan.offsets {
        put_u64(out, o as u64);
    }
    put_u64(out, plan.arena_bytes as u64);
    let name = plan.strategy.as_bytes();
    let name = &name[..name.len().min(u8::MAX as usize)];
    put_u8(out, name.len() as u8);
    out.extend_from_slice(name);
    put_u8(out, plan.spaces.len().min(u8::MAX as usize) as u8);
    for sp in plan.spaces.iter().take(u8::MAX as usize) {
        put_u8(out, sp.space.0);
        put_u32(out, u32::try_from(sp.align).unwrap_or(u32::MAX));
        put_u64(out, sp.bytes as u64);
    }
    if !plan.spaces.is_empty() {
        for l in &plan.lives {
            put_u8(out, l.space.0);
        }
    }
}

/// Encodes `plan` (made from `spec`) as a `FRGP` file.
pub fn encode_plan(spec: &ModelSpec, plan: &Plan) -> Vec<u8> {
    let mut p = Vec::new();
    put_model(&mut p, spec);
    put_body(&mut p, plan);
    super::frame(PLAN_MAGIC, PLAN_VERSION, &p)
}

/// Encodes a plan table (all made from `spec`) as a `FRGT` file; entries are written in budget order.
pub fn encode_plan_table(spec: &ModelSpec, table: &PlanTable) -> Vec<u8> {
    let mut p = Vec::new();
    put_model(&mut p, spec);
    let mut order: Vec<(usize, &PlanEntry)> = table.entries.iter().enumerate().collect();
    crate::sort::heap_sort_by_key(&mut order, |&(i, e)| (e.budget, i));
    put_u32(&mut p, order.len() as u32);
    for (_, e) in order {
        put_u64(&mut p, e.budget as u64);
        put_body(&mut p, &e.plan);
    }
    super::frame(TABLE_MAGIC, TABLE_VERSION, &p)
}

fn bad(field: &'static str, at: usize, reason: &'static str) -> FormatError {
    FormatError::BadValue { field, at, reason }
}

fn get_model(r: &mut Reader<'_>) -> Result<ModelSpec, FormatError> {
    let len = r.u32("model length")? as usize;
    decode_model(r.bytes(len, "model")?)
}

fn graph_reason(e: &GraphError) -> &'static str {
    match e {
        GraphError::Empty => "the model has no layers",
        GraphError::Layer { .. } => "a layer does not fit its input",
        GraphError::ZeroBatch => "the batch size is zero",
        GraphError::TooLarge { .. } => "a tensor is too large for this machine",
        GraphError::Loss(_) => "the loss does not fit the model",
    }
}

/// A `u64` as a `usize` no larger than `isize::MAX` (the largest object Rust can address).
fn size(v: u64, field: &'static str, at: usize) -> Result<usize, FormatError> {
    usize::try_from(v)
        .ok()
        .filter(|&v| v <= isize::MAX as usize)
        .ok_or(bad(field, at, "larger than this machine's address space"))
}

fn strategy_name(bytes: &[u8]) -> &'static str {
    strategies()
        .iter()
        .map(|s| s.name())
        .find(|n| n.as_bytes() == bytes)
        .unwrap_or(STORED_STRATEGY)
}

/// Checks a stored layout against the recomputed storages: every storage of each space aligned to that
/// space's alignment, inside it, and no two alive together overlapping.
fn check_layout(
    lives: &[TensorLife],
    offsets: &[usize],
    spaces: &[SpaceLayout],
    arena_bytes: usize,
    offsets_at: usize,
) -> Result<(), FormatError> {
    let at_of = |i: usize| offsets_at + 8 * i;
    let limit = |space: SpaceId| -> (usize, usize) {
        if space == SpaceId::HOST {
            (arena_bytes, ALIGN)
        } else {
            spaces
                .iter()
                .find(|s| s.space == space)
                .map_or((0, ALIGN), |s| (s.bytes, s.align))
        }
    };
    let mut ends = Vec::with_capacity(lives.len());
    for (i, (l, &o)) in lives.iter().zip(offsets).enumerate() {
        let (bytes, align) = limit(l.space);
        if o % align != 0 {
            return Err(bad(
                "offsets",
                at_of(i),
                "offset not aligned to its memory space's alignment",
            ));
        }
        match o.checked_add(l.bytes) {
            Some(e) if e <= bytes => ends.push(e),
            _ => {
                return Err(bad(
                    "offsets",
                    at_of(i),
                    "storage extends past the end of its memory space",
                ))
            }
        }
    }
    // Sweep over time: storages sorted by first use; `active` holds those still alive.
    let mut order: Vec<usize> = (0..lives.len()).collect();
    // A heapsort by unique keys: the stable order, in a few words of stack (a Cortex-M0 decodes this).
    crate::sort::heap_sort_by_key(&mut order, |&i| (lives[i].first, i));
    let mut active: Vec<usize> = Vec::new();
    for &i in &order {
        let li = &lives[i];
        active.retain(|&j| lives[j].last >= li.first);
        for &j in &active {
            if lives[i].space == lives[j].space && offsets[i] < ends[j] && offsets[j] < ends[i] {
                return Err(bad(
                    "offsets",
                    at_of(i.max(j)),
                    "storages alive together overlap",
                ));
            }
        }
        active.push(i);
    }
    Ok(())
}

/// Reads the memory spaces of a version-4 body (after the strategy name): the other spaces' layouts and,
/// when there are any, each storage's space.
fn get_spaces(
    r: &mut Reader<'_>,
    lives: &mut IdVec<StorageId, TensorLife>,
) -> Result<Vec<SpaceLayout>, FormatError> {
    let count = r.u8("space count")? as usize;
    let mut spaces: Vec<SpaceLayout> = Vec::with_capacity(count);
    for _ in 0..count {
        let at = r.at();
        let space = SpaceId(r.u8("space id")?);
        let align = r.u32("space alignment")? as usize;
        let bytes = size(r.u64("space bytes")?, "space bytes", at)?;
        if space == SpaceId::HOST || spaces.iter().any(|s| s.space == space) {
            return Err(bad("space id", at, "the host or a repeated space"));
        }
        if !align.is_power_of_two() || !(ALIGN..=1 << 20).contains(&align) {
            return Err(bad(
                "space alignment",
                at + 1,
                "not a power of two from 64 to 1 MiB",
            ));
        }
        spaces.push(SpaceLayout {
            space,
            align,
            bytes,
            lower_bound: 0,
        });
    }
    if count > 0 {
        for l in lives.iter_mut() {
            let at = r.at();
            let space = SpaceId(r.u8("storage space")?);
            if space != SpaceId::HOST && !spaces.iter().any(|s| s.space == space) {
                return Err(bad("storage space", at, "names an undeclared memory space"));
            }
            l.space = space;
        }
    }
    for sp in &mut spaces {
        // As the planner counts it: sizes rounded to the space's alignment.
        let members: Vec<TensorLife> = lives
            .iter()
            .filter(|l| l.space == sp.space)
            .map(|l| TensorLife {
                bytes: l.bytes.div_ceil(sp.align) * sp.align,
                ..l.clone()
            })
            .collect();
        sp.lower_bound = lower_bound(&members);
    }
    Ok(spaces)
}

/// Reads and checks a plan body for `spec`, encoded in `version` (1: no precision bytes, f32; 2: no
/// kernels byte nor grad_tile, scratch for any kernel and whole gradients); the graph has names when
/// `names`.
fn get_body(
    r: &mut Reader<'_>,
    spec: &ModelSpec,
    version: u16,
    names: bool,
) -> Result<Plan, FormatError> {
    let graph = get_graph(r, spec, version, names)?;
    get_program(r, graph, version)
}

/// The head of a plan body (micro-batch size, precision, kernels, grad_tile): the graph of `spec` it
/// realises.
fn get_graph(
    r: &mut Reader<'_>,
    spec: &ModelSpec,
    version: u16,
    names: bool,
) -> Result<Graph, FormatError> {
    let at = r.at();
    let batch = r.u32("micro-batch size")? as usize;
    if batch == 0 || batch > MAX_BATCH {
        return Err(bad("micro-batch size", at, "must be between 1 and 1048576"));
    }
    let precision_at = r.at();
    let precision = if version >= 2 {
        get_precision(r)?
    } else {
        Precision::F32
    };
    if crate::quant::check_supported(precision, spec).is_err() {
        return Err(bad(
            "precision",
            precision_at,
            "the model has a layer or loss that int8 training does not support",
        ));
    }
    let (kernels, grad_tile) = if version >= 3 {
        let kernels = get_kernels(r, precision)?;
        let at = r.at();
        let tile = r.u32("grad_tile")? as usize;
        if tile != 0 && precision == Precision::F32 {
            return Err(bad(
                "grad_tile",
                at,
                "must be 0 in an f32 plan (only int8 gradients accumulate in tiles)",
            ));
        }
        (kernels, tile)
    } else {
        (KernelFamily::Any, 0)
    };
    let attn_recompute = if version >= 5 {
        let at = r.at();
        match r.u8("attention")? {
            0 => false,
            1 if spec
                .layers
                .iter()
                .any(|l| matches!(l.kind, LayerKind::Attention { .. })) =>
            {
                true
            }
            1 => {
                return Err(bad(
                    "attention",
                    at,
                    "must be 0 when the model has no attention layer",
                ))
            }
            _ => return Err(bad("attention", at, "unknown attention mode")),
        }
    } else {
        false
    };
    let options = GraphOptions {
        precision,
        kernels,
        grad_tile,
        names,
        threads: 1,
        attn_recompute,
    };
    Graph::with_options(spec, batch, options).map_err(|e| bad("model", at, graph_reason(&e)))
}

/// The rest of a plan body (micro-batches, program, layout), checked against `graph`.
fn get_program(r: &mut Reader<'_>, mut graph: Graph, version: u16) -> Result<Plan, FormatError> {
    let at = r.at();
    let micro_batches = r.u16("micro_batches")?;
    if micro_batches == 0 {
        return Err(bad("micro_batches", at, "must be at least 1"));
    }
    let at = r.at();
    let in_place = match r.u8("in_place")? {
        0 => false,
        1 => true,
        _ => return Err(bad("in_place", at, "must be 0 or 1")),
    };
    let at = r.at();
    let n = r.u32("instruction count")? as usize;
    if n > MAX_INSTRS {
        return Err(bad(
            "instruction count",
            at,
            "more than 1048576 instructions",
        ));
    }
    let n_nodes = graph.nodes.len();
    let n_model_tensors = graph.tensors.len();
    let mut program = Vec::with_capacity(n.min(4096));
    for _ in 0..n {
        let at = r.at();
        let node = r.u16("instruction node")?;
        let phase_at = r.at();
        let phase = match r.u8("instruction phase")? {
            0 => Phase::Forward,
            1 => Phase::Loss,
            2 => Phase::GradW,
            3 => Phase::GradX,
            4 => Phase::Apply,
            5 => Phase::Recompute,
            6 => Phase::SpillOut,
            7 => Phase::SpillIn,
            8 => Phase::Pack,
            9 => Phase::Unpack,
            10 => Phase::Move,
            11 => Phase::StepFwd,
            12 => Phase::StepBwd,
            _ => return Err(bad("instruction phase", phase_at, "unknown phase")),
        };
        let ok = if phase == Phase::Loss {
            node == LOSS_NODE
        } else if matches!(phase, Phase::SpillOut | Phase::SpillIn | Phase::Move) {
            // Swaps and moves name a tensor: it must exist, be in the arena and not be persistent.
            graph.tensors.get(node as usize).is_some_and(|t| {
                t.bytes > 0 && t.kind != TensorKind::External && !t.kind.persistent()
            })
        } else if phase == Phase::Pack {
            // A pack names an activation of the model; its half copy is added in program order, as the
            // fp16 policy does, so tensor ids match the encoder's.
            (node as usize) < n_model_tensors && graph.add_half(node as TensorId).is_some()
        } else if phase == Phase::Unpack {
            (node as usize) < n_model_tensors && graph.half_of(node as TensorId).is_some()
        } else {
            (node as usize) < n_nodes
        };
        if !ok {
            return Err(bad("instruction node", at, "no such node"));
        }
        // A recurrent layer runs as time steps, and only it has them.
        let bptt = match phase {
            Phase::Forward | Phase::Recompute | Phase::GradX | Phase::StepFwd | Phase::StepBwd => {
                graph.nodes[node as usize].bptt
            }
            _ => None,
        };
        if bptt.is_some() != matches!(phase, Phase::StepFwd | Phase::StepBwd) {
            return Err(bad(
                "instruction phase",
                phase_at,
                "a recurrent layer's forward and derivative run as time steps (phases 11, 12), and only it has them",
            ));
        }
        let mb_at = r.at();
        let mb = r.u16("instruction micro-batch")?;
        if mb >= micro_batches {
            return Err(bad(
                "instruction micro-batch",
                mb_at,
                "not below micro_batches",
            ));
        }
        let pl_at = r.at();
        let placement = match r.u8("instruction placement")? {
            0 => Placement::Cpu,
            1 => Placement::Gpu,
            2 => Placement::Dsp,
            _ => return Err(bad("instruction placement", pl_at, "unknown placement")),
        };
        let step = match bptt {
            Some(b) => {
                let step_at = r.at();
                let step = r.u16("instruction step")?;
                if step >= b.steps {
                    return Err(bad(
                        "instruction step",
                        step_at,
                        "not below the recurrent layer's sequence length",
                    ));
                }
                step
            }
            None => 0,
        };
        program.push(Instr {
            node,
            phase,
            mb,
            placement,
            step,
        });
    }
    let count_at = r.at();
    let count = r.u32("storage count")? as usize;
    let offsets_at = r.at();
    // Never more than the data holds: each offset takes 8 bytes, so a short file fails as truncated.
    let mut offsets = Vec::with_capacity(count.min(4096));
    for i in 0..count {
        let v = r.u64("offsets")?;
        offsets.push(size(v, "offsets", offsets_at + 8 * i)?);
    }
    let at = r.at();
    let arena_bytes = size(r.u64("arena_bytes")?, "arena_bytes", at)?;
    let len = r.u8("strategy length")? as usize;
    let strategy = strategy_name(r.bytes(len, "strategy")?);

    // Recompute the storages; check them before the (quadratic) layout strategies run.
    let roots = share_groups(&graph, in_place);
    let lt = lifetimes(&graph, &program, &roots);
    if lt.lives.len() != count {
        return Err(bad(
            "storage count",
            count_at,
            "does not match the storages of the program",
        ));
    }
    // Every layout keeps each end below the sum of all storages: bound it so no arithmetic can overflow.
    let total = lt
        .lives
        .iter()
        .try_fold(0usize, |s, l| s.checked_add(l.bytes))
        .filter(|&s| s <= isize::MAX as usize);
    if total.is_none() {
        return Err(bad(
            "model",
            count_at,
            "the storages are too large for this machine",
        ));
    }
    let mut lt = lt;
    let spaces = if version >= 4 {
        let at = r.at();
        let mut spaces = get_spaces(r, &mut lt.lives)?;
        // Read-only parameters take their encoded sizes (int8 weights), and only read-only tensors
        // may be there.
        if spaces
            .iter()
            .any(|s| ParamEncoding::of_space(s.space).is_some())
        {
            params::apply_encoding(&graph, &lt.group_of, &lt.segments, &mut lt.lives)
                .map_err(|reason| bad("storage space", at, reason))?;
            for sp in &mut spaces {
                let members: Vec<TensorLife> = lt
                    .lives
                    .iter()
                    .filter(|l| l.space == sp.space)
                    .map(|l| TensorLife {
                        bytes: l.bytes.div_ceil(sp.align) * sp.align,
                        ..l.clone()
                    })
                    .collect();
                sp.lower_bound = lower_bound(&members);
            }
        }
        spaces
    } else {
        Vec::new()
    };
    check_layout(
        lt.lives.as_slice(),
        &offsets,
        &spaces,
        arena_bytes,
        offsets_at,
    )?;
    // The checked storages and the stored layout are the plan: no layout strategy runs on decode (a
    // micro:bit decodes this in a few KiB of heap).
    let mut plan = Plan {
        graph,
        micro_batches,
        program,
        roots,
        // Host-only plans (every plan today, and the microcontroller's) bound the lives as they are:
        // a filtered copy would cost a microcontroller's heap one more lifetime table.
        lower_bound: if spaces.is_empty() {
            lower_bound(lt.lives.as_slice())
        } else {
            lower_bound(
                &lt.lives
                    .iter()
                    .filter(|l| l.space == SpaceId::HOST)
                    .cloned()
                    .collect::<Vec<_>>(),
            )
        },
        lives: lt.lives,
        group_of: lt.group_of,
        segments: lt.segments,
        touches: lt.touches,
        offsets: offsets.into(),
        arena_bytes,
        spaces,
        strategy,
    };
    // The region int8 weights are dequantised into (the top of the arena) holds no storage; it counts
    // in the lower bound, as when it was planned.
    if let Some((at, _)) = plan.dequant_region() {
        plan.lower_bound += plan.arena_bytes - at;
        let top = plan
            .lives
            .iter_enumerated()
            .filter(|(_, l)| l.space == SpaceId::HOST)
            .map(|(s, l)| plan.offsets[s] + l.bytes)
            .max()
            .unwrap_or(0);
        if top > at {
            return Err(bad(
                "arena_bytes",
                count_at,
                "no room above the storages for dequantising int8 weights",
            ));
        }
    }
    // Every move reads a value of its group: the storage that ends where the move begins the next.
    let moves = plan.program.iter().enumerate();
    for (eo, _) in moves.filter(|(_, i)| i.phase == Phase::Move) {
        if plan.move_storages(eo as crate::plan::Eo).is_none() {
            return Err(bad(
                "instruction node",
                count_at,
                "a move of a tensor that holds no value before it",
            ));
        }
    }
    Ok(plan)
}

/// Decodes a `FRGP` file into its model and plan.
pub fn decode_plan(bytes: &[u8]) -> Result<(ModelSpec, Plan), FormatError> {
    let (version, payload) = super::unframe(PLAN_MAGIC, PLAN_VERSION, bytes)?;
    let mut r = Reader::new(payload, 12);
    let spec = get_model(&mut r)?;
    let plan = get_body(&mut r, &spec, version, true)?;
    r.finish()?;
    Ok((spec, plan))
}

/// Decodes a `FRGP` file into its plan alone, checked as by [`decode_plan`], in as little heap as it
/// can: the graph is realised without names ([`GraphOptions::names`] off, so no tensor, node, parameter
/// or storage name is allocated) and the model is dropped once realised, before the lifetimes are
/// recomputed. The plan runs exactly as the named one and encodes to the same bytes; this is what a
/// microcontroller decodes into its boot heap.
pub fn decode_plan_unnamed(bytes: &[u8]) -> Result<Plan, FormatError> {
    let (version, payload) = super::unframe(PLAN_MAGIC, PLAN_VERSION, bytes)?;
    let mut r = Reader::new(payload, 12);
    let spec = get_model(&mut r)?;
    let graph = get_graph(&mut r, &spec, version, false)?;
    drop(spec);
    let plan = get_program(&mut r, graph, version)?;
    r.finish()?;
    Ok(plan)
}

/// Decodes a `FRGT` file into its model and plan table. Entries must be sorted by budget.
pub fn decode_plan_table(bytes: &[u8]) -> Result<(ModelSpec, PlanTable), FormatError> {
    let (version, payload) = super::unframe(TABLE_MAGIC, TABLE_VERSION, bytes)?;
    let mut r = Reader::new(payload, 12);
    let spec = get_model(&mut r)?;
    let at = r.at();
    let n = r.u32("entry count")? as usize;
    if n > MAX_TABLE_ENTRIES {
        return Err(bad("entry count", at, "more than 4096 entries"));
    }
    let mut entries: Vec<PlanEntry> = Vec::with_capacity(n.min(64));
    for _ in 0..n {
        let at = r.at();
        // A budget beyond this machine's address space means "no limit" here.
        let budget = usize::try_from(r.u64("budget")?).unwrap_or(usize::MAX);
        if entries.last().is_some_and(|e| e.budget > budget) {
            return Err(bad("budget", at, "entries not sorted by budget"));
        }
        let plan = get_body(&mut r, &spec, version, true)?;
        entries.push(PlanEntry { budget, plan });
    }
    r.finish()?;
    Ok((spec, PlanTable { entries }))
}

#[cfg(test)]
mod tests {
    use super::super::{frame, unframe};
    use super::*;
    use crate::model::{Dims, LayerKind, LayerSpec, LossKind, OptimizerSpec, Src};
    use crate::plan::PlanShape;
    use alloc::vec;
    use proptest::prelude::*;

    fn spec() -> ModelSpec {
        let layer = |name: &str, kind, input| LayerSpec {
            name: name.into(),
            kind,
            inputs: vec![input],
            trainable: true,
            update: crate::model::Update::All,
        };
        ModelSpec {
            input: Dims::new(1, 8, 8),
            layers: vec![
                layer(
                    "conv",
                    LayerKind::Conv2d {
                        out: 4,
                        kernel: [3, 3],
                        stride: [1, 1],
                        padding: [1, 1],
                        groups: 1,
                        bias: true,
                    },
                    Src::Input,
                ),
                layer("relu", LayerKind::Relu, Src::Layer(0)),
                layer(
                    "pool",
                    LayerKind::MaxPool2d {
                        kernel: [2, 2],
                        stride: [2, 2],
                    },
                    Src::Layer(1),
                ),
                layer("flat", LayerKind::Flatten, Src::Layer(2)),
                layer(
                    "fc",
                    LayerKind::Linear {
                        out: 10,
                        bias: true,
                    },
                    Src::Layer(3),
                ),
            ],
            loss: LossKind::SoftmaxCrossEntropy,
            optimizer: OptimizerSpec::Sgd {
                lr: 0.1,
                momentum: 0.9,
                weight_decay: 0.0,
            },
            seed: 7,
        }
    }

    fn plain() -> Plan {
        Plan::new(Graph::new(&spec(), 4).unwrap())
    }

    fn shaped() -> Plan {
        Plan::shaped(
            Graph::new(&spec(), 4).unwrap(),
            PlanShape {
                micro_batches: 3,
                in_place: true,
            },
        )
    }

    fn assert_same(a: &Plan, b: &Plan) {
        assert_eq!(a.graph.batch, b.graph.batch);
        assert_eq!(a.micro_batches, b.micro_batches);
        assert_eq!(a.program, b.program);
        assert_eq!(a.roots, b.roots);
        assert_eq!(a.lives, b.lives);
        assert_eq!(a.group_of, b.group_of);
        assert_eq!(a.segments, b.segments);
        assert_eq!(a.touches, b.touches);
        assert_eq!(a.offsets, b.offsets);
        assert_eq!(a.arena_bytes, b.arena_bytes);
        assert_eq!(a.lower_bound, b.lower_bound);
        assert_eq!(a.strategy, b.strategy);
    }

    /// The payload offset of the precision code (relative to the payload start).
    fn precision_at(bytes: &[u8]) -> usize {
        let (_, p) = unframe(PLAN_MAGIC, PLAN_VERSION, bytes).unwrap();
        let model_len = u32::from_le_bytes([p[0], p[1], p[2], p[3]]) as usize;
        4 + model_len + 4
    }

    /// The payload offset of instruction 0: precision, update bits, kernels, grad_tile, attention,
    /// micro-batches, in-place and the instruction count come first.
    fn first_instr(bytes: &[u8]) -> usize {
        attention_at(bytes) + 1 + 2 + 1 + 4
    }

    /// The payload offset of the attention byte (after precision, update bits, kernels, grad_tile).
    fn attention_at(bytes: &[u8]) -> usize {
        precision_at(bytes) + 2 + 1 + 4
    }

    fn patched(bytes: &[u8], at: usize, v: u8) -> Vec<u8> {
        let (_, p) = unframe(PLAN_MAGIC, PLAN_VERSION, bytes).unwrap();
        let mut p = p.to_vec();
        p[at] = v;
        frame(PLAN_MAGIC, PLAN_VERSION, &p)
    }

    #[test]
    fn plan_round_trips() {
        let s = spec();
        for plan in [
            plain(),
            shaped(),
            Plan::with_sharing(Graph::new(&s, 2).unwrap(), false),
        ] {
            let (s2, p2) = decode_plan(&encode_plan(&s, &plan)).unwrap();
            assert_eq!(s2, s);
            assert_same(&plan, &p2);
            assert!(!plan.offsets.is_empty());
        }
    }

    /// LSTM and GRU plans (their derivative phase before their gradient phase) round-trip, a
    /// recomputing one included.
    #[cfg(feature = "seq")]
    #[test]
    fn recurrent_plans_round_trip() {
        for gru in [false, true] {
            let s = crate::exec::rnn_tests::rnn_lm(gru, 11, 6, 6, 5, 2);
            let g = Graph::new(&s, 3).unwrap();
            let cost = crate::policy::CostModel::estimate(&g);
            let (Ok(min) | Err(min)) = crate::policy::recompute(&g, 1, 0, &cost);
            for plan in [Plan::new(g.clone()), min] {
                let (s2, p2) = decode_plan(&encode_plan(&s, &plan)).unwrap();
                assert_eq!(s2, s);
                assert_same(&plan, &p2);
            }
        }
    }

    /// A recurrent layer's time steps: a step at or past the sequence length, a step phase on a layer
    /// that has none, and a whole-layer forward or derivative of a recurrent layer (a plan made before
    /// the layer ran per step) are typed errors naming the field.
    #[test]
    fn malformed_recurrent_steps_are_typed_errors() {
        let s = crate::exec::rnn_tests::rnn_lm(false, 11, 6, 6, 5, 1);
        let plan = Plan::new(Graph::new(&s, 2).unwrap());
        let first = plan
            .program
            .iter()
            .position(|i| i.phase == Phase::StepFwd)
            .unwrap();
        let rnn = plan.program[first].node;
        let field = |program: Vec<Instr>| {
            let mut p = plan.clone();
            p.program = program;
            match decode_plan(&encode_plan(&s, &p)) {
                Err(FormatError::BadValue { field, .. }) => field,
                other => panic!("decoded: {:?}", other.map(|_| ())),
            }
        };
        // Step 6 of a 6-step sequence.
        let mut p = plan.program.clone();
        p[first].step = 6;
        assert_eq!(field(p), "instruction step");
        let mut p = plan.program.clone();
        p[first + 5].step = u16::MAX;
        assert_eq!(field(p), "instruction step");
        // A step phase on the head (not recurrent).
        let mut p = plan.program.clone();
        let head = plan
            .program
            .iter()
            .position(|i| i.phase == Phase::Forward && i.node > rnn);
        p[head.unwrap()].phase = Phase::StepFwd;
        assert_eq!(field(p), "instruction phase");
        // The recurrent layer run whole.
        for ph in [Phase::Forward, Phase::Recompute, Phase::GradX] {
            let mut p = plan.program.clone();
            p[first].phase = ph;
            p[first].step = 0;
            assert_eq!(field(p), "instruction phase");
        }
        // The steps round-trip (the last backward step runs first).
        let bytes = encode_plan(&s, &plan);
        let (_, back) = decode_plan(&bytes).unwrap();
        assert_eq!(back.program, plan.program);
        assert!(back
            .program
            .iter()
            .any(|i| i.phase == Phase::StepBwd && i.step == 5));
    }

    #[test]
    fn unknown_strategy_reads_as_stored() {
        let mut plan = plain();
        plan.strategy = "hand-made";
        let (_, p2) = decode_plan(&encode_plan(&spec(), &plan)).unwrap();
        assert_eq!(p2.strategy, STORED_STRATEGY);
    }

    #[test]
    fn table_round_trips_and_picks_by_budget() {
        let s = spec();
        let small = shaped();
        let big = plain();
        let table = PlanTable {
            entries: vec![
                PlanEntry {
                    budget: big.needed_bytes(),
                    plan: big.clone(),
                },
                PlanEntry {
                    budget: small.needed_bytes(),
                    plan: small.clone(),
                },
            ],
        };
        let bytes = encode_plan_table(&s, &table);
        let (s2, t2) = decode_plan_table(&bytes).unwrap();
        assert_eq!(s2, s);
        assert_eq!(t2.entries.len(), 2);
        // Written in budget order.
        let (lo, hi) = if small.needed_bytes() <= big.needed_bytes() {
            (&small, &big)
        } else {
            (&big, &small)
        };
        assert_same(&t2.entries[0].plan, lo);
        assert_same(&t2.entries[1].plan, hi);
        assert_eq!(t2.entries[0].budget, lo.needed_bytes());
        assert!(t2.for_budget(lo.needed_bytes() - 1).is_none());
        assert_eq!(
            t2.for_budget(lo.needed_bytes()).unwrap().budget,
            lo.needed_bytes()
        );
        assert_eq!(t2.for_budget(usize::MAX).unwrap().budget, hi.needed_bytes());
        // A plan file is not a table file.
        assert_eq!(
            decode_plan_table(&encode_plan(&s, &big)).unwrap_err(),
            FormatError::BadMagic
        );
    }

    #[test]
    fn unsorted_table_is_rejected() {
        let s = spec();
        let p = plain();
        let bytes = encode_plan_table(
            &s,
            &PlanTable {
                entries: vec![
                    PlanEntry {
                        budget: 100,
                        plan: p.clone(),
                    },
                    PlanEntry {
                        budget: 200,
                        plan: p,
                    },
                ],
            },
        );
        let (_, payload) = unframe(TABLE_MAGIC, TABLE_VERSION, &bytes).unwrap();
        let mut payload = payload.to_vec();
        let model_len = u32::from_le_bytes(payload[..4].try_into().unwrap()) as usize;
        let first_budget = 4 + model_len + 4;
        payload[first_budget..first_budget + 8].copy_from_slice(&300u64.to_le_bytes());
        let e = decode_plan_table(&frame(TABLE_MAGIC, TABLE_VERSION, &payload)).unwrap_err();
        assert!(
            matches!(
                e,
                FormatError::BadValue {
                    field: "budget",
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn corrupt_byte_is_a_checksum_error() {
        let mut b = encode_plan(&spec(), &plain());
        let i = b.len() - 10;
        b[i] ^= 0x10;
        assert!(matches!(
            decode_plan(&b),
            Err(FormatError::BadChecksum { .. })
        ));
    }

    #[test]
    fn overlapping_live_storages_are_rejected() {
        let mut plan = plain();
        // Two persistent storages (weights) are alive together for the whole step.
        let (i, j) = {
            let id = <StorageId as crate::plan::Id>::from_index;
            let mut pairs = (0..plan.lives.len()).flat_map(|i| (0..i).map(move |j| (id(i), id(j))));
            let l = &plan.lives;
            pairs
                .find(|&(i, j)| l[i].first <= l[j].last && l[j].first <= l[i].last)
                .unwrap()
        };
        plan.offsets[i] = plan.offsets[j];
        let e = decode_plan(&encode_plan(&spec(), &plan)).unwrap_err();
        assert!(
            matches!(
                e,
                FormatError::BadValue {
                    field: "offsets",
                    reason: "storages alive together overlap",
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn bad_layouts_and_values_are_rejected() {
        let s = spec();
        let field = |b: &[u8]| match decode_plan(b) {
            Err(FormatError::BadValue { field, .. }) => field,
            other => panic!("expected BadValue, got {other:?}"),
        };
        // Misaligned offset.
        let mut p = plain();
        p.offsets[StorageId(0)] += 8;
        p.arena_bytes += 64;
        assert_eq!(field(&encode_plan(&s, &p)), "offsets");
        // Arena too small.
        let mut p = plain();
        p.arena_bytes -= ALIGN;
        assert_eq!(field(&encode_plan(&s, &p)), "offsets");
        // Storage count differs.
        let mut p = plain();
        p.offsets.pop();
        assert_eq!(field(&encode_plan(&s, &p)), "storage count");
        // Node out of range; a non-loss at the loss node.
        let mut p = plain();
        p.program[0].node = 99;
        assert_eq!(field(&encode_plan(&s, &p)), "instruction node");
        let mut p = plain();
        p.program[0].node = LOSS_NODE;
        assert_eq!(field(&encode_plan(&s, &p)), "instruction node");
        // Micro-batch index beyond micro_batches.
        let mut p = plain();
        p.program[0].mb = 1;
        assert_eq!(field(&encode_plan(&s, &p)), "instruction micro-batch");
        // Unknown phase and placement bytes.
        let b = encode_plan(&s, &plain());
        let i = first_instr(&b);
        assert_eq!(field(&patched(&b, i + 2, 11)), "instruction phase");
        // A pack naming a node index that is no activation tensor, an unpack without a pack.
        assert_eq!(field(&patched(&b, i + 2, 8)), "instruction node");
        assert_eq!(field(&patched(&b, i + 2, 9)), "instruction node");
        assert_eq!(field(&patched(&b, i + 5, 3)), "instruction placement");
        // Batch 0 and a batch too large.
        let batch_at = precision_at(&b) - 4;
        assert_eq!(field(&patched(&b, batch_at, 0)), "micro-batch size");
        assert_eq!(field(&patched(&b, batch_at + 3, 1)), "micro-batch size");
        // Bad in-place flag.
        assert_eq!(field(&patched(&b, i - 5, 2)), "in_place");
        // A model that cannot be realised (a 9×9 kernel on an 8×8 input).
        let mut bad_spec = s.clone();
        bad_spec.layers[0].kind = LayerKind::Conv2d {
            out: 4,
            kernel: [9, 9],
            stride: [1, 1],
            padding: [0, 0],
            groups: 1,
            bias: true,
        };
        assert_eq!(field(&encode_plan(&bad_spec, &plain())), "model");
    }

    fn int8(update: Int8Update) -> Plan {
        let g = Graph::with_precision(&spec(), 4, Precision::Int8(update)).unwrap();
        Plan::new(g)
    }

    fn portable(update: Int8Update) -> Plan {
        let options = GraphOptions {
            precision: Precision::Int8(update),
            kernels: KernelFamily::Portable,
            ..GraphOptions::default()
        };
        Plan::new(Graph::with_options(&spec(), 4, options).unwrap())
    }

    /// The int8 plan whose Linear weight gradients accumulate `grad_tile` elements at a time.
    fn tiled(update: Int8Update, grad_tile: usize) -> Plan {
        let options = GraphOptions {
            precision: Precision::Int8(update),
            kernels: KernelFamily::Portable,
            grad_tile,
            ..GraphOptions::default()
        };
        Plan::new(Graph::with_options(&spec(), 4, options).unwrap())
    }

    #[test]
    fn int8_plans_round_trip_with_their_precision() {
        let s = spec();
        for update in [
            Int8Update::FloatMaster,
            Int8Update::Integer { update_bits: 1 },
            Int8Update::Integer { update_bits: 7 },
        ] {
            let plan = int8(update);
            let (s2, p2) = decode_plan(&encode_plan(&s, &plan)).unwrap();
            assert_eq!(s2, s);
            assert_eq!(p2.graph.precision, Precision::Int8(update));
            assert_same(&plan, &p2);
            // The decoded graph is the int8 one: its tensors have the int8 sizes, not the f32 ones.
            let sizes = |p: &Plan| p.graph.tensors.iter().map(|t| t.bytes).collect::<Vec<_>>();
            assert_eq!(sizes(&p2), sizes(&plan));
            assert_ne!(sizes(&p2), sizes(&plain()));
        }
        // Tables carry the precision of each entry.
        let t = PlanTable {
            entries: vec![PlanEntry {
                budget: 1 << 20,
                plan: int8(Int8Update::FloatMaster),
            }],
        };
        let (_, t2) = decode_plan_table(&encode_plan_table(&s, &t)).unwrap();
        assert_eq!(
            t2.entries[0].plan.graph.precision,
            Precision::Int8(Int8Update::FloatMaster)
        );
    }

    /// A version-5 payload of a model without attention less its attention byte (0): the payload of
    /// version 4.
    fn strip_attention(p: &[u8]) -> Vec<u8> {
        let model_len = u32::from_le_bytes([p[0], p[1], p[2], p[3]]) as usize;
        let at = 4 + model_len + 4 + 2 + 1 + 4;
        assert_eq!(p[at], 0, "saving-mode attention");
        let mut v = p[..at].to_vec();
        v.extend_from_slice(&p[at + 1..]);
        v
    }

    /// A host-only version-5 payload less its attention byte and its trailing space count (0): the
    /// payload of versions 1 to 3.
    fn strip_spaces(p: &[u8]) -> Vec<u8> {
        assert_eq!(
            p.last(),
            Some(&0),
            "a host-only plan ends with space count 0"
        );
        strip_attention(&p[..p.len() - 1])
    }

    #[test]
    fn version_3_files_decode_as_host_only_plans() {
        for plan in [plain(), int8(Int8Update::FloatMaster)] {
            let b = encode_plan(&spec(), &plan);
            let (_, p) = unframe(PLAN_MAGIC, PLAN_VERSION, &b).unwrap();
            let (_, p3) = decode_plan(&frame(PLAN_MAGIC, 3, &strip_spaces(p))).unwrap();
            assert!(p3.spaces.is_empty());
            assert_same(&plan, &p3);
        }
    }

    #[test]
    fn version_1_files_decode_as_f32() {
        // A version-1 body is a version-4 body without the two precision bytes, the kernels byte,
        // grad_tile and the space count (0: a host-only plan) at its end.
        for plan in [plain(), shaped()] {
            let b = encode_plan(&spec(), &plan);
            let (_, p) = unframe(PLAN_MAGIC, PLAN_VERSION, &b).unwrap();
            let p = strip_spaces(p);
            let at = precision_at(&b);
            assert_eq!(&p[at..at + 7], &[0; 7]);
            let mut v1 = p[..at].to_vec();
            v1.extend_from_slice(&p[at + 7..]);
            let (_, p1) = decode_plan(&frame(PLAN_MAGIC, 1, &v1)).unwrap();
            assert_eq!(p1.graph.precision, Precision::F32);
            assert_same(&plan, &p1);
            // The same bytes claiming a later version are misread and rejected, never accepted as
            // another plan.
            assert!(decode_plan(&frame(PLAN_MAGIC, 2, &v1)).is_err());
            assert!(decode_plan(&frame(PLAN_MAGIC, 3, &v1)).is_err());
        }
        // A version from the future is a typed error naming both versions.
        let b = encode_plan(&spec(), &plain());
        let (_, p) = unframe(PLAN_MAGIC, PLAN_VERSION, &b).unwrap();
        let e = decode_plan(&frame(PLAN_MAGIC, 6, p)).unwrap_err();
        assert_eq!(
            e,
            FormatError::BadVersion {
                found: 6,
                newest: 5
            }
        );
        assert!(e.to_string().contains("versions 1 to 5"), "{e}");
    }

    #[test]
    fn version_2_files_decode_with_scratch_for_any_kernel_and_whole_gradients() {
        // A version-2 body is a version-4 body without the kernels byte, grad_tile and the space count.
        for plan in [plain(), int8(Int8Update::Integer { update_bits: 2 })] {
            let b = encode_plan(&spec(), &plan);
            let (_, p) = unframe(PLAN_MAGIC, PLAN_VERSION, &b).unwrap();
            let p = strip_spaces(p);
            let at = precision_at(&b) + 2;
            assert_eq!(&p[at..at + 5], &[0; 5]);
            let mut v2 = p[..at].to_vec();
            v2.extend_from_slice(&p[at + 5..]);
            let (_, p2) = decode_plan(&frame(PLAN_MAGIC, 2, &v2)).unwrap();
            assert_eq!(p2.graph.kernels, KernelFamily::Any);
            assert_eq!(p2.graph.grad_tile, 0);
            assert_same(&plan, &p2);
            assert!(decode_plan(&frame(PLAN_MAGIC, 3, &v2)).is_err());
        }
    }

    #[test]
    fn portable_int8_plans_round_trip_with_their_smaller_scratch() {
        let s = spec();
        for update in [
            Int8Update::FloatMaster,
            Int8Update::Integer { update_bits: 2 },
        ] {
            let plan = portable(update);
            assert_eq!(plan.graph.kernels, KernelFamily::Portable);
            let (_, p2) = decode_plan(&encode_plan(&s, &plan)).unwrap();
            assert_eq!(p2.graph.kernels, KernelFamily::Portable);
            assert_same(&plan, &p2);
            // Sized for one kernel instead of every one: never larger, and here smaller.
            assert!(plan.arena_bytes < int8(update).arena_bytes);
            // The same bytes claiming scratch for any kernel do not match their layout.
            let b = encode_plan(&s, &plan);
            let at = precision_at(&b) + 2;
            assert!(decode_plan(&patched(&b, at, 0)).is_err());
        }
        // f32 ignores the family: its graph records `Any`.
        let f = Graph::with_options(
            &s,
            4,
            GraphOptions {
                kernels: KernelFamily::Portable,
                ..GraphOptions::default()
            },
        )
        .unwrap();
        assert_eq!(f.kernels, KernelFamily::Any);
    }

    #[test]
    fn bad_kernel_families_are_rejected() {
        let s = spec();
        let field = |b: &[u8]| match decode_plan(b) {
            Err(FormatError::BadValue { field, .. }) => field,
            other => panic!("expected BadValue, got {other:?}"),
        };
        let b = encode_plan(&s, &int8(Int8Update::FloatMaster));
        let at = precision_at(&b) + 2;
        assert_eq!(field(&patched(&b, at, 2)), "kernels");
        assert_eq!(field(&patched(&b, at, 0xff)), "kernels");
        // Only int8 scratch depends on the kernels: an f32 plan claiming the portable family is wrong.
        let f = encode_plan(&s, &plain());
        assert_eq!(field(&patched(&f, at, 1)), "kernels");
        // Nor do f32 gradients accumulate in tiles.
        assert_eq!(field(&patched(&f, at + 1, 1)), "grad_tile");
    }

    /// A small causal transformer (embedding, positions, LayerNorm, qkv, attention, head).
    fn attn_spec() -> ModelSpec {
        let mut n = 0u32;
        let mut layer = |name: &str, kind: LayerKind| {
            let input = match n {
                0 => Src::Input,
                i => Src::Layer(i - 1),
            };
            n += 1;
            LayerSpec {
                name: name.into(),
                kind,
                inputs: vec![input],
                trainable: true,
                update: crate::model::Update::All,
            }
        };
        ModelSpec {
            input: Dims::flat(20),
            layers: vec![
                layer("tok", LayerKind::Embedding { vocab: 11, dim: 8 }),
                layer("pos", LayerKind::PosEmbedding),
                layer("ln", LayerKind::LayerNorm { eps: 1e-5 }),
                layer(
                    "qkv",
                    LayerKind::Linear {
                        out: 24,
                        bias: false,
                    },
                ),
                layer("attn", LayerKind::Attention { heads: 2 }),
                layer(
                    "head",
                    LayerKind::Linear {
                        out: 11,
                        bias: false,
                    },
                ),
            ],
            loss: LossKind::SoftmaxCrossEntropy,
            optimizer: OptimizerSpec::Sgd {
                lr: 0.1,
                momentum: 0.0,
                weight_decay: 0.0,
            },
            seed: 1,
        }
    }

    /// The attention mode round-trips (the recompute mode's smaller saved tensor and scratch are
    /// realised again on decode, named or not); a version-4 file decodes in the saving mode; an
    /// unknown mode, or the recompute mode in a model without attention, is a typed error naming the
    /// byte.
    #[test]
    fn attention_mode_round_trips_and_bad_modes_are_rejected() {
        let s = attn_spec();
        for attn_recompute in [false, true] {
            let o = GraphOptions {
                attn_recompute,
                ..GraphOptions::default()
            };
            let plan = Plan::new(Graph::with_options(&s, 3, o).unwrap());
            assert_eq!(plan.graph.attn_recompute(), attn_recompute);
            let b = encode_plan(&s, &plan);
            assert_eq!(b[12 + attention_at(&b)], attn_recompute as u8);
            let (_, p2) = decode_plan(&b).unwrap();
            assert_eq!(p2.graph.attn_recompute(), attn_recompute);
            assert_same(&plan, &p2);
            let p3 = decode_plan_unnamed(&b).unwrap();
            assert_eq!(encode_plan(&s, &p3), b);
            if !attn_recompute {
                // The same plan as a version-4 file (no attention byte).
                let (_, p) = unframe(PLAN_MAGIC, PLAN_VERSION, &b).unwrap();
                let (_, p4) = decode_plan(&frame(PLAN_MAGIC, 4, &strip_attention(p))).unwrap();
                assert!(!p4.graph.attn_recompute());
                assert_same(&plan, &p4);
            }
        }
        let field = |b: &[u8]| match decode_plan(b) {
            Err(FormatError::BadValue { field, .. }) => field,
            other => panic!("expected BadValue, got {other:?}"),
        };
        let b = encode_plan(&s, &Plan::new(Graph::new(&s, 3).unwrap()));
        let at = attention_at(&b);
        for v in [2, 0xff] {
            assert_eq!(field(&patched(&b, at, v)), "attention");
        }
        // Recompute mode claimed for a model without attention.
        let f = encode_plan(&spec(), &plain());
        assert_eq!(field(&patched(&f, attention_at(&f), 1)), "attention");
        // A table records each entry's mode.
        let o = GraphOptions {
            attn_recompute: true,
            ..GraphOptions::default()
        };
        let t = PlanTable {
            entries: vec![
                PlanEntry {
                    budget: 1 << 10,
                    plan: Plan::new(Graph::with_options(&s, 3, o).unwrap()),
                },
                PlanEntry {
                    budget: 1 << 20,
                    plan: Plan::new(Graph::new(&s, 3).unwrap()),
                },
            ],
        };
        let (_, t2) = decode_plan_table(&encode_plan_table(&s, &t)).unwrap();
        assert!(t2.entries[0].plan.graph.attn_recompute());
        assert!(!t2.entries[1].plan.graph.attn_recompute());
    }

    #[test]
    fn tiled_gradient_plans_round_trip_with_their_smaller_scratch() {
        let s = spec();
        let update = Int8Update::Integer { update_bits: 2 };
        // The model's Linear is 10×64: tiles of 64 and 128 elements hold one and two rows of it.
        for tile in [64, 128, 1 << 20] {
            let plan = tiled(update, tile);
            assert_eq!(plan.graph.grad_tile, tile);
            let (_, p2) = decode_plan(&encode_plan(&s, &plan)).unwrap();
            assert_eq!(p2.graph.grad_tile, tile);
            assert_same(&plan, &p2);
            assert!(plan.arena_bytes <= portable(update).arena_bytes);
        }
        assert!(tiled(update, 64).arena_bytes < portable(update).arena_bytes);
        // The same bytes claiming another tile do not match their layout.
        let b = encode_plan(&s, &tiled(update, 64));
        let at = precision_at(&b) + 3;
        assert!(decode_plan(&patched(&b, at, 0)).is_err());
        // f32 graphs ignore the option.
        let f = Graph::with_options(
            &s,
            4,
            GraphOptions {
                grad_tile: 64,
                ..GraphOptions::default()
            },
        )
        .unwrap();
        assert_eq!(f.grad_tile, 0);
    }

    #[test]
    fn unnamed_plans_are_the_named_plan_without_names() {
        let s = spec();
        for plan in [
            plain(),
            shaped(),
            portable(Int8Update::Integer { update_bits: 2 }),
        ] {
            let b = encode_plan(&s, &plan);
            let (_, named) = decode_plan(&b).unwrap();
            let bare = decode_plan_unnamed(&b).unwrap();
            assert!(named.graph.tensors.iter().all(|t| !t.name.is_empty()));
            assert!(bare.graph.tensors.iter().all(|t| t.name.is_empty()));
            assert!(bare.graph.nodes.iter().all(|n| n.name.is_empty()));
            assert!(bare.graph.params().all(|(_, p)| p.name.is_empty()));
            assert!(bare.lives.iter().all(|l| l.name.is_empty()));
            let mut renamed = bare.clone();
            for (l, n) in renamed.lives.iter_mut().zip(&named.lives) {
                l.name = n.name.clone();
            }
            assert_same(&named, &renamed);
            let sizes = |p: &Plan| {
                p.graph
                    .tensors
                    .iter()
                    .map(|t| (t.kind, t.bytes, t.dtype, t.share))
                    .collect::<Vec<_>>()
            };
            assert_eq!(sizes(&bare), sizes(&named));
            // It encodes to the very same bytes.
            assert_eq!(encode_plan(&s, &bare), b);
        }
    }

    #[test]
    fn bad_precisions_are_rejected() {
        let s = spec();
        let b = encode_plan(&s, &plain());
        let at = precision_at(&b);
        let field = |b: &[u8]| match decode_plan(b) {
            Err(FormatError::BadValue { field, .. }) => field,
            other => panic!("expected BadValue, got {other:?}"),
        };
        assert_eq!(field(&patched(&b, at, 3)), "precision");
        // The integer update without a bit width, or with too many; a bit width where none belongs.
        let int = patched(&b, at, 2);
        assert_eq!(field(&int), "precision.update_bits");
        assert_eq!(field(&patched(&int, at + 1, 8)), "precision.update_bits");
        assert_eq!(field(&patched(&b, at + 1, 3)), "precision.update_bits");
        // A valid int8 code on an f32 plan passes the precision but not the layout: the int8 storages
        // have other sizes than the offsets were made for.
        let f = field(&patched(&int, at + 1, 3));
        assert!(!f.starts_with("precision"), "{f}");
        // A model int8 cannot train (a sigmoid), claimed int8: the precision is named.
        let mut sig = s.clone();
        sig.layers[1].kind = LayerKind::Sigmoid;
        let b = encode_plan(&sig, &Plan::new(Graph::new(&sig, 4).unwrap()));
        assert_eq!(field(&patched(&b, at, 1)), "precision");
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]
        /// Fuzz: arbitrary bytes never panic, with or without a valid header.
        #[test]
        fn decode_never_panics_on_random_bytes(data in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode_plan(&data);
            let _ = decode_plan_table(&data);
            let _ = decode_plan(&frame(PLAN_MAGIC, PLAN_VERSION, &data));
            let _ = decode_plan_table(&frame(TABLE_MAGIC, TABLE_VERSION, &data));
        }

        /// Fuzz: mutations of valid plan and table payloads (re-framed so the checksum passes, and with
        /// the inner model re-framed too when `deep`) never panic.
        #[test]
        fn decode_never_panics_on_mutated_payload(
            muts in proptest::collection::vec((0usize..4096, any::<u8>()), 1..4),
            cut in 0usize..4096,
            deep in any::<bool>(),
            table in any::<bool>(),
            integer in any::<bool>(),
            narrow in any::<bool>(),
            unnamed in any::<bool>(),
        ) {
            let s = spec();
            let (magic, version, bytes) = if integer && !table {
                let update = Int8Update::Integer { update_bits: 3 };
                let plan = match (narrow, unnamed) {
                    (false, _) => int8(update),
                    (true, false) => portable(update),
                    (true, true) => tiled(update, 64),
                };
                (PLAN_MAGIC, PLAN_VERSION, encode_plan(&s, &plan))
            } else if table {
                let t = PlanTable { entries: vec![
                    PlanEntry { budget: 1000, plan: shaped() },
                    PlanEntry { budget: 1 << 30, plan: plain() },
                ] };
                (TABLE_MAGIC, TABLE_VERSION, encode_plan_table(&s, &t))
            } else {
                (PLAN_MAGIC, PLAN_VERSION, encode_plan(&s, &shaped()))
            };
            let (_, payload) = unframe(magic, version, &bytes).unwrap();
            let mut p = payload.to_vec();
            if deep {
                // Mutate the model inside, re-framing it so its own checksum passes.
                let len = u32::from_le_bytes(p[..4].try_into().unwrap()) as usize;
                let (_, mp) = unframe(crate::format::MODEL_MAGIC, 1, &p[4..4 + len]).unwrap();
                let mut mp = mp.to_vec();
                for &(pos, val) in &muts {
                    let i = pos % mp.len();
                    mp[i] = val;
                }
                let m = frame(crate::format::MODEL_MAGIC, 1, &mp);
                let mut q = Vec::new();
                q.extend_from_slice(&(m.len() as u32).to_le_bytes());
                q.extend_from_slice(&m);
                q.extend_from_slice(&p[4 + len..]);
                p = q;
            } else {
                for &(pos, val) in &muts {
                    let i = pos % p.len();
                    p[i] = val;
                }
                if cut % 3 == 0 {
                    p.truncate(p.len() - cut % p.len());
                }
            }
            let framed = frame(magic, version, &p);
            if table {
                let _ = decode_plan_table(&framed);
            } else if unnamed {
                let _ = decode_plan_unnamed(&framed);
            } else {
                let _ = decode_plan(&framed);
            }
        }
    }
}
