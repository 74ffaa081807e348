//! `triton_mbucket`: Triton GEMM configs keyed by M bucket, one JSON object
//! per rendered path (the usual template
//! `{{device.arch}}-GEMM-<tag>-N={{N}}-K={{K}}.json` gives one per (N, K)).
//! Each value is every config field of the best job, as recorded (integers
//! stay integers). 4-space indentation, trailing newline.
//!
//! Current scheme (aiter's `get_gemm_config`: `M_LEQ_x` searched ascending
//! over its standard bounds, then `M_GEQ_x` descending over the same bounds,
//! then `any`):
//!
//! - a tuned M goes to `M_LEQ_x` for the smallest x in 1, 4, 8, 16, 32, 64,
//!   128, 256, 512, 1024, 2048, 4096, 8192 with M <= x;
//! - a tuned M above 8192 goes to `M_GEQ_8192`. (Not `M_GEQ_<that M>`:
//!   aiter only looks up `M_GEQ_x` for x among its standard bounds, so any
//!   other x would never be read.)
//! - when several tuned Ms land in one bucket, the bucket holds the config of
//!   the largest of them (the bucket's upper edge is what it serves);
//! - buckets no tuned M lands in are left out; the loader falls through to
//!   the next bucket up, then `any`;
//! - `any` holds the config of the largest tuned M.
//!
//! Legacy scheme (`OutputSpec.legacy_keys`): `small` (M < 32), `medium_M32`
//! (M = 32), `medium_M64` (33..=64), `medium_M128` (65..=128) (that is,
//! 32 <= M <= 128 by the next power of two of M), `large` (129..=256),
//! `xlarge` (M > 256), `any` (the largest tuned M). Several tuned Ms in a
//! bucket: the largest wins, as above. Older loaders index these keys
//! directly, so every key is written: a bucket no tuned M lands in takes
//! the config of the tuned M nearest to its range (the larger M on a tie).
//!
//! Keys appear in the order above. Two shapes of one file with the same M
//! are an error (the path template leaves out a field that tells them apart).

use std::collections::BTreeMap;

use indexmap::IndexMap;
use serde_json::Value as Json;

use super::vllm::to_json_indent4;
use super::{EmitError, Group};

/// aiter's standard M bounds.
pub const BOUNDS: [i64; 13] = [1, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192];

/// The current-scheme bucket key of a tuned M.
pub fn current_key(m: i64) -> String {
    match BOUNDS.iter().find(|&&x| m <= x) {
        Some(x) => format!("M_LEQ_{x}"),
        None => format!("M_GEQ_{}", BOUNDS[BOUNDS.len() - 1]),
    }
}

/// Legacy buckets: key and inclusive M range.
const LEGACY: [(&str, i64, i64); 6] = [
    ("small", i64::MIN, 31),
    ("medium_M32", 32, 32),
    ("medium_M64", 33, 64),
    ("medium_M128", 65, 128),
    ("large", 129, 256),
    ("xlarge", 257, i64::MAX),
];

/// The legacy bucket key of a tuned M.
pub fn legacy_key(m: i64) -> &'static str {
    LEGACY
        .iter()
        .find(|(_, lo, hi)| (*lo..=*hi).contains(&m))
        .map(|(k, _, _)| *k)
        .expect("the legacy ranges cover every M")
}

/// Bucket key -> config, in file order, from tuned M -> config.
pub fn buckets(
    tuned: &BTreeMap<i64, IndexMap<String, Json>>,
    legacy: bool,
) -> IndexMap<String, IndexMap<String, Json>> {
    let mut out = IndexMap::new();
    let Some((_, largest)) = tuned.last_key_value() else {
        return out;
    };
    if legacy {
        for (key, lo, hi) in LEGACY {
            // Largest tuned M inside the range, else the nearest one outside it.
            let inside = tuned.range(lo..=hi).next_back();
            let chosen = inside.or_else(|| {
                let below = tuned.range(..lo).next_back();
                let above = tuned.range(hi.saturating_add(1)..).next();
                match (below, above) {
                    (Some(b), Some(a)) => Some(if lo - *b.0 < *a.0 - hi { b } else { a }),
                    (b, a) => b.or(a),
                }
            });
            if let Some((_, config)) = chosen {
                out.insert(key.to_string(), config.clone());
            }
        }
    } else {
        // Ascending M: a later (larger) M overwrites its bucket's entry.
        let mut by_key: BTreeMap<usize, (String, &IndexMap<String, Json>)> = BTreeMap::new();
        for (m, config) in tuned {
            let key = current_key(*m);
            let rank = BOUNDS.iter().position(|x| *m <= *x).unwrap_or(BOUNDS.len());
            by_key.insert(rank, (key, config));
        }
        for (_, (key, config)) in by_key {
            out.insert(key, config.clone());
        }
    }
    out.insert("any".into(), largest.clone());
    out
}

