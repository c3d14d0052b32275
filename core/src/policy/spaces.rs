//! Moves between memory spaces as a plan transform: activations saved for the backward pass wait in
//! another memory space ([`crate::plan::space`]: an accelerator's buffer; a test's) instead of the host
//! arena.
//!
//! Like swap and fp16 storage, it inserts instructions into the plain schedule: for each chosen
//! activation storage whose value is needed again after the loss, a [`Phase::Move`] right after its last
//! forward use copies it into a new storage in the other space (the host storage ends there), and a
//! second move right before its first backward use copies it back into a fresh host storage. Each move
//! ends one lifetime segment of the storage group and starts the next, so both storages are live at the
//! move, and each is laid out in its own space ([`Plan::place_spaces`]): the host arena shrinks by what
//! left it, the other space's size and lower bound come from its own storages' lifetimes. Compute never
//! touches the moved copy — only the two moves do — so a backend that owns the space needs nothing but
//! [`MoveOps::move_between`](crate::backend::MoveOps::move_between) to run the plan, and the results are
//! bit-identical to the plain plan's (a move copies bytes).
//!
//! Evaluation and prediction run the forward instructions only and never read a moved copy.
use alloc::vec;
use alloc::vec::Vec;

use super::swap::gaps;
use crate::backend::Placement;
use crate::graph::{Graph, TensorId};
use crate::plan::{Eo, Instr, Phase, Plan, Schedule, SpaceId};
use crate::sort::heap_sort_by_key;

/// The plain single-micro-batch plan of `g` with every activation storage kept across the loss for which
/// `pick(tensor, bytes)` says yes moved to space `to` (alignment `align`) after its forward use and back
/// before its backward use. `to = SpaceId::HOST` moves within the arena (a plan any backend runs).
pub fn offload(
    g: &Graph,
    to: SpaceId,
    align: usize,
    mut pick: impl FnMut(TensorId, usize) -> bool,
) -> Plan {
    let mut s = Schedule::new(g);
    let base = s.plan();
    let loss = base
        .program
        .iter()
        .position(|i| i.phase == Phase::Loss)
        .unwrap_or(0) as Eo;
    let mut events: Vec<(usize, Instr)> = Vec::new();
    for gap in gaps(&base, 0) {
        // Only the wait across the loss (one per storage): forward use before it, backward use after.
        if gap.last >= loss || !pick(gap.tensor, gap.bytes) {
            continue;
        }
        let Some(mv) = Instr::move_of(gap.tensor) else {
            continue; // the id does not fit in `Instr::node`
        };
        events.push((gap.at as usize, mv));
        events.push((gap.last as usize + 1, mv));
    }
    // Insert from the back so earlier positions stay valid (moves out come before the loss, moves back
    // after it; two at one position may go in either order).
    heap_sort_by_key(&mut events, |e| core::cmp::Reverse((e.0, e.1.node)));
    for (at, ins) in events {
        s.program.insert(at, ins);
    }
    // A group's first move goes out; the storage it begins lives in `to`.
    let mut out = vec![false; s.program.len()];
    let mut seen: Vec<u16> = Vec::new();
    for (eo, ins) in s.program.iter().enumerate() {
        if ins.phase == Phase::Move && !seen.contains(&ins.node) {
            seen.push(ins.node);
            out[eo] = true;
        }
    }
    let mut p = s.plan();
    p.place_spaces(
        |_, l| {
            if out[l.first as usize] {
                to
            } else {
                SpaceId::HOST
            }
        },
        |_| align,
    );
    p
}

/// `plan` run wholly by one accelerator: every instruction placed on `placement`, every storage in
/// `space` at `align` (a GPU's storage-binding alignment), laid out there with the plan's own lifetimes.
/// The host arena is then empty; the model input and the targets reach the backend per step (through
/// [`Backend::begin_step`](crate::backend::Backend::begin_step) and the loss), outside the space.
pub fn on_device(mut plan: Plan, space: SpaceId, align: usize, placement: Placement) -> Plan {
    for i in &mut plan.program {
        i.placement = placement;
    }
    plan.place_spaces(|_, _| space, |_| align);
    plan
}

/// Moves in one step of `plan` and the bytes they copy.
pub fn move_volume(plan: &Plan) -> (usize, usize) {
    (0..plan.n_eo())
        .filter_map(|eo| plan.move_storages(eo))
        .fold((0, 0), |(n, b), (from, _)| {
            (n + 1, b + plan.lives[from].bytes)
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::tests::random_model;

    #[test]
    fn on_device_moves_every_storage_and_instruction() {
        let spec = random_model(
            &[(0, 2, true), (3, 0, true), (4, 0, true), (7, 0, true)],
            2,
            8,
            1,
        );
        let g = Graph::new(&spec, 4).unwrap();
        let host = Plan::new(g);
        let dev = on_device(host.clone(), SpaceId(1), 256, Placement::Gpu);
        assert_eq!(dev.arena_bytes, 0, "nothing is left in the host arena");
        assert!(dev.program.iter().all(|i| i.placement == Placement::Gpu));
        assert!(dev.lives.iter().all(|l| l.space == SpaceId(1)));
        let sp = dev.spaces.iter().find(|s| s.space == SpaceId(1)).unwrap();
        assert_eq!(sp.align, 256);
        assert!(dev.offsets.iter().all(|o| o % 256 == 0));
        // The same lifetimes laid out at a coarser alignment: at least the host plan's lower bound,
        // at most each storage rounded up to 256 bytes.
        assert!(sp.bytes >= sp.lower_bound && sp.lower_bound >= host.lower_bound);
        let rounded: usize = host.lives.iter().map(|l| l.bytes.div_ceil(256) * 256).sum();
        assert!(sp.bytes <= rounded);
    }
}
