//! Carving disjoint, typed slices out of the arena — in safe code. The planner guarantees that tensors an
//! instruction touches at once never overlap; `carve` checks it again, so a corrupt plan is an error,
//! never aliasing.
use super::ExecError;
use crate::graph::{TensorId, TensorKind};
use crate::plan::{Eo, Plan};

/// `(offset, bytes)` of the first `bytes` bytes of operand `t` at instruction `eo`: `(0, 0)` for no
/// operand or an external one (the batch's inputs and targets, which live outside the arena). An arena
/// tensor without a host storage at `eo`, or smaller than the instruction needs, is an error: a plan that
/// decodes may still name the wrong tensor for an op, and a kernel never sees a short slice.
pub fn operand(
    plan: &Plan,
    eo: Eo,
    t: Option<TensorId>,
    bytes: usize,
) -> Result<(usize, usize), ExecError> {
    let Some(t) = t else { return Ok((0, 0)) };
    match plan.region_at(t, eo) {
        Some((off, len)) if len >= bytes => Ok((off, bytes)),
        Some(_) => Err(ExecError::BadPlan(
            "an operand is smaller than its instruction needs",
        )),
        None if external(plan, t) => Ok((0, 0)),
        None => Err(ExecError::BadPlan(
            "an operand has no host storage at its instruction",
        )),
    }
}

/// `(offset, bytes)` of all of operand `t` at `eo` (as [`operand`], whatever its size).
pub fn operand_whole(
    plan: &Plan,
    eo: Eo,
    t: Option<TensorId>,
) -> Result<(usize, usize), ExecError> {
    let Some(t) = t else { return Ok((0, 0)) };
    match plan.region_at(t, eo) {
        Some(r) => Ok(r),
        None if external(plan, t) => Ok((0, 0)),
        None => Err(ExecError::BadPlan(
            "an operand has no host storage at its instruction",
        )),
    }
}

fn external(plan: &Plan, t: TensorId) -> bool {
    plan.graph
        .tensors
        .get(t as usize)
        .is_some_and(|i| i.kind == TensorKind::External)
}

/// Splits `arena` into `K` disjoint mutable slices at `(offset, len)` byte ranges (in any order). A
/// zero-length request yields an empty slice. Overlapping or out-of-range requests are errors.
pub fn carve<'a, const K: usize>(
    arena: &'a mut [u8],
    reqs: [(usize, usize); K],
) -> Result<[&'a mut [u8]; K], ExecError> {
    // Insertion sort by offset: K is a handful, and this runs for every instruction.
    let mut order: [usize; K] = core::array::from_fn(|i| i);
    for i in 1..K {
        let mut j = i;
        while j > 0 && reqs[order[j - 1]].0 > reqs[order[j]].0 {
            order.swap(j - 1, j);
            j -= 1;
        }
    }
    let mut out: [&'a mut [u8]; K] = core::array::from_fn(|_| <&mut [u8]>::default());
    let mut rest: &'a mut [u8] = arena;
    let mut base = 0usize;
    for &i in &order {
        let (off, len) = reqs[i];
        if len == 0 {
            continue;
        }
        if off < base {
            return Err(ExecError::BadPlan(
                "two tensors of one instruction overlap in the arena",
            ));
        }
        let r = core::mem::take(&mut rest);
        if off - base > r.len() || len > r.len() - (off - base) {
            return Err(ExecError::BadPlan("tensor outside the arena"));
        }
        let (_, tail) = r.split_at_mut(off - base);
        let (mine, tail) = tail.split_at_mut(len);
        out[i] = mine;
        rest = tail;
        base = off + len;
    }
    Ok(out)
}

/// Bytes as f32 (the planner aligns every offset to 64 bytes).
pub fn f32s(b: &mut [u8]) -> Result<&mut [f32], ExecError> {
    if b.is_empty() {
        return Ok(&mut []); // an empty default slice has an unaligned dangling pointer
    }
    bytemuck::try_cast_slice_mut(b).map_err(|_| ExecError::BadPlan("tensor is not 4-byte aligned"))
}

/// Read-only bytes as f32.
pub fn f32s_ro(b: &[u8]) -> Result<&[f32], ExecError> {
    if b.is_empty() {
        return Ok(&[]);
    }
    bytemuck::try_cast_slice(b).map_err(|_| ExecError::BadPlan("tensor is not 4-byte aligned"))
}

/// Bytes as u32 (max-pool arg-max indices).
pub fn u32s(b: &mut [u8]) -> Result<&mut [u32], ExecError> {
    if b.is_empty() {
        return Ok(&mut []);
    }
    bytemuck::try_cast_slice_mut(b).map_err(|_| ExecError::BadPlan("tensor is not 4-byte aligned"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn carve_returns_requested_ranges_in_request_order() {
        let mut a = [0u8; 64];
        for (i, v) in a.iter_mut().enumerate() {
            *v = i as u8;
        }
        let [x, y, z] = carve(&mut a, [(32, 4), (0, 8), (8, 0)]).unwrap();
        assert_eq!(x, &[32, 33, 34, 35]);
        assert_eq!(y.len(), 8);
        assert!(z.is_empty());
    }

    #[test]
    fn carve_rejects_overlap_and_out_of_range() {
        let mut a = [0u8; 64];
        assert!(carve(&mut a, [(0, 16), (8, 16)]).is_err());
        assert!(carve(&mut a, [(60, 8)]).is_err());
        assert!(carve(&mut a, [(usize::MAX, 1)]).is_err());
    }
}
