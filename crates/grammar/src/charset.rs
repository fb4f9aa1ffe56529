//! Sets of Unicode code points as sorted, disjoint, non-adjacent inclusive ranges.

/// Largest Unicode scalar value.
pub(crate) const MAX_CHAR: u32 = 0x10FFFF;

#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub(crate) struct CharSet {
    ranges: Vec<(u32, u32)>,
}

impl CharSet {
    pub(crate) fn from_ranges(mut ranges: Vec<(u32, u32)>) -> Self {
        ranges.sort_unstable();
        let mut merged: Vec<(u32, u32)> = Vec::with_capacity(ranges.len());
        for (lo, hi) in ranges {
            match merged.last_mut() {
                Some(last) if lo <= last.1.saturating_add(1) => last.1 = last.1.max(hi),
                _ => merged.push((lo, hi)),
            }
        }
        CharSet { ranges: merged }
    }

    pub(crate) fn single(c: u32) -> Self {
        CharSet {
            ranges: vec![(c, c)],
        }
    }

    pub(crate) fn any() -> Self {
        CharSet {
            ranges: vec![(0, MAX_CHAR)],
        }
    }

    pub(crate) fn complement(&self) -> Self {
        let mut out = Vec::new();
        let mut next = 0u32;
        for &(lo, hi) in &self.ranges {
            if lo > next {
                out.push((next, lo - 1));
            }
            next = hi + 1;
        }
        if next <= MAX_CHAR {
            out.push((next, MAX_CHAR));
        }
        CharSet { ranges: out }
    }

    pub(crate) fn contains(&self, c: u32) -> bool {
        // Ranges are few (usually 1-4): a linear scan beats a binary search.
        self.ranges.iter().any(|&(lo, hi)| lo <= c && c <= hi)
    }

    /// Whether any code point in `lo..=hi` is in the set.
    pub(crate) fn intersects(&self, lo: u32, hi: u32) -> bool {
        self.ranges.iter().any(|&(a, b)| a <= hi && lo <= b)
    }
}
