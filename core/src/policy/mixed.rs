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
use crate::plan::{
    lifetimes, touches, Eo, GroupId, IdVec, Instr, Phase, Plan, SpaceId, StorageId, TensorLife,
    ALIGN,
};

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
            Phase::Forward
            | Phase::Recompute
            | Phase::GradW
            | Phase::GradX
            | Phase::Apply
            | Phase::StepFwd
            | Phase::StepBwd => device_of_node
                .get(ins.node as usize)
                .copied()
                .unwrap_or(Placement::Cpu),
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
        let mut done_groups: Vec<GroupId> = Vec::new();
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
                let segs = &lt.segments[gid];
                let k = segs.partition_point(|&(start, _)| start <= eo as Eo);
                let s = segs[k.saturating_sub(1)].1;
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
        |s, _| spaces[s],
        |sp| aligns.iter().find(|x| x.0 == sp).map_or(ALIGN, |x| x.1),
    );
    Ok(p)
}

/// The space of every storage: a persistent one's is its touching instructions' (which must agree),
/// any other's is the space of the instruction that begins it.
fn storage_spaces(
    program: &[Instr],
    at: &[SpaceId],
    lives: &IdVec<StorageId, TensorLife>,
    touched: &IdVec<StorageId, Vec<Eo>>,
) -> Result<IdVec<StorageId, SpaceId>, MixedError> {
    let mut out: IdVec<StorageId, SpaceId> = vec![SpaceId::HOST; lives.len()].into();
    for (s, l) in lives.iter_enumerated() {
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
        if matches!(ins.phase, Phase::Forward | Phase::StepFwd) {
            if let Some(d) = out.get_mut(ins.node as usize) {
                *d = ins.placement;
            }
        }
    }
    out
}

/// `plan` as the kernels of the device owning `space` see it: that space is the arena (its storages at
/// their offsets there), every other storage is in `elsewhere` (a space nobody serves: out of reach, so
/// an instruction that touched one fails instead of reading the wrong bytes). A device backend that
/// computes with the CPU's kernels on its own memory runs its instructions through this view.
pub fn device_view(plan: &Plan, space: SpaceId, elsewhere: SpaceId) -> Plan {
    let mut v = plan.clone();
    for l in &mut v.lives {
        l.space = if l.space == space {
            SpaceId::HOST
        } else {
            elsewhere
        };
    }
    v.arena_bytes = plan.space_bytes(space);
    v.spaces.clear();
    v
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
    for (l, o) in v.lives.iter_mut().zip(v.offsets.iter_mut()) {
        if l.space == space {
            *o += base;
            l.space = SpaceId::HOST;
        }
    }
    v.arena_bytes = base + plan.space_bytes(space);
    v.spaces.retain(|s| s.space != space);
    (v, base)
}

/// Time to move bytes between the host and a device, each way: `latency + bytes / bandwidth`
/// (seconds; bytes per second), as a host measured it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Link {
    /// Host to device: fixed cost per move.
    pub up_latency: f64,
    /// Host to device: bytes per second.
    pub up_bandwidth: f64,
    /// Device to host: fixed cost per move.
    pub down_latency: f64,
    /// Device to host: bytes per second.
    pub down_bandwidth: f64,
}

impl Link {
    /// Seconds to move `bytes` host to device (`up`) or back.
    pub fn time(&self, up: bool, bytes: usize) -> f64 {
        let (l, b) = if up {
            (self.up_latency, self.up_bandwidth)
        } else {
            (self.down_latency, self.down_bandwidth)
        };
        l + bytes as f64 / b.max(f64::MIN_POSITIVE)
    }
}

/// Devices of [`place_by_cost`]'s problem, in its order.
pub const COST_DEVICES: [Placement; 2] = [Placement::Cpu, Placement::Gpu];

