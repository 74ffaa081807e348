//! `triton_mbucket`: aiter's Triton GEMM configs, keyed by M bucket, one
//! JSON object per rendered path: the file aiter loads the tuned configs of
//! one (N, K) GEMM from.
//!
//! # Which files, under which names
//!
//! aiter reads these files on AMD GPUs. On any other device the file is the
//! same M-bucket JSON, written where the manifest's path says, for the
//! user's own Triton code (aiter never opens it there, so its naming and
//! field rules are not checked; the manifests name it as aiter would, with
//! the device's arch, e.g. `sm_90-GEMM-A16W16-N=5120-K=2880.json`).
//!
//! On an AMD GPU the rendered file name must be the one aiter opens
//! (aiter `aiter/ops/triton/utils/gemm_config_utils.py`, `get_gemm_config`,
//! called as `get_gemm_config("GEMM-A16W16", M, N, K)` by `gemm_a16w16`):
//! `{arch}-GEMM-{family}-N={N}-K={K}.json`, in aiter's
//! `aiter/ops/triton/configs/gemm/` directory, where
//!
//! - `arch` is the arch Triton reports for the GPU: HIP's `gcnArchName`
//!   without its `:feature` suffixes (`gfx942`, not `gfx942:sramecc+:xnack-`).
//!   HIP discovery already strips the suffixes, so the template field is
//!   `{{device.arch}}`; the writer checks against the name up to the first `:`.
//! - `family` follows the shapes' dtype: bf16 and fp16 GEMMs read
//!   `A16W16` (no dtype field: fp16, the `gemm` problem's default); fp8
//!   GEMMs with block scales (the `gemm` problem's a8w8 block-scale GEMM)
//!   read `A8W8_BLOCKSCALE` (`gemm_a8w8_blockscale` calls
//!   `get_gemm_config("GEMM-A8W8_BLOCKSCALE", M, N, K)`); other dtypes have
//!   no aiter family tunelab's configs fit, and are an error.
//! - `N`, `K` are the shapes'; every shape of one file has the same N, K and family.
//!
//! The usual template is `triton/{{device.arch}}-GEMM-A16W16-N={{N}}-K={{K}}.json`
//! (`...-GEMM-A8W8_BLOCKSCALE-...` for fp8).
//! A path whose file name differs is an error at render: aiter would never
//! open the file. (Newer aiter also reads a nested layout,
//! `{arch}/triton/gemm/gemm_a16w16/GEMM-A16W16-N=..-K=..json`, but only for
//! families that ship a `DEFAULT.json` there; gfx942/gfx950 `GEMM-A16W16`
//! still load from the flat `gemm/` directory, as of 2026-08.)
//!
//! With `keys: legacy` the name is the one aiter's loaders of that era (before
//! 2025-12) opened: the device name aiter derived from the arch instead of
//! the arch, `MI300X` for gfx942 and `MI350X` for gfx950.
//!
//! Each config must be one aiter's kernel launches: it passes the config as
//! keyword arguments, so every field must be one of [`AITER_A16W16_FIELDS`]
//! (Triton rejects any other; `_gemm_a8w8_blockscale_kernel` takes the same
//! ones), and `BLOCK_SIZE_M`, `BLOCK_SIZE_N`, `BLOCK_SIZE_K` and
//! `GROUP_SIZE_M` must be there. `gemm_a8w8_blockscale` also reads
//! `NUM_KSPLIT` from the config (a config without it fails there) and
//! asserts that `BLOCK_SIZE_K` equals the scale block's K (`GROUP_K`, the
//! shape's `block_shape[1]`, 128 by default). The values are tunelab's
//! kernel's best; aiter runs them in its own kernel, whose parameters mean
//! the same tiles.
//!
//! # Content
//!
//! Each value is every config field of the best job, as recorded (integers
//! stay integers). 4-space indentation, trailing newline.
//!
//! Current scheme (`get_gemm_config`: `M_LEQ_x` searched ascending over its
//! standard bounds, then `M_GEQ_x` descending over the same bounds, then
//! `any`):
//!
//! - a tuned M goes to `M_LEQ_x` for the smallest x in 1, 4, 8, 16, 32, 64,
//!   128, 256, 512, 1024, 2048, 4096, 8192 with M <= x (aiter before
//!   2026-08 had no bound 1: it reads M=1 from `M_LEQ_4`);
//! - a tuned M above 8192 goes to `M_GEQ_8192`. (Not `M_GEQ_<that M>`:
//!   aiter only looks up `M_GEQ_x` for x among its standard bounds, so any
//!   other x would never be read.)
//! - when several tuned Ms land in one bucket, the bucket holds the config of
//!   the largest of them (the bucket's upper edge is what it serves): a
//!   batch of 24 rows is served the config tuned at 32 when both were tuned;
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

