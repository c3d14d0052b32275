//! Placing a sequence of instructions on devices (CPU, GPU, DSP…) by dynamic programming over measured
//! costs: Mandheling's CPU–DSP co-scheduling recurrence (§3.3), extended from one constant context-switch
//! cost to a transfer cost per boundary and per pair of devices, and from two devices to any number.
//!
//! The instance: `n` instructions in execution order; `cost[i·D + d]` is instruction `i`'s time on device
//! `d` (`f64::INFINITY`: `d` cannot run it); `transfer[b·D·D + a·D + d]` is the time to move what crosses
//! boundary `b` from device `a` to device `d` (0 on the diagonal as a rule, though any value is allowed).
//! Boundary 0 precedes instruction 0 (the input arrives from device `start`); boundary `i` lies between
//! instructions `i - 1` and `i`; boundary `n` follows the last instruction (its result must reach
//! device `end`, e.g. the host that reads the loss). The total of a placement is the sum of its
//! instructions' costs and of the transfers at every boundary; [`place`] returns a placement of least
//! total. The recurrence, with `T[i][d]` the least time to finish instructions `0..=i` with `i` on `d`:
//!
//! `T[0][d] = transfer(0, start, d) + cost(0, d)`,
//! `T[i][d] = cost(i, d) + min over a of (T[i-1][a] + transfer(i, a, d))`,
//! `total = min over a of (T[n-1][a] + transfer(n, a, end))`.
//!
//! It is exact for this model — a chain, where what crosses a boundary depends only on the devices on
//! either side of it — and the tests check it against every placement of random instances. A value
//! read again much later (a residual's skip tensor) is charged at the boundaries it crosses by whoever
//! builds `transfer`.
use alloc::vec;
use alloc::vec::Vec;

/// A placement problem (see the module's documentation for the layout of the slices).
#[derive(Clone, Copy, Debug)]
pub struct Problem<'a> {
    /// Devices.
    pub devices: usize,
    /// `n × devices` instruction times; infinite where a device cannot run an instruction.
    pub cost: &'a [f64],
    /// `(n + 1) × devices × devices` boundary transfer times.
    pub transfer: &'a [f64],
    /// The device the input comes from.
    pub start: usize,
    /// The device the result must reach.
    pub end: usize,
}

/// Why a problem has no answer.
#[derive(Clone, Debug, PartialEq)]
pub enum PlaceError {
    /// The slices do not match `devices` and each other, or `start`/`end` is not a device.
    Shape(&'static str),
    /// A cost or transfer is NaN or negative.
    BadValue(&'static str),
    /// Every placement has an infinite total (an instruction no device can run, or no finite way
    /// between devices).
    Infeasible,
}

impl Problem<'_> {
    /// Instructions.
    pub fn len(&self) -> usize {
        self.cost.len().checked_div(self.devices).unwrap_or(0)
    }

    /// Whether there are no instructions.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn check(&self) -> Result<usize, PlaceError> {
        let d = self.devices;
        if d == 0 || self.start >= d || self.end >= d {
            return Err(PlaceError::Shape(
                "no devices, or start/end is not a device",
            ));
        }
        if !self.cost.len().is_multiple_of(d) {
            return Err(PlaceError::Shape("cost is not n × devices"));
        }
        let n = self.cost.len() / d;
        if Some(self.transfer.len()) != (n + 1).checked_mul(d * d) {
            return Err(PlaceError::Shape(
                "transfer is not (n + 1) × devices × devices",
            ));
        }
        let ok = |v: &f64| !v.is_nan() && *v >= 0.0;
        if !self.cost.iter().all(ok) {
            return Err(PlaceError::BadValue(
                "an instruction cost is NaN or negative",
            ));
        }
        if !self.transfer.iter().all(ok) {
            return Err(PlaceError::BadValue("a transfer cost is NaN or negative"));
        }
        Ok(n)
    }

    fn tr(&self, b: usize, from: usize, to: usize) -> f64 {
        let d = self.devices;
        self.transfer[(b * d + from) * d + to]
    }

    /// The total time of `placement` (one device per instruction).
    pub fn total(&self, placement: &[usize]) -> f64 {
        let d = self.devices;
        let mut at = self.start;
        let mut t = 0.0;
        for (i, &p) in placement.iter().enumerate() {
            t += self.tr(i, at, p) + self.cost[i * d + p];
            at = p;
        }
        t + self.tr(placement.len(), at, self.end)
    }
}