pub fn render(group: &Group<'_, '_>) -> Result<Option<String>, EmitError> {
    let tuned: BTreeMap<i64, IndexMap<String, Json>> = group
        .bests_by_m()?
        .into_iter()
        .map(|(m, (_, best))| (m, best.job.config.clone()))
        .collect();
    if tuned.is_empty() {
        return Ok(None);
    }
    let doc = buckets(&tuned, group.spec.legacy_keys);
    let value = serde_json::to_value(&doc).expect("configs serialise");
    Ok(Some(to_json_indent4(&value) + "\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn current_keys_follow_the_bounds() {
        assert_eq!(current_key(1), "M_LEQ_1");
        assert_eq!(current_key(2), "M_LEQ_4");
        assert_eq!(current_key(4), "M_LEQ_4");
        assert_eq!(current_key(5), "M_LEQ_8");
        assert_eq!(current_key(8192), "M_LEQ_8192");
        assert_eq!(current_key(8193), "M_GEQ_8192");
    }

    #[test]
    fn legacy_keys_follow_next_power_of_two() {
        assert_eq!(legacy_key(1), "small");
        assert_eq!(legacy_key(31), "small");
        assert_eq!(legacy_key(32), "medium_M32");
        assert_eq!(legacy_key(33), "medium_M64");
        assert_eq!(legacy_key(64), "medium_M64");
        assert_eq!(legacy_key(65), "medium_M128");
        assert_eq!(legacy_key(128), "medium_M128");
        assert_eq!(legacy_key(256), "large");
        assert_eq!(legacy_key(257), "xlarge");
    }

    fn cfg(tag: i64) -> IndexMap<String, Json> {
        IndexMap::from([("BLOCK_SIZE_M".to_string(), Json::from(tag))])
    }

    #[test]
    fn the_largest_m_of_a_bucket_wins_and_empty_buckets_are_left_out() {
        let tuned = BTreeMap::from([(2, cfg(2)), (3, cfg(3)), (64, cfg(64)), (9000, cfg(9000))]);
        let b = buckets(&tuned, false);
        let keys: Vec<&str> = b.keys().map(String::as_str).collect();
        assert_eq!(keys, ["M_LEQ_4", "M_LEQ_64", "M_GEQ_8192", "any"]);
        assert_eq!(b["M_LEQ_4"], cfg(3));
        assert_eq!(b["any"], cfg(9000));
    }

    #[test]
    fn legacy_buckets_are_all_written_from_the_nearest_tuned_m() {
        let tuned = BTreeMap::from([(16, cfg(16)), (64, cfg(64)), (1024, cfg(1024))]);
        let b = buckets(&tuned, true);
        let keys: Vec<&str> = b.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "small",
                "medium_M32",
                "medium_M64",
                "medium_M128",
                "large",
                "xlarge",
                "any"
            ]
        );
        assert_eq!(b["small"], cfg(16));
        // 32 is 16 away from M=16 and 32 away from M=64.
        assert_eq!(b["medium_M32"], cfg(16));
        assert_eq!(b["medium_M64"], cfg(64));
        assert_eq!(b["medium_M128"], cfg(64));
        assert_eq!(b["large"], cfg(64));
        assert_eq!(b["xlarge"], cfg(1024));
        assert_eq!(b["any"], cfg(1024));
    }
}
