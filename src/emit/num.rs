//! Number and cell formatting shared by the writers.

use serde_json::Value as Json;

/// Lossless shortest form (`{}` of f64), for data files read by programs.
pub fn exact(x: f64) -> String {
    if x.is_finite() {
        format!("{x}")
    } else {
        String::new()
    }
}

pub fn exact_opt(x: Option<f64>) -> String {
    x.map(exact).unwrap_or_default()
}

/// Rounded to `decimals` and printed as Python prints a float (`2508.0`, `5.26`).
pub fn py_float(x: f64, decimals: i32) -> String {
    if !x.is_finite() {
        return "0.0".into();
    }
    let scale = 10f64.powi(decimals);
    let r = (x * scale).round() / scale;
    let r = if r == 0.0 { 0.0 } else { r };
    let s = format!("{r}");
    if s.contains('.') || s.contains('e') {
        s
    } else {
        s + ".0"
    }
}

/// Microseconds for people: about four significant digits.
pub fn us(x: f64) -> String {
    if !x.is_finite() {
        return DASH.into();
    }
    let a = x.abs();
    if a < 10.0 {
        format!("{x:.3}")
    } else if a < 1000.0 {
        format!("{x:.2}")
    } else {
        format!("{x:.1}")
    }
}

/// A figure for people with `decimals` decimals, or a dash.
pub fn fixed(x: Option<f64>, decimals: usize) -> String {
    match x {
        Some(v) if v.is_finite() => format!("{v:.decimals$}"),
        _ => DASH.into(),
    }
}

/// TFLOP/s and GB/s for people: one decimal, none from 1000 up.
pub fn rate(x: Option<f64>) -> String {
    match x {
        Some(v) if v.is_finite() && v.abs() >= 1000.0 => format!("{v:.0}"),
        Some(v) if v.is_finite() && v.abs() < 10.0 => format!("{v:.2}"),
        other => fixed(other, 1),
    }
}

pub fn speedup(x: Option<f64>) -> String {
    match x {
        Some(v) if v.is_finite() => times(v),
        _ => DASH.into(),
    }
}

/// A ratio for people, `1.06×`: two decimals, and below 0.1 two significant
/// digits (`0.0042×`), so a ratio far below one never reads `0.00×`.
pub fn times(x: f64) -> String {
    let a = x.abs();
    if a >= 0.1 || a == 0.0 || !x.is_finite() {
        return format!("{x:.2}×");
    }
    let decimals = (1 - a.log10().floor() as i32).clamp(2, 12) as usize;
    format!("{x:.decimals$}×")
}

/// What missing data looks like in the report.
/// `1 shape`, `3 shapes`: a count and its noun, singular or plural.
pub fn count(n: impl Into<u64>, one: &str, many: &str) -> String {
    match n.into() {
        1 => format!("1 {one}"),
        n => format!("{n} {many}"),
    }
}

pub const DASH: &str = "—";

/// A JSON scalar as a CSV cell: strings bare, null empty, lists and objects as compact JSON.
pub fn json_cell(v: &Json) -> String {
    match v {
        Json::Null => String::new(),
        Json::String(s) => s.clone(),
        Json::Bool(b) => b.to_string(),
        Json::Number(n) => n.to_string(),
        other => other.to_string(),
    }
}

/// A JSON scalar for people (strings bare).
pub fn json_text(v: &Json) -> String {
    match v {
        Json::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Short names of common tile and launch parameters, for kernel names and tables.
pub fn abbreviation(name: &str) -> Option<&'static str> {
    Some(match name {
        "BLOCK_SIZE_M" | "BLOCK_M" => "BM",
        "BLOCK_SIZE_N" | "BLOCK_N" => "BN",
        "BLOCK_SIZE_K" | "BLOCK_K" => "BK",
        "GROUP_SIZE_M" | "GROUP_M" => "GM",
        "num_warps" => "w",
        "num_stages" => "s",
        "num_ctas" => "ctas",
        "waves_per_eu" => "wpe",
        "matrix_instr_nonkdim" => "mi",
        "kpack" => "kp",
        "SPLIT_K" => "SK",
        "NUM_KSPLIT" => "KS",
        _ => return None,
    })
}

/// A config in one short line: `BM16 BN64 BK128 GM1 w4 s4` (other fields as `name=value`).
pub fn compact_config(config: &indexmap::IndexMap<String, Json>) -> String {
    config
        .iter()
        .map(|(k, v)| match abbreviation(k) {
            Some(a) => format!("{a}{}", json_text(v)),
            None => format!("{k}={}", json_text(v)),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios_far_below_one_keep_two_significant_digits() {
        assert_eq!(times(1.0567), "1.06×");
        assert_eq!(times(0.83), "0.83×");
        assert_eq!(times(0.0042), "0.0042×");
        assert_eq!(times(0.00123), "0.0012×");
        assert_eq!(times(0.05), "0.050×");
        assert_eq!(times(0.0), "0.00×");
    }

    #[test]
    fn python_float_spelling() {
        assert_eq!(py_float(2508.0, 2), "2508.0");
        assert_eq!(py_float(5.2649, 2), "5.26");
        assert_eq!(py_float(74.12219999, 4), "74.1222");
        assert_eq!(py_float(-0.0001, 2), "0.0");
    }

    #[test]
    fn microseconds_keep_four_digits() {
        assert_eq!(us(3.41234), "3.412");
        assert_eq!(us(85.126), "85.13");
        assert_eq!(us(2130.44), "2130.4");
    }
}
