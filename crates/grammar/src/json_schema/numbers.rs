//! Numbers with bounds as grammar: `integer` with `minimum`/`maximum` (and their
//! exclusive forms) becomes the digit strings of exactly that range, length by length;
//! `number` with integral inclusive bounds exactly that range, written without an
//! exponent (other bounds on `number` are refused, never loosened).

use serde_json::{Map, Value};

use super::invalid;
use crate::error::SchemaError;

fn bound(obj: &Map<String, Value>, kw: &str, path: &str) -> Result<Option<f64>, SchemaError> {
    match obj.get(kw) {
        None => Ok(None),
        Some(Value::Bool(_)) => Err(invalid(
            kw,
            path,
            "the boolean (draft 4) form is not supported",
        )),
        Some(v) => v
            .as_f64()
            .map(Some)
            .ok_or_else(|| invalid(kw, path, "expected a number")),
    }
}

/// Integer bounds as an inclusive range of `i64`.
pub(super) fn integer(obj: &Map<String, Value>, path: &str) -> Result<String, SchemaError> {
    let to_int = |x: f64, kw: &str| {
        if x.abs() < 9.2e18 {
            Ok(x as i128)
        } else {
            Err(invalid(kw, path, "bound outside the 64-bit integer range"))
        }
    };
    let mut lo: Option<i128> = None;
    let mut hi: Option<i128> = None;
    if let Some(x) = bound(obj, "minimum", path)? {
        lo = Some(to_int(x.ceil(), "minimum")?);
    }
    if let Some(x) = bound(obj, "exclusiveMinimum", path)? {
        lo = Some(
            lo.unwrap_or(i128::MIN)
                .max(to_int(x.floor(), "exclusiveMinimum")? + 1),
        );
    }
    if let Some(x) = bound(obj, "maximum", path)? {
        hi = Some(to_int(x.floor(), "maximum")?);
    }
    if let Some(x) = bound(obj, "exclusiveMaximum", path)? {
        hi = Some(
            hi.unwrap_or(i128::MAX)
                .min(to_int(x.ceil(), "exclusiveMaximum")? - 1),
        );
    }
    if let (Some(l), Some(h)) = (lo, hi) {
        if l > h {
            return Err(invalid(
                "minimum",
                path,
                format!("no integer lies in {l}..={h}"),
            ));
        }
    }
    if lo.is_none() && hi.is_none() {
        return Ok("integer".into());
    }
    let mut alts = Vec::new();
    // Negative values: magnitudes in max(1, -hi)..=-lo.
    if lo.is_none_or(|l| l < 0) {
        let mlo = hi.map_or(1, |h| if h < 0 { -h } else { 1 });
        alts.push(format!(
            "\"-\" {}",
            uint_range(mlo as u64, lo.map(|l| (-l) as u64))
        ));
    }
    if hi.is_none_or(|h| h >= 0) {
        alts.push(uint_range(
            lo.map_or(0, |l| l.max(0)) as u64,
            hi.map(|h| h as u64),
        ));
    }
    Ok(format!("({})", alts.join(" | ")))
}