use super::num::json_text;
use super::select::json_int;
use super::vllm::to_json_indent4;
use super::{EmitError, Group};
use crate::device::DeviceInfo;

/// The config fields aiter's `_gemm_a16_w16_kernel` accepts: its
/// meta-parameters and the AMD Triton backend's launch options.
pub const AITER_A16W16_FIELDS: [&str; 11] = [
    "BLOCK_SIZE_M",
    "BLOCK_SIZE_N",
    "BLOCK_SIZE_K",
    "GROUP_SIZE_M",
    "NUM_KSPLIT",
    "cache_modifier",
    "num_warps",
    "num_stages",
    "waves_per_eu",
    "matrix_instr_nonkdim",
    "kpack",
];

/// The fields the kernel has no default for.
const AITER_A16W16_REQUIRED: [&str; 4] = [
    "BLOCK_SIZE_M",
    "BLOCK_SIZE_N",
    "BLOCK_SIZE_K",
    "GROUP_SIZE_M",
];

/// The arch aiter names files by on `device`: HIP's `gcnArchName` up to its
/// first `:`. `None` off AMD GPUs, where aiter does not run.
pub fn aiter_arch(device: &DeviceInfo) -> Option<&str> {
    (device.backend == "hip").then(|| device.arch.split(':').next().unwrap_or_default())
}

/// aiter's config family for a GEMM of this shape dtype: `A16W16` for bf16
/// and fp16 (no dtype: fp16, the `gemm` problem's default), `A8W8_BLOCKSCALE`
/// for fp8 (the `gemm` problem's fp8 GEMM has block scales).
pub fn gemm_family(dtype: Option<&str>) -> Result<&'static str, String> {
    match dtype {
        None | Some("bf16" | "fp16") => Ok("A16W16"),
        Some("fp8") => Ok("A8W8_BLOCKSCALE"),
        Some(other) => Err(format!(
            "dtype `{other}` has no aiter GEMM config family these configs fit (bf16 and fp16 GEMMs read `GEMM-A16W16` files, fp8 block-scale GEMMs `GEMM-A8W8_BLOCKSCALE`)"
        )),
    }
}

/// The scale block's K of an fp8 block-scale GEMM shape (`block_shape[1]`, default 128).
fn scale_block_k(shape: &super::select::ShapeFields) -> Option<i64> {
    match shape.get("block_shape") {
        None => Some(128),
        Some(Json::Array(items)) if items.len() == 2 => json_int(&items[1]),
        Some(_) => None,
    }
}

/// The name aiter's loaders before 2025-12 gave the arch in file names.
fn legacy_device(arch: &str) -> Option<&'static str> {
    match arch {
        "gfx942" => Some("MI300X"),
        "gfx950" => Some("MI350X"),
        _ => None,
    }
}

/// The file name aiter opens for the tuned configs of an (N, K) GEMM.
pub fn file_name(prefix: &str, family: &str, n: i64, k: i64) -> String {
    format!("{prefix}-GEMM-{family}-N={n}-K={k}.json")
}

