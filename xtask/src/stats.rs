//! Summaries of repeated measurements, shared by the benches.
use std::fmt;

/// The median of `v` (the upper middle value of an even count; NaN when `v` is empty).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Median and extremes of repeated measurements of one quantity.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    /// The spread of `v` (every field NaN when `v` is empty).
    pub fn of(v: &[f64]) -> Self {
        let fold = |f: fn(f64, f64) -> f64| v.iter().copied().reduce(f).unwrap_or(f64::NAN);
        Spread {
            median: median(v.to_vec()),
            min: fold(f64::min),
            max: fold(f64::max),
        }
    }
}

impl fmt::Display for Spread {
    /// `median [min–max]`, each with the formatter's precision (3 digits unless given).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = f.precision().unwrap_or(3);
        write!(f, "{:.p$} [{:.p$}–{:.p$}]", self.median, self.min, self.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_takes_the_middle_of_the_sorted_values() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 3.0);
        assert!(median(Vec::new()).is_nan());
    }

    #[test]
    fn spread_reports_median_and_extremes() {
        let s = Spread::of(&[0.28, 0.196, 0.29]);
        assert_eq!((s.median, s.min, s.max), (0.28, 0.196, 0.29));
        assert_eq!(format!("{s}"), "0.280 [0.196–0.290]");
        assert_eq!(format!("{s:.2}"), "0.28 [0.20–0.29]");
        assert!(Spread::of(&[]).min.is_nan());
    }
}