/// The placement problem ([`super::placement::Problem`]) of `plan`'s nodes in execution order on
/// [`COST_DEVICES`]: `node_cost[i]` is node `i`'s measured time (all its instructions of one step) on
/// the CPU and on the device (infinite: it cannot run there); returns `(cost, transfer)` slices.
///
/// What crosses boundary `b` (between nodes `b - 1` and `b`) is every activation made by a node
/// before it and read by a node at or after it; the last boundary carries the prediction to the loss,
/// which runs on the CPU (`end` is the CPU). Where the devices on either side differ, each such value
/// is charged a move forward and (when the reader needs its gradient) one back for its gradient, at
/// `link`'s cost, once per micro-batch. The model input comes from the host to either device at no
/// charge (boundary 0 is free).
///
/// Skip connections: a value read far from where it is made (a residual's skip) is charged at *every*
/// boundary it spans where the two neighbours differ — as if it travelled along the chain. That is
/// exact when the chain changes device once over its span and an over-charge otherwise (the plan moves
/// it at most once per reading device), so the DP leans towards keeping a residual block on one
/// device. A value also read by its producer's own backward after it moved (an activation's
/// derivative reads its output) may move back once more in the plan; that is not charged.
pub fn cost_problem(plan: &Plan, node_cost: &[[f64; 2]], link: &Link) -> (Vec<f64>, Vec<f64>) {
    let g = &plan.graph;
    let n = g.nodes.len();
    let mbs = plan.micro_batches.max(1) as f64;
    let cost: Vec<f64> = (0..n)
        .flat_map(|i| node_cost.get(i).copied().unwrap_or([f64::INFINITY; 2]))
        .collect();
    let mut producer = vec![usize::MAX; g.tensors.len()];
    for (j, node) in g.nodes.iter().enumerate() {
        producer[node.out as usize] = j;
    }
    // Per boundary: bytes and moves forward (values), bytes and moves backward (their gradients).
    let mut cross = vec![[0.0f64; 4]; n + 1];
    let mut charge = |from: usize, to: usize, bytes: usize, grad: bool| {
        for c in cross.iter_mut().take(to + 1).skip(from + 1) {
            c[0] += mbs * bytes as f64;
            c[2] += mbs;
            if grad {
                c[1] += mbs * bytes as f64;
                c[3] += mbs;
            }
        }
    };
    let mut seen: Vec<(usize, usize)> = Vec::new();
    for (k, node) in g.nodes.iter().enumerate() {
        for (i, &t) in node.inputs.iter().enumerate() {
            let j = producer.get(t as usize).copied().unwrap_or(usize::MAX);
            if j == usize::MAX || j >= k || seen.contains(&(t as usize, k)) {
                continue; // the model input, or a tensor read twice by one node
            }
            seen.push((t as usize, k));
            let grad = node.d_in.get(i).is_some_and(|d| d.is_some());
            charge(j, k, g.tensors[t as usize].bytes, grad);
        }
    }
    if let Some(last) = n.checked_sub(1) {
        let pred = g.pred();
        let grad = g.nodes[last].d_out.is_some();
        charge(last, n, g.tensors[pred as usize].bytes, grad);
    }
    let d = COST_DEVICES.len();
    let mut transfer = vec![0.0; (n + 1) * d * d];
    let secs = |bytes: f64, moves: f64, up: bool| {
        let (l, bw) = if up {
            (link.up_latency, link.up_bandwidth)
        } else {
            (link.down_latency, link.down_bandwidth)
        };
        moves * l + bytes / bw.max(f64::MIN_POSITIVE)
    };
    for (b, &[fwd, bwd, nf, nb]) in cross.iter().enumerate().skip(1) {
        let at = |from: usize, to: usize| (b * d + from) * d + to;
        // CPU before the boundary, device after: values go up, gradients come down; and back.
        transfer[at(0, 1)] = secs(fwd, nf, true) + secs(bwd, nb, false);
        transfer[at(1, 0)] = secs(fwd, nf, false) + secs(bwd, nb, true);
    }
    (cost, transfer)
}

