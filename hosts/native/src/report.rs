//! Human-readable views of a plan: the tensor table `frugal plan` prints and the arena picture.
use std::fmt::Write as _;

use frugal_core::plan::Plan;

use crate::svg::{human_bytes, ArenaRect};

/// One line per tensor of a training step: kind, bytes, first/last execution order, arena offset, and the
/// storage it shares (in-place and view tensors share their target's bytes).
pub fn tensor_table(plan: &Plan) -> String {
    let g = &plan.graph;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<34} {:<10} {:>12} {:>5} {:>5} {:>12}  shares",
        "tensor", "kind", "bytes", "first", "last", "offset"
    );
    for (t, sid) in plan.placed() {
        let info = &g.tensors[t as usize];
        let life = &plan.lives[sid];
        let shares = if life.name != info.name {
            life.name.as_str()
        } else {
            ""
        };
        let _ = writeln!(
            s,
            "{:<34} {:<10} {:>12} {:>5} {:>5} {:>12}  {}",
            info.name,
            info.kind.name(),
            info.bytes,
            life.first,
            life.last,
            plan.offsets[sid],
            shares
        );
    }
    for info in g.tensors.iter().filter(|i| i.kind.name() == "external") {
        let _ = writeln!(
            s,
            "{:<34} {:<10} {:>12} {:>5} {:>5} {:>12}  held by the host",
            info.name, "external", "-", "-", "-", "-"
        );
    }
    s
}

/// The program, one instruction per execution order.
pub fn program_listing(plan: &Plan) -> String {
    let mut s = String::new();
    for (eo, ins) in plan.program.iter().enumerate() {
        let name = plan
            .graph
            .nodes
            .get(ins.node as usize)
            .map_or("loss", |n| n.name.as_str());
        let _ = write!(s, "{eo}:{}({name}) ", ins.phase.short());
    }
    s
}

/// Summary line: arena, lower bound, ratio, strategy, budget.
pub fn summary(plan: &Plan, budget: Option<usize>) -> String {
    let ratio = plan.arena_bytes as f64 / plan.lower_bound.max(1) as f64;
    let b = budget.map_or_else(|| "unlimited".to_string(), human_bytes);
    format!(
        "plan: batch {}, arena {} ({} B), lower bound {} ({} B), ratio {ratio:.3}, layout {}, {} instructions, budget {b}",
        plan.graph.batch,
        human_bytes(plan.arena_bytes),
        plan.arena_bytes,
        human_bytes(plan.lower_bound),
        plan.lower_bound,
        plan.strategy,
        plan.program.len()
    )
}

/// One rectangle per storage for [`crate::svg::arena_svg`].
pub fn arena_rects(plan: &Plan) -> Vec<ArenaRect> {
    plan.lives
        .iter_enumerated()
        .map(|(i, l)| {
            let merged: Vec<&str> = plan
                .placed()
                .filter(|&(_, s)| s == i)
                .map(|(t, _)| plan.graph.tensors[t as usize].name.as_str())
                .filter(|n| *n != l.name)
                .collect();
            let name = if merged.is_empty() {
                l.name.clone()
            } else {
                format!("{} (+ {})", l.name, merged.join(", "))
            };
            ArenaRect {
                name,
                kind: l.kind.name(),
                first_eo: l.first,
                last_eo: l.last,
                offset: plan.offsets[i],
                bytes: l.bytes,
            }
        })
        .collect()
}

/// The memory timeline of one step of `plan`: bytes in use at each instruction (every storage live there),
/// recomputations and swaps marked, the budget as a line.
pub fn timeline_panel(
    plan: &Plan,
    budget: Option<usize>,
    title: String,
) -> crate::svg::TimelinePanel {
    use crate::svg::{Mark, TimelinePoint};
    use frugal_core::plan::Phase;
    let profile = frugal_core::policy::live_profile(plan);
    let points = plan
        .program
        .iter()
        .enumerate()
        .map(|(eo, ins)| {
            let name = plan
                .graph
                .nodes
                .get(ins.node as usize)
                .map_or("loss", |n| n.name.as_str());
            let mark = match ins.phase {
                Phase::Recompute => Mark::Recompute,
                _ => Mark::Normal,
            };
            TimelinePoint {
                eo: eo as u32,
                bytes: profile[eo],
                label: format!("{}({name}) mb{}", ins.phase.short(), ins.mb),
                mark,
            }
        })
        .collect();
    crate::svg::TimelinePanel {
        title,
        points,
        budgets: budget.map(|b| vec![(0, b)]).unwrap_or_default(),
    }
}
