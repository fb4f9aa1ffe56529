//! The statistics of the A/B: median, min and max per arm, and ratios computed pair by
//! pair (run i of arm A against run i of arm B), whose median is robust to the machine
//! drifting during the benchmark in a way a ratio of medians is not.

use std::collections::BTreeMap;

use serde::Serialize;

/// Median, min and max of a set of measurements, and how many there were.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub n: usize,
}

/// The median of the finite values (mean of the middle two for an even count); `None`
/// when there is no finite value.
pub fn median(values: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    Some(if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    })
}

/// Median, min and max of the finite values; `None` when there is none.
pub fn spread(values: &[f64]) -> Option<Spread> {
    let finite: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    let median = median(&finite)?;
    Some(Spread {
        median,
        min: finite.iter().copied().fold(f64::INFINITY, f64::min),
        max: finite.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        n: finite.len(),
    })
}

/// Ratios `num[k] / den[k]` for every key `k` present on both sides, in key order.
/// Pairs with a non-finite value or a zero denominator are left out (a ratio to zero
/// says nothing).
pub fn pair_ratios<K: Ord + Clone>(num: &[(K, f64)], den: &[(K, f64)]) -> Vec<f64> {
    let den: BTreeMap<K, f64> = den.iter().cloned().collect();
    let num: BTreeMap<K, f64> = num.iter().cloned().collect();
    num.iter()
        .filter_map(|(k, &a)| {
            let &b = den.get(k)?;
            (a.is_finite() && b.is_finite() && b != 0.0).then_some(a / b)
        })
        .collect()
}

/// Differences `a[k] - b[k]` for every key present on both sides with finite values, in
/// key order (for memory, where "smaller by X MiB" is the claim, not "X times smaller").
pub fn pair_differences<K: Ord + Clone>(a: &[(K, f64)], b: &[(K, f64)]) -> Vec<f64> {
    let b: BTreeMap<K, f64> = b.iter().cloned().collect();
    let a: BTreeMap<K, f64> = a.iter().cloned().collect();
    a.iter()
        .filter_map(|(k, &x)| {
            let &y = b.get(k)?;
            (x.is_finite() && y.is_finite()).then_some(x - y)
        })
        .collect()
}

/// The median (with min and max) of the pairwise ratios; `None` without a single pair.
pub fn pair_ratio_spread<K: Ord + Clone>(num: &[(K, f64)], den: &[(K, f64)]) -> Option<Spread> {
    spread(&pair_ratios(num, den))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[7.0]), Some(7.0));
        assert_eq!(median(&[]), None);
        // Non-finite values are not measurements.
        assert_eq!(median(&[f64::NAN, 5.0, f64::INFINITY, 1.0]), Some(3.0));
        assert_eq!(median(&[f64::NAN]), None);
    }

    #[test]
    fn spread_reports_median_min_max_and_count() {
        let s = spread(&[10.0, 2.0, 7.0, 30.0, 4.0]).expect("five values");
        assert_eq!(
            s,
            Spread {
                median: 7.0,
                min: 2.0,
                max: 30.0,
                n: 5
            }
        );
        assert_eq!(spread(&[]), None);
    }

    #[test]
    fn ratios_are_taken_pair_by_pair() {
        // Run k of A against run k of B: 1/2, 10/1, 100/50 -> 0.5, 10, 2; median 2.
        // The ratio of the medians would be 10/2 = 5: a different (and drift-prone) answer.
        let a = [(0, 1.0), (1, 10.0), (2, 100.0)];
        let b = [(0, 2.0), (1, 1.0), (2, 50.0)];
        assert_eq!(pair_ratios(&a, &b), vec![0.5, 10.0, 2.0]);
        let s = pair_ratio_spread(&a, &b).expect("three pairs");
        assert_eq!(s.median, 2.0);
        assert_eq!((s.min, s.max, s.n), (0.5, 10.0, 3));
        assert_eq!(
            median(&[1.0, 10.0, 100.0]).unwrap() / median(&[2.0, 1.0, 50.0]).unwrap(),
            5.0
        );
    }

    #[test]
    fn unmatched_and_degenerate_pairs_are_skipped() {
        // Run 1 of A failed, run 3 of B failed, run 2's denominator is zero.
        let a = [(0, 4.0), (2, 3.0), (3, 9.0), (4, 8.0)];
        let b = [(0, 2.0), (1, 5.0), (2, 0.0), (4, 2.0)];
        assert_eq!(pair_ratios(&a, &b), vec![2.0, 4.0]);
        assert_eq!(pair_ratio_spread(&a, &b).map(|s| s.median), Some(3.0));
        assert_eq!(pair_ratio_spread::<u32>(&[], &[(0, 1.0)]), None);
        // Keys can be compound: (procs, repetition, process).
        let a = [((2, 0, 1), 6.0), ((2, 0, 0), 1.0)];
        let b = [((2, 0, 0), 4.0), ((2, 0, 1), 3.0)];
        assert_eq!(pair_ratios(&a, &b), vec![0.25, 2.0]);
    }

    #[test]
    fn differences_are_taken_pair_by_pair() {
        let a = [(0, 10.0), (1, 4.0), (2, f64::NAN), (3, 1.0)];
        let b = [(0, 3.0), (1, 6.0), (2, 1.0)];
        assert_eq!(pair_differences(&a, &b), vec![7.0, -2.0]);
        assert_eq!(
            spread(&pair_differences(&a, &b)).map(|s| s.median),
            Some(2.5)
        );
    }
}