/// A placement of least total time and that total. Ties go to the lowest device index, instruction by
/// instruction from the last, so the answer is deterministic. O(n · devices²) time, n · devices memory.
pub fn place(p: &Problem<'_>) -> Result<(f64, Vec<usize>), PlaceError> {
    let n = p.check()?;
    let d = p.devices;
    if n == 0 {
        let t = p.tr(0, p.start, p.end);
        return if t.is_finite() {
            Ok((t, Vec::new()))
        } else {
            Err(PlaceError::Infeasible)
        };
    }
    // best[i·d + x]: least time to finish 0..=i with i on x; from[i·d + x]: the device of i - 1 then.
    let mut best = vec![f64::INFINITY; n * d];
    let mut from = vec![0usize; n * d];
    for (x, b) in best.iter_mut().enumerate().take(d) {
        *b = p.tr(0, p.start, x) + p.cost[x];
    }
    for i in 1..n {
        for x in 0..d {
            let (mut b, mut arg) = (f64::INFINITY, 0);
            for a in 0..d {
                let v = best[(i - 1) * d + a] + p.tr(i, a, x);
                if v < b {
                    (b, arg) = (v, a);
                }
            }
            best[i * d + x] = b + p.cost[i * d + x];
            from[i * d + x] = arg;
        }
    }
    let (mut total, mut last) = (f64::INFINITY, 0);
    for a in 0..d {
        let v = best[(n - 1) * d + a] + p.tr(n, a, p.end);
        if v < total {
            (total, last) = (v, a);
        }
    }
    if !total.is_finite() {
        return Err(PlaceError::Infeasible);
    }
    let mut out = vec![0usize; n];
    out[n - 1] = last;
    for i in (1..n).rev() {
        out[i - 1] = from[i * d + out[i]];
    }
    Ok((total, out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Every placement, for the tests: devices^n of them.
    fn brute_force(p: &Problem<'_>) -> Option<f64> {
        let n = p.len();
        let mut pl = vec![0usize; n];
        let mut best = f64::INFINITY;
        loop {
            best = best.min(p.total(&pl));
            // Next placement in base `devices`.
            let mut i = 0;
            loop {
                if i == n {
                    return best.is_finite().then_some(best);
                }
                pl[i] += 1;
                if pl[i] < p.devices {
                    break;
                }
                pl[i] = 0;
                i += 1;
            }
        }
    }

    fn instance() -> impl Strategy<Value = (usize, Vec<f64>, Vec<f64>, usize, usize)> {
        (1usize..4, 0usize..8).prop_flat_map(|(d, n)| {
            // Costs: mostly finite, sometimes a device cannot run an instruction.
            let cost = prop_oneof![4 => (0u32..100).prop_map(|c| c as f64 / 4.0), 1 => Just(f64::INFINITY)];
            let tr = prop_oneof![5 => (0u32..60).prop_map(|c| c as f64 / 4.0), 1 => Just(f64::INFINITY)];
            (
                Just(d),
                proptest::collection::vec(cost, n * d),
                proptest::collection::vec(tr, (n + 1) * d * d),
                0..d,
                0..d,
            )
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

        /// On random instances (up to 3 devices, 7 instructions, some devices unable to run some
        /// instructions, some transfers impossible), the placement is optimal: its total equals the
        /// least over every placement, and it is what `total` says it is.
        #[test]
        fn the_placement_is_optimal_against_brute_force((d, cost, mut transfer, start, end) in instance()) {
            // Staying put costs nothing at most boundaries; the instance keeps some diagonal costs too.
            for (k, v) in transfer.iter_mut().enumerate() {
                if (k / d) % d == k % d && k % 3 != 0 {
                    *v = 0.0;
                }
            }
            let p = Problem { devices: d, cost: &cost, transfer: &transfer, start, end };
            match (place(&p), brute_force(&p)) {
                (Ok((t, pl)), Some(b)) => {
                    prop_assert_eq!(pl.len(), p.len());
                    prop_assert!((t - b).abs() <= 1e-9 * b.max(1.0), "dp {t} brute force {b}");
                    prop_assert!((p.total(&pl) - t).abs() <= 1e-9 * t.max(1.0));
                }
                (Err(PlaceError::Infeasible), None) => {}
                (x, y) => prop_assert!(false, "dp {x:?}, brute force {y:?}"),
            }
        }
    }

    /// Mandheling's case: two devices, a constant switch cost. A DSP-unfriendly instruction in the
    /// middle stays on the DSP when moving to the CPU and back costs more than it saves.
    #[test]
    fn a_short_detour_is_not_worth_two_switches() {
        let (cpu, dsp) = (0, 1);
        // Three instructions: fast on the DSP, the middle one 3 units slower there.
        let cost = [10.0, 2.0, 1.0, 4.0, 10.0, 2.0];
        let switch = |s: f64| {
            let mut t = vec![0.0; 4 * 4];
            for b in 0..4 {
                t[b * 4 + 1] = s; // cpu → dsp
                t[b * 4 + 2] = s; // dsp → cpu
            }
            t
        };
        let cheap = switch(0.5);
        let p = Problem {
            devices: 2,
            cost: &cost,
            transfer: &cheap,
            start: cpu,
            end: cpu,
        };
        assert_eq!(place(&p).unwrap().1, [dsp, cpu, dsp]);
        let dear = switch(5.0);
        let p = Problem {
            devices: 2,
            cost: &cost,
            transfer: &dear,
            start: cpu,
            end: cpu,
        };
        assert_eq!(place(&p).unwrap().1, [dsp, dsp, dsp]);
    }

    #[test]
    fn malformed_problems_are_errors() {
        let p = Problem {
            devices: 2,
            cost: &[1.0, 2.0, 3.0],
            transfer: &[0.0; 8],
            start: 0,
            end: 0,
        };
        assert!(matches!(place(&p), Err(PlaceError::Shape(_))));
        let p = Problem {
            devices: 1,
            cost: &[f64::NAN],
            transfer: &[0.0; 2],
            start: 0,
            end: 0,
        };
        assert!(matches!(place(&p), Err(PlaceError::BadValue(_))));
        let p = Problem {
            devices: 1,
            cost: &[f64::INFINITY],
            transfer: &[0.0; 2],
            start: 0,
            end: 0,
        };
        assert_eq!(place(&p), Err(PlaceError::Infeasible));
        let p = Problem {
            devices: 2,
            cost: &[],
            transfer: &[0.0, 1.0, 1.0, 0.0],
            start: 0,
            end: 1,
        };
        assert_eq!(place(&p), Ok((1.0, vec![])));
    }
}
