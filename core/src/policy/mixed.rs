//! Mixed placement: one plan whose layers run on several devices (some on the CPU, some on a GPU or a
//! DSP), each device computing on storages in its own memory space, with the planned
//! [`Phase::Move`]s between them.
//!
//! [`mixed`] takes a plan (plain, micro-batched or recomputing) and a device per node:
//!
//! - Every instruction of a node — forward, recompute, weight gradient, input derivative and update —
//!   takes the node's placement, so its parameters, gradients, optimizer state and BatchNorm running
//!   statistics are touched by one device only and stay in that device's space for the whole step (and
//!   across steps): a step ends with every persistent storage where it began.
//! - **The loss runs on the CPU** (`Placement::Cpu`, the host arena): the targets are the host's, and a
//!   non-finite loss is then known before any update of any device runs, so the executor's "reject the
//!   step before any update" holds on every device without a GPU-side guard. When the last layer is not
//!   on the CPU, its prediction moves to the host before the loss and dL/d(prediction) moves back after
//!   it. A plan whose loss instruction a caller wants elsewhere is out of scope here (the all-GPU plan,
//!   [`super::spaces::on_device`], keeps its loss on the GPU).
//! - The model input is the host's batch, outside every space ([`Cx::x`](crate::backend::Cx::x) for the
//!   CPU; a device backend uploads it in [`Backend::begin_step`](crate::backend::Backend::begin_step)),
//!   so a first layer anywhere reads it without a move.
//! - Wherever an instruction touches a storage group whose current segment lives in another space than
//!   the instruction's device, a [`Phase::Move`] is inserted right before it: the move ends that segment
//!   and begins the group's next one in the instruction's space ([`crate::plan::lifetimes`]). A move
//!   takes the micro-batch of the instruction it serves (a partial batch skips both) and the placement
//!   of that instruction's device. A segment that begins at a compute instruction (a fresh write) lives
//!   in that instruction's space, so values are produced where they are computed and move only when
//!   read elsewhere — once per crossing, not once per reader.
//! - Then [`Plan::place_spaces`] lays out every space with its own lifetimes and alignment.
//!
//! A move copies bytes, so a mixed plan run by backends whose kernels agree bit for bit trains exactly
//! as the plan it came from (the tests run a second "device" on the CPU's kernels and check it).
//!
//! Refused, with a typed [`MixedError`]: a node list of the wrong length, a device with no space, a plan
//! that already moves, swaps or packs (fp16) values, and a persistent storage that two devices would
//! touch.
use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;
use core::fmt;

use crate::backend::Placement;
use crate::graph::TensorId;
use crate::plan::{lifetimes, touches, Eo, Instr, Phase, Plan, SpaceId, TensorLife, ALIGN};

/// Why a mixed plan cannot be built.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MixedError {
    /// The placement list does not name one device per node.
    Nodes {
        /// Placements given.
        given: usize,
        /// Nodes of the graph.
        nodes: usize,
    },
    /// `space_of_device` names no memory space for a device a node is placed on (or names the host
    /// arena, which is the CPU's).
    NoSpace(Placement),
    /// The plan already has an instruction the transform does not place: a swap, an fp16 pack/unpack
    /// or a move (`eo` is its execution order).
    Unsupported {
        /// Execution order.
        eo: usize,
        /// Its phase.
        phase: Phase,
    },
    /// A persistent storage (a parameter, its gradient or state, a running statistic) would be touched
    /// by two devices: its tensors are shared across nodes placed apart.
    SplitPersistent(String),
    /// A tensor id does not fit in a move instruction (16 bits).
    TooManyTensors(TensorId),
}

impl fmt::Display for MixedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MixedError::Nodes { given, nodes } => write!(
                f,
                "mixed placement: {given} placements for a graph of {nodes} nodes"
            ),
            MixedError::NoSpace(p) => {
                write!(f, "mixed placement: no memory space for device {p:?}")
            }
            MixedError::Unsupported { eo, phase } => write!(
                f,
                "mixed placement: instruction {eo} ({}) is a swap, fp16 conversion or move, which a \
                 mixed plan does not place",
                phase.short()
            ),
            MixedError::SplitPersistent(name) => write!(
                f,
                "mixed placement: persistent storage '{name}' would be touched by two devices"
            ),
            MixedError::TooManyTensors(t) => {
                write!(f, "mixed placement: tensor {t} does not fit in a move")
            }
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for MixedError {}

/// The placement the loss instruction gets in a mixed plan (see the [module](self) docs).
pub const LOSS_PLACEMENT: Placement = Placement::Cpu;