/// Number bounds, exact for integral bounds (no exponent is generated then).
pub(super) fn number(obj: &Map<String, Value>, path: &str) -> Result<String, SchemaError> {
    for kw in ["exclusiveMinimum", "exclusiveMaximum"] {
        if obj.contains_key(kw) {
            return Err(invalid(kw, path, "exclusive bounds on `number` are not supported (use `integer` or inclusive bounds)"));
        }
    }
    let int_bound = |kw: &str| -> Result<Option<i128>, SchemaError> {
        match bound(obj, kw, path)? {
            None => Ok(None),
            Some(x) if x.fract() == 0.0 && x.abs() < 9.2e18 => Ok(Some(x as i128)),
            Some(_) => Err(invalid(
                kw,
                path,
                "only integral bounds are supported on `number`",
            )),
        }
    };
    let lo = int_bound("minimum")?;
    let hi = int_bound("maximum")?;
    if lo.is_none() && hi.is_none() {
        return Ok("number".into());
    }
    if let (Some(l), Some(h)) = (lo, hi) {
        if l > h {
            return Err(invalid(
                "minimum",
                path,
                format!("{l} is above the maximum {h}"),
            ));
        }
    }
    // A magnitude i.f lies in [p, q] for integers p, q iff p <= i < q (any fraction) or
    // i == q with an all-zero fraction.
    let magnitude = |p: u64, q: Option<u64>| -> String {
        match q {
            None => format!("{} frac?", uint_range(p, None)),
            Some(q) if q > p => format!(
                "({} frac? | \"{q}\" (\".\" \"0\"{{1,16}})?)",
                uint_range(p, Some(q - 1))
            ),
            Some(q) => format!("\"{q}\" (\".\" \"0\"{{1,16}})?"),
        }
    };
    let mut alts = Vec::new();
    if lo.is_none_or(|l| l < 0) {
        let p = hi.map_or(0, |h| if h < 0 { -h } else { 0 }) as u64;
        alts.push(format!("\"-\" {}", magnitude(p, lo.map(|l| (-l) as u64))));
    }
    if hi.is_none_or(|h| h >= 0) {
        alts.push(magnitude(
            lo.map_or(0, |l| l.max(0)) as u64,
            hi.map(|h| h as u64),
        ));
    }
    Ok(format!("({})", alts.join(" | ")))
}

/// GBNF for the decimal integers `lo..=hi` (`hi` `None`: up to 19 digits), no leading zeros.
pub(crate) fn uint_range(lo: u64, hi: Option<u64>) -> String {
    let digits = |x: u64| x.to_string().len() as u32;
    let lo_len = digits(lo);
    let hi_len = hi.map_or(lo_len, digits);
    let mut alts = Vec::new();
    for len in lo_len..=hi_len {
        let floor = if len == 1 { 0 } else { 10u64.pow(len - 1) };
        let ceil = 10u64.saturating_pow(len).saturating_sub(1);
        let a = lo.max(floor);
        let b = hi.map_or(ceil, |h| h.min(ceil));
        if a <= b {
            alts.push(same_length(
                a.to_string().as_bytes(),
                b.to_string().as_bytes(),
            ));
        }
    }
    if hi.is_none() && lo_len < 19 {
        alts.push(format!("[1-9] [0-9]{{{lo_len},18}}"));
    }
    format!("({})", alts.join(" | "))
}

/// GBNF for the digit strings between `lo` and `hi`, which have the same length.
fn same_length(lo: &[u8], hi: &[u8]) -> String {
    let (a, b) = (lo[0] as char, hi[0] as char);
    if lo.len() == 1 {
        return if a == b {
            format!("\"{a}\"")
        } else {
            format!("[{a}-{b}]")
        };
    }
    let rest = lo.len() - 1;
    if a == b {
        return format!("\"{a}\" {}", same_length(&lo[1..], &hi[1..]));
    }
    let mut alts = Vec::new();
    let lo_full = lo[1..].iter().all(|&d| d == b'0');
    let hi_full = hi[1..].iter().all(|&d| d == b'9');
    let mid_lo = if lo_full { lo[0] } else { lo[0] + 1 };
    let mid_hi = if hi_full { hi[0] } else { hi[0] - 1 };
    if !lo_full {
        alts.push(format!(
            "\"{a}\" {}",
            same_length(&lo[1..], &vec![b'9'; rest])
        ));
    }
    if mid_lo <= mid_hi {
        alts.push(format!(
            "[{}-{}] [0-9]{{{rest}}}",
            mid_lo as char, mid_hi as char
        ));
    }
    if !hi_full {
        alts.push(format!(
            "\"{b}\" {}",
            same_length(&vec![b'0'; rest], &hi[1..])
        ));
    }
    format!("({})", alts.join(" | "))
}