/// Checks that aiter would open the group's file for its shapes, and that
/// its configs are ones aiter's kernel launches.
fn check_aiter(group: &Group<'_, '_>, arch: &str) -> Result<(), EmitError> {
    let prefix = if group.spec.legacy_keys {
        legacy_device(arch).ok_or_else(|| {
            group.data_error(format!(
                "aiter's loaders that read legacy keys named files after MI300X (gfx942) or MI350X (gfx950) and knew no other arch, and this GPU is {arch}; drop `keys: legacy`"
            ))
        })?
    } else {
        arch
    };
    let mut expected: Option<(String, &str, &str)> = None;
    for shape in &group.shapes {
        let int = |field: &str| {
            shape.shape.get(field).and_then(json_int).ok_or_else(|| {
                group.data_error(format!(
                    "shape {} has no integer field `{field}`",
                    shape.key
                ))
            })
        };
        let dtype = shape.shape.get("dtype").map(json_text);
        let family = gemm_family(dtype.as_deref())
            .map_err(|m| group.data_error(format!("shape {}: {m}", shape.key)))?;
        let name = file_name(prefix, family, int("N")?, int("K")?);
        match &expected {
            None => expected = Some((name, shape.key.as_str(), family)),
            Some((first, first_key, _)) if *first != name => {
                return Err(group.data_error(format!(
                    "shapes {first_key} and {} belong in different aiter files ({first} and {name}); put N, K and the dtype's family in the path",
                    shape.key
                )))
            }
            Some(_) => {}
        }
    }
    let file = std::path::Path::new(&group.path)
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    if let Some((name, _, family)) = expected {
        if file != name {
            return Err(group.data_error(format!(
                "aiter opens `{name}` for these shapes ({{arch}}-GEMM-{{family}}-N={{N}}-K={{K}}.json, get_gemm_config), never `{file}`; write the path as `triton/{{{{device.arch}}}}-GEMM-{family}-N={{{{N}}}}-K={{{{K}}}}.json`"
            )));
        }
    }
    for shape in &group.shapes {
        let Some((_, best)) = shape.overall_best() else {
            continue;
        };
        let config = &best.job.config;
        if shape.shape.get("dtype").map(json_text).as_deref() == Some("fp8") {
            check_a8w8_blockscale(group, shape.shape, &shape.key, best.job)?;
        }
        if let Some(field) = config
            .keys()
            .find(|k| !AITER_A16W16_FIELDS.contains(&k.as_str()))
        {
            return Err(group.data_error(format!(
                "the best config of shape {} (job {}) has `{field}`, which aiter's GEMM kernel does not take (it takes {}); a config with it would fail there",
                shape.key,
                best.job.job_id,
                AITER_A16W16_FIELDS.join(", ")
            )));
        }
        if let Some(field) = AITER_A16W16_REQUIRED
            .iter()
            .find(|f| !config.contains_key(**f))
        {
            return Err(group.data_error(format!(
                "the best config of shape {} (job {}) has no `{field}`, which aiter's GEMM kernel needs",
                shape.key, best.job.job_id
            )));
        }
    }
    Ok(())
}

/// What `gemm_a8w8_blockscale` needs of a config beyond the common fields:
/// `NUM_KSPLIT` (read from the config directly) and `BLOCK_SIZE_K` equal to
/// the scale block's K (asserted).
fn check_a8w8_blockscale(
    group: &Group<'_, '_>,
    shape: &super::select::ShapeFields,
    key: &str,
    job: &crate::store::JobRecord,
) -> Result<(), EmitError> {
    let config = &job.config;
    if !config.contains_key("NUM_KSPLIT") {
        return Err(group.data_error(format!(
            "the best config of shape {key} (job {}) has no `NUM_KSPLIT`, which aiter's gemm_a8w8_blockscale reads from every config",
            job.job_id
        )));
    }
    let group_k = scale_block_k(shape).ok_or_else(|| {
        group.data_error(format!(
            "shape {key}: `block_shape` is not a list of two integers [block_n, block_k]"
        ))
    })?;
    let block_k = config.get("BLOCK_SIZE_K").and_then(json_int);
    if block_k != Some(group_k) {
        return Err(group.data_error(format!(
            "the best config of shape {key} (job {}) has BLOCK_SIZE_K {}, and aiter's gemm_a8w8_blockscale asserts BLOCK_SIZE_K equals the scale block's K ({group_k}); tune BLOCK_SIZE_K: [{group_k}] for aiter's files",
            job.job_id,
            block_k.map_or("none".to_string(), |b| b.to_string())
        )));
    }
    Ok(())
}

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

/// Bucket key -> config, in file order, from tuned M -> config (or
/// whatever stands for a tuned M's winner: the `aot` output's candidates).
pub fn buckets<T: Clone>(tuned: &BTreeMap<i64, T>, legacy: bool) -> IndexMap<String, T> {
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
        let mut by_key: BTreeMap<usize, (String, &T)> = BTreeMap::new();
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
    // Only aiter's own GPUs hold it to aiter's names and fields.
    if let Some(arch) = aiter_arch(&group.header.device) {
        check_aiter(group, arch)?;
    }
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