/// `plan` with node `i` on `device_of_node[i]`, the loss on the CPU, and a [`Phase::Move`] before every
/// instruction that reads a value held in another device's space (see the [module](self) docs).
/// `space_of_device(d)` names device `d`'s memory space and its alignment; the CPU's is the host arena
/// (it is not asked).
pub fn mixed(
    plan: Plan,
    device_of_node: &[Placement],
    space_of_device: impl Fn(Placement) -> Option<(SpaceId, usize)>,
) -> Result<Plan, MixedError> {
    let g = plan.graph;
    if device_of_node.len() != g.nodes.len() {
        return Err(MixedError::Nodes {
            given: device_of_node.len(),
            nodes: g.nodes.len(),
        });
    }
    let space = |d: Placement| -> Result<(SpaceId, usize), MixedError> {
        if d == Placement::Cpu {
            return Ok((SpaceId::HOST, ALIGN));
        }
        match space_of_device(d) {
            Some((s, a)) if s != SpaceId::HOST => Ok((s, a)),
            _ => Err(MixedError::NoSpace(d)),
        }
    };
    let mut aligns: Vec<(SpaceId, usize)> = Vec::new();
    for &d in device_of_node {
        let (s, a) = space(d)?;
        if !aligns.iter().any(|x| x.0 == s) {
            aligns.push((s, a));
        }
    }
    // Every instruction with its device; `at[eo]`: the space an instruction computes in (a move: the
    // space it writes).
    let mut program = plan.program;
    let mut at: Vec<SpaceId> = Vec::with_capacity(program.len());
    for (eo, ins) in program.iter_mut().enumerate() {
        ins.placement = match ins.phase {
            Phase::Loss => LOSS_PLACEMENT,
            Phase::Forward | Phase::Recompute | Phase::GradW | Phase::GradX | Phase::Apply => {
                device_of_node
                    .get(ins.node as usize)
                    .copied()
                    .unwrap_or(Placement::Cpu)
            }
            phase => return Err(MixedError::Unsupported { eo, phase }),
        };
        at.push(space(ins.placement)?.0);
    }
    let roots = plan.roots;
    let mut buf = Vec::new();
    // Insert moves until every compute instruction finds each value it touches in its own space. A
    // pass inserts at most one move per group (its first misplaced reader): a later reader may find
    // the moved copy already in its space.
    loop {
        let lt = lifetimes(&g, &program, &roots);
        let spaces = storage_spaces(&program, &at, &lt.lives, &lt.touches)?;
        let mut inserts: Vec<(usize, TensorId)> = Vec::new();
        let mut done_groups: Vec<u32> = Vec::new();
        for (eo, ins) in program.iter().enumerate() {
            if ins.phase == Phase::Move {
                continue;
            }
            touches(&g, ins, &mut buf);
            for &t in &buf {
                let Some(gid) = lt.group_of.get(t as usize).copied().flatten() else {
                    continue; // the model input: the host's batch, outside every space
                };
                if done_groups.contains(&gid) {
                    continue;
                }
                let segs = &lt.segments[gid as usize];
                let k = segs.partition_point(|&(start, _)| start <= eo as Eo);
                let s = segs[k.saturating_sub(1)].1 as usize;
                if spaces[s] == at[eo] {
                    continue;
                }
                // The storage began before `eo` (one beginning here is in this instruction's space),
                // elsewhere: move it here. Persistent storages never disagree (storage_spaces).
                done_groups.push(gid);
                inserts.push((eo, t));
            }
        }
        if inserts.is_empty() {
            break;
        }
        for &(eo, t) in inserts.iter().rev() {
            let mut mv = Instr::move_of(t).ok_or(MixedError::TooManyTensors(t))?;
            mv.mb = program[eo].mb;
            mv.placement = program[eo].placement;
            program.insert(eo, mv);
            at.insert(eo, at[eo]);
        }
    }
    let mut p = Plan::from_program(g, plan.micro_batches, program, roots);
    let spaces = storage_spaces(&p.program, &at, &p.lives, &p.touches)?;
    p.place_spaces(
        |s, _| spaces[s as usize],
        |sp| aligns.iter().find(|x| x.0 == sp).map_or(ALIGN, |x| x.1),
    );
    Ok(p)
}

/// The space of every storage: a persistent one's is its touching instructions' (which must agree),
/// any other's is the space of the instruction that begins it.
fn storage_spaces(
    program: &[Instr],
    at: &[SpaceId],
    lives: &[TensorLife],
    touched: &[Vec<Eo>],
) -> Result<Vec<SpaceId>, MixedError> {
    let mut out = vec![SpaceId::HOST; lives.len()];
    for (s, l) in lives.iter().enumerate() {
        if l.kind.persistent() {
            let mut sp: Option<SpaceId> = None;
            for &eo in &touched[s] {
                if program[eo as usize].phase == Phase::Move {
                    continue;
                }
                let here = at[eo as usize];
                if sp.is_some_and(|x| x != here) {
                    return Err(MixedError::SplitPersistent(l.name.clone()));
                }
                sp = Some(here);
            }
            out[s] = sp.unwrap_or(SpaceId::HOST);
        } else {
            out[s] = at.get(l.first as usize).copied().unwrap_or(SpaceId::HOST);
        }
    }
    Ok(out)
}

/// One device per node of `plan` (its forward instruction's placement; the CPU for a node without
/// one) — what [`mixed`] was given, read back from a plan.
pub fn node_devices(plan: &Plan) -> Vec<Placement> {
    let mut out = vec![Placement::Cpu; plan.graph.nodes.len()];
    for ins in &plan.program {
        if ins.phase == Phase::Forward {
            if let Some(d) = out.get_mut(ins.node as usize) {
                *d = ins.placement;
            }
        }
    }
    out
}

/// `plan` with every storage in the host arena: the host storages where they are, the storages of
/// `space` after them (at the returned offset, a multiple of that space's alignment). Initialising
/// the parameters of a mixed plan through this view gives every tensor the values the all-CPU plan
/// gets for the same seed (the initialiser walks nodes in order); a backend then copies the part from
/// the returned offset on into its space.
pub fn host_view(plan: &Plan, space: SpaceId) -> (Plan, usize) {
    let align = plan
        .spaces
        .iter()
        .find(|s| s.space == space)
        .map_or(ALIGN, |s| s.align);
    let base = plan.arena_bytes.div_ceil(align) * align;
    let mut v = plan.clone();
    for (s, l) in v.lives.iter_mut().enumerate() {
        if l.space == space {
            v.offsets[s] += base;
            l.space = SpaceId::HOST;
        }
    }
    v.arena_bytes = base + plan.space_bytes(space);
    v.spaces.retain(|s| s.space != space);
    (v, base)
}
