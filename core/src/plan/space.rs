//! Memory spaces: where a storage lives.
//!
//! The host arena (`&mut [u8]`, [`SpaceId::HOST`]) is one space; an accelerator's memory (a GPU buffer,
//! DSP buffers) is another, owned by the backend that serves it and laid out by the same planner with
//! that space's own lifetimes and alignment. Every storage ([`TensorLife`]) names its space; offsets are
//! within it. [`Plan::arena_bytes`] is the host space's size, [`Plan::spaces`] the others'. A value
//! changes space through a planned [`Phase::Move`](super::Phase::Move), which ends one storage of its
//! group and begins the next, in another space ([`crate::policy::spaces`] inserts them).
//!
//! # Budgets over several spaces
//! A [`Budget`] bounds one space. The host space's budget is the one every host gives (the CLI's
//! `--budget`, the browser's slider, a microcontroller's static buffer); a host that lends an accelerator
//! adds one budget per accelerator space, and [`Plan::check_budgets`] checks each space against its own
//! (a space without a budget is bounded only by its backend, which refuses a layout it cannot hold when it
//! is prepared). Budgets never add up across spaces: GPU bytes do not pay for host bytes.
use alloc::vec::Vec;

use super::{lower_bound, strategies, Id, Plan, StorageId, TensorLife, ALIGN};
use crate::budget::{Budget, BudgetError};

/// A memory space.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SpaceId(pub u8);

impl SpaceId {
    /// The host arena, which every plan has.
    pub const HOST: SpaceId = SpaceId(0);
}

/// The layout of one space other than the host's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpaceLayout {
    /// The space.
    pub space: SpaceId,
    /// Alignment of every offset in it (a power of two, at least [`ALIGN`]).
    pub align: usize,
    /// Its size: the layout's high-water mark.
    pub bytes: usize,
    /// max over execution orders of its bytes alive at once.
    pub lower_bound: usize,
}

fn round_up(v: usize, a: usize) -> usize {
    v.div_ceil(a) * a
}

impl Plan {
    /// The size of `space` in this plan (0 when no storage lives there).
    pub fn space_bytes(&self, space: SpaceId) -> usize {
        if space == SpaceId::HOST {
            return self.arena_bytes;
        }
        self.spaces
            .iter()
            .find(|s| s.space == space)
            .map_or(0, |s| s.bytes)
    }

    /// Checks every space against its budget (see the [module](self) docs): the host space as
    /// [`Plan::check_budget`], another space's bytes against its own budget.
    pub fn check_budgets(&self, budgets: &[(SpaceId, Budget)]) -> Result<(), BudgetError> {
        for &(space, b) in budgets {
            if space == SpaceId::HOST {
                self.check_budget(b)?;
            } else {
                let needed = self.space_bytes(space);
                if needed > b.bytes {
                    return Err(BudgetError::TooSmall {
                        needed,
                        given: b.bytes,
                    });
                }
            }
        }
        Ok(())
    }

    /// Moves storages to other spaces: `space_of(storage, life)` names each storage's space, `align_of`
    /// each non-host space's alignment. Every space is then laid out afresh with the smallest of the
    /// layout strategies, over its own storages only; the host arena shrinks by what left it.
    pub fn place_spaces(
        &mut self,
        space_of: impl Fn(StorageId, &TensorLife) -> SpaceId,
        align_of: impl Fn(SpaceId) -> usize,
    ) {
        for (i, l) in self.lives.iter_mut().enumerate() {
            l.space = space_of(StorageId::from_index(i), l);
        }
        let mut ids: Vec<SpaceId> = self.lives.iter().map(|l| l.space).collect();
        ids.push(SpaceId::HOST);
        crate::sort::heap_sort_by_key(&mut ids, |s| *s);
        ids.dedup();
        self.spaces.clear();
        for space in ids {
            let align = if space == SpaceId::HOST {
                ALIGN
            } else {
                align_of(space).max(ALIGN).next_power_of_two()
            };
            let (bytes, lb) = self.lay_out_space(space, align);
            if space == SpaceId::HOST {
                self.arena_bytes = bytes;
                self.lower_bound = lb;
            } else {
                self.spaces.push(SpaceLayout {
                    space,
                    align,
                    bytes,
                    lower_bound: lb,
                });
            }
        }
    }

    /// Lays out the storages of `space` at multiples of `align`; returns (bytes, lower bound).
    fn lay_out_space(&mut self, space: SpaceId, align: usize) -> (usize, usize) {
        let members: Vec<StorageId> = self
            .lives
            .ids()
            .filter(|&i| self.lives[i].space == space)
            .collect();
        // Sizes rounded to the space's alignment: every strategy then places at multiples of it
        // (strategies place storages at sums of sizes).
        let lives: Vec<TensorLife> = members
            .iter()
            .map(|&i| {
                let mut l = self.lives[i].clone();
                l.bytes = round_up(l.bytes, align);
                l
            })
            .collect();
        let lb = lower_bound(&lives);
        let best = strategies()
            .iter()
            .map(|s| (s.layout(&lives), s.name()))
            .min_by_key(|(l, _)| l.arena_bytes);
        let Some((layout, name)) = best else {
            return (0, lb);
        };
        for (k, &i) in members.iter().enumerate() {
            self.offsets[i] = layout.offsets[k];
        }
        if space == SpaceId::HOST {
            self.strategy = name;
        }
        (layout.arena_bytes, lb)
    }
}