/// The placement of least total time for `plan`'s nodes (see [`cost_problem`]) by
/// [`super::placement::place`], with its total in seconds.
pub fn place_by_cost(
    plan: &Plan,
    node_cost: &[[f64; 2]],
    link: &Link,
) -> Result<(f64, Vec<Placement>), super::placement::PlaceError> {
    let (cost, transfer) = cost_problem(plan, node_cost, link);
    let p = super::placement::Problem {
        devices: COST_DEVICES.len(),
        cost: &cost,
        transfer: &transfer,
        start: 0,
        end: 0,
    };
    let (t, at) = super::placement::place(&p)?;
    Ok((t, at.into_iter().map(|d| COST_DEVICES[d]).collect()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::Graph;
    use crate::plan::tests::random_model;
    use proptest::prelude::*;

    const LINK: Link = Link {
        up_latency: 1e-4,
        up_bandwidth: 1e9,
        down_latency: 2e-4,
        down_bandwidth: 5e8,
    };

    /// The total time of `devices` computed edge by edge (the definition [`cost_problem`] encodes): node
    /// costs, and for every value made by node j and read by node k (the loss: k = n, on the CPU), its
    /// move and its gradient's at every boundary between them whose neighbours differ.
    fn total_by_edges(plan: &Plan, cost: &[[f64; 2]], link: &Link, devices: &[usize]) -> f64 {
        let g = &plan.graph;
        let n = g.nodes.len();
        let mbs = plan.micro_batches as f64;
        let at = |i: usize| if i == n { 0 } else { devices[i] };
        let mut t: f64 = (0..n).map(|i| cost[i][devices[i]]).sum();
        let mut edge = |j: usize, k: usize, bytes: usize, grad: bool| {
            for b in j + 1..=k {
                let (a, d) = (at(b - 1), at(b));
                if a != d {
                    let up = a == 0;
                    t += mbs * link.time(up, bytes);
                    if grad {
                        t += mbs * link.time(!up, bytes);
                    }
                }
            }
        };
        let mut seen = Vec::new();
        for (k, node) in g.nodes.iter().enumerate() {
            for (i, &x) in node.inputs.iter().enumerate() {
                if let Some(j) = g.nodes.iter().position(|m| m.out == x) {
                    if j < k && !seen.contains(&(x, k)) {
                        seen.push((x, k));
                        edge(j, k, g.tensors[x as usize].bytes, node.d_in[i].is_some());
                    }
                }
            }
        }
        edge(
            n - 1,
            n,
            g.tensors[g.pred() as usize].bytes,
            g.nodes[n - 1].d_out.is_some(),
        );
        t
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

        /// On random models (residual adds among them) with random node costs, the DP's placement is
        /// one of least total by the edge-wise definition, over every placement of up to 10 nodes.
        #[test]
        fn the_costed_placement_is_optimal_against_brute_force(
            choices in proptest::collection::vec((any::<u8>(), any::<u8>(), any::<bool>()), 1..8),
            c0 in 1u32..3, hw in 2u32..6, micro in 1u16..3,
            costs in proptest::collection::vec((0u32..100, 0u32..100), 12),
        ) {
            let spec = random_model(&choices, c0, hw, 0);
            let g = match Graph::new(&spec, 2) { Ok(g) => g, Err(_) => return Ok(()) };
            let n = g.nodes.len();
            prop_assume!(n <= 10);
            let plan = Plan::shaped(g, crate::plan::PlanShape { micro_batches: micro, in_place: true });
            let cost: Vec<[f64; 2]> =
                (0..n).map(|i| [costs[i].0 as f64 * 1e-5, costs[i].1 as f64 * 1e-5]).collect();
            let (t, devices) = place_by_cost(&plan, &cost, &LINK).unwrap();
            let idx: Vec<usize> = devices.iter().map(|&d| usize::from(d == Placement::Gpu)).collect();
            let mine = total_by_edges(&plan, &cost, &LINK, &idx);
            prop_assert!((mine - t).abs() <= 1e-9 * t.max(1e-12), "dp {t}, by edges {mine}");
            let mut best = f64::INFINITY;
            for m in 0..1usize << n {
                let p: Vec<usize> = (0..n).map(|i| (m >> i) & 1).collect();
                best = best.min(total_by_edges(&plan, &cost, &LINK, &p));
            }
            prop_assert!(t <= best * (1.0 + 1e-9) + 1e-15, "dp {t}, best {best}");
        }
    }

    #[test]
    fn tiny_layers_stay_on_the_cpu_and_big_ones_go_when_moving_is_cheap() {
        let spec = random_model(&[(0, 2, true), (3, 0, true), (0, 2, true)], 2, 6, 0);
        let plan = Plan::new(Graph::new(&spec, 4).unwrap());
        let n = plan.graph.nodes.len();
        // Every node a little faster on the device, moves dear: all stay on the CPU.
        let slight = vec![[1e-4, 0.9e-4]; n];
        let dear = Link {
            up_latency: 1e-2,
            up_bandwidth: 1e6,
            down_latency: 1e-2,
            down_bandwidth: 1e6,
        };
        let (_, d) = place_by_cost(&plan, &slight, &dear).unwrap();
        assert_eq!(d, vec![Placement::Cpu; n]);
        // Free moves: each node where it is faster.
        let free = Link {
            up_latency: 0.0,
            up_bandwidth: f64::INFINITY,
            down_latency: 0.0,
            down_bandwidth: f64::INFINITY,
        };
        let mixed_costs: Vec<[f64; 2]> = (0..n)
            .map(|i| if i % 2 == 0 { [1.0, 2.0] } else { [2.0, 1.0] })
            .collect();
        let (t, d) = place_by_cost(&plan, &mixed_costs, &free).unwrap();
        assert_eq!(t, n as f64);
        for (i, &p) in d.iter().enumerate() {
            assert_eq!(p == Placement::Gpu, i % 2 == 1);
        }
        // A node the device cannot run stays on the CPU.
        let mut cannot = vec![[1.0, 0.1]; n];
        cannot[1][1] = f64::INFINITY;
        let (_, d) = place_by_cost(&plan, &cannot, &free).unwrap();
        assert_eq!(d[1], Placement::Cpu);
    }
}
