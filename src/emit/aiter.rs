//! `aiter_fmoe_csv`: rows of aiter's tuned fused-MoE table, `tuned_fmoe.csv`
//! (the file `AITER_CONFIG_FMOE` names): only rows aiter can use, and only
//! from a run on an AMD GPU.
//!
//! # How aiter reads the table
//!
//! From aiter's `aiter/fused_moe.py` (`fused_moe`, `get_padded_M`,
//! `get_2stage_cfgs`) and `aiter/jit/utils/chip_info.py`, as of 2026-08:
//!
//! - The batch's token count is padded before the lookup (`get_padded_M`):
//!   below 32768 to the next power of two (1 stays 1), from 32768 to 32768,
//!   and (newer aiter) from 131072 to 131072; a 131072 lookup that finds
//!   nothing tries 32768.
//! - A row is found by exact match on (gfx, cu_num, token, model_dim,
//!   inter_dim, expert, topk, act_type, dtype, q_dtype_a, q_dtype_w, q_type,
//!   use_g1u1, doweight_stage1): `cu_num` is the running GPU's compute-unit
//!   count, the dtypes are `str()` of torch dtypes (`torch.bfloat16`),
//!   `q_type` is `str()` of aiter's `QuantType` (`QuantType.No`). When no row
//!   matches, one that differs only in `act_type` is taken. Of duplicate
//!   rows the first wins.
//! - `gfx` is a column aiter added in 2026-06. A file without it (this one,
//!   like aiter's own table) has it filled in from `cu_num`: 256 → gfx950,
//!   80 and 304 → gfx942, any other count → the running GPU's arch.
//! - A found row dispatches by `block_m`, `ksplit`, `kernelName1`,
//!   `kernelName2` and `run_1stage`. `run_1stage=1` runs aiter's assembly
//!   one-stage kernel named by `kernelName1` (`fmoe_g1u1` in
//!   `csrc/py_itfs_cu/asm_fmoe.cu`, which takes int8, fp8, int4 or fp4
//!   inputs only: a bf16/fp16 input with `use_g1u1=1` is "unsupport current
//!   input type"); otherwise the two-stage path picks CK, FlyDSL, Opus or
//!   CK-tile kernels by the prefixes of `kernelName1`/`kernelName2`. A name
//!   aiter does not have makes the MoE call fail ("not find kernel"), not
//!   fall back.
//! - `us1`, `us2`, `us`, `err1`, `err2`, `tflops`, `bw` are not read for
//!   dispatch. aiter's merge of several tables (`AITER_CONFIG_FMOE=a:b`)
//!   keeps the row with the lowest `us` per key.
//!
//! # Which rows tunelab writes
//!
//! - **Only on an AMD GPU** (`device.backend == "hip"`). On any other device
//!   no row could ever be found (no AMD GPU has an H100's 132 SMs as its
//!   CU count, and aiter does not run there), so nothing is written and
//!   [`notes`] gives the one-line reason the run and `tunelab report` print.
//!   The output step goes on: the other outputs are written as usual.
//! - **Only for configs that name aiter's own two-stage kernels.** A row is
//!   written for a shape whose best config carries `kernelName1`,
//!   `kernelName2` (strings) and `block_m` (integer), optionally `ksplit`
//!   (integer, default 0) and `run_1stage` (must be 0): aiter's own columns,
//!   as a method that times aiter's `fused_moe` with a forced config records
//!   them. A one-stage config (`run_1stage` 1, or no `kernelName2`) is left
//!   out: for the bf16/fp16 shapes this format writes, aiter has no
//!   one-stage kernel.
//!   tunelab's Triton kernel (`fused_moe` of the `moe` problem) has no name
//!   aiter can dispatch, and no choice of columns makes aiter run it: a row
//!   naming it would make the MoE call fail. Its shapes get no row, and when
//!   no shape has one the file is not written (a note says why).
//! - **Only tokens aiter looks up.** A tuned M is written as `token` when it
//!   is a padded token itself: a power of two below 32768, or 32768, or
//!   131072. Other tuned M (24, 48, 96, 1536, 3072, ...) are left out and
//!   listed in the note: a row keyed 24 would never be read (aiter looks a
//!   batch of 24 up as 32), and filing M=24's config and time under 32 would
//!   claim a measurement that was not made (and win aiter's lowest-`us` merge
//!   against a real M=32 row by being faster).
//! - **Only bf16 and fp16 shapes.** Quantised shapes need `q_type` and the
//!   quantised torch dtypes (`torch.float8_e4m3fnuz` on gfx942), which shapes
//!   do not record; fp32 has no aiter fused-MoE path. Such shapes are left
//!   out and listed in the note.
//! - A GPU whose CU count aiter maps to another arch (256 CUs but not gfx950,
//!   80 or 304 CUs but not gfx942) gets nothing: aiter would file the rows
//!   under the wrong `gfx`.
//!
//! # Columns
//!
//! Header: [`HEADER`], aiter's own (newer aiter versions also have `xbf16`,
//! `gfx`, `flat` columns; aiter reads files without them). One row per
//! written shape, in shape order:
//!
//! | column | value |
//! | --- | --- |
//! | `cu_num` | the device's CU count |
//! | `token`, `model_dim`, `inter_dim`, `expert`, `topk` | shape fields `M`, `K`, `N`, `E`, `topk` |
//! | `act_type` | shape field `activation`: silu → `ActivationType.Silu`, gelu → `ActivationType.Gelu`, swiglu / swiglu_oai → `ActivationType.Swiglu`; no field → Silu |
//! | `dtype`, `q_dtype_a`, `q_dtype_w` | shape `dtype`: bf16 → `torch.bfloat16`, fp16 → `torch.float16` (no field → bf16); the same in all three |
//! | `q_type` | `QuantType.No` |
//! | `use_g1u1`, `doweight_stage1` | 1, 0 (gate and up in one weight; routing weights applied after stage 2) |
//! | `block_m`, `ksplit` | the config's `block_m`, `ksplit` (0 without one) |
//! | `kernelName1`, `kernelName2` | the config's |
//! | `run_1stage` | 0 |
//! | `us` | the chosen time of the whole call, µs, 4 decimals |
//! | `us1`, `us2` | empty: tunelab times the whole call, not each stage |
//! | `err1` | the correctness gate's mismatch fraction of the whole call as a percent (`0.1%`) |
//! | `err2` | empty |
//! | `tflops`, `bw` | TFLOP/s and GB/s of the chosen time, 2 decimals (aiter's tuner: `round(bytes / (us * 1e-6) / 1e9, 2)`) |
//! | `_tag` | empty |

use serde_json::Value as Json;

use super::csv_out::{csv_error, finish};
use super::num::{json_text, py_float};
use super::select::{self, json_int, Selection, ShapeFields, ShapeOutcome, Timed};
use super::{EmitError, Group};
use crate::device::DeviceInfo;
use crate::manifest::{MethodKind, OutputFormat};
use crate::store::{JobRecord, OutputSpec, Results};

pub const HEADER: &str = "cu_num,token,model_dim,inter_dim,expert,topk,act_type,dtype,q_dtype_a,q_dtype_w,q_type,use_g1u1,doweight_stage1,block_m,ksplit,us1,kernelName1,err1,us2,kernelName2,err2,us,run_1stage,tflops,bw,_tag";

/// The columns aiter finds a row by, in its order, less `gfx` (which this
/// format does not write; aiter derives it from `cu_num`).
pub const KEY_COLUMNS: [&str; 13] = [
    "cu_num",
    "token",
    "model_dim",
    "inter_dim",
    "expert",
    "topk",
    "act_type",
    "dtype",
    "q_dtype_a",
    "q_dtype_w",
    "q_type",
    "use_g1u1",
    "doweight_stage1",
];

/// Config fields a method needs to feed this format when no method is named:
/// the config names aiter's own kernels.
pub const REQUIRED: [&str; 2] = ["kernelName1", "block_m"];

/// The tiers aiter pads large token counts to (`_PADDED_M_TIERS`).
pub const TOKEN_TIERS: [i64; 2] = [32768, 131072];

/// The token aiter looks a batch of `m` tokens up under (`get_padded_M`).
pub fn padded_token(m: i64) -> i64 {
    if m < TOKEN_TIERS[0] {
        if m <= 1 {
            1
        } else {
            1i64 << (64 - (m - 1).leading_zeros())
        }
    } else if m >= TOKEN_TIERS[1] {
        TOKEN_TIERS[1]
    } else {
        TOKEN_TIERS[0]
    }
}

/// The arch aiter files a row of a table without a `gfx` column under, from
/// its `cu_num` (`gfx_from_cu_num`); `None`: the running GPU's arch.
pub fn gfx_from_cu_num(cu_num: i64) -> Option<&'static str> {
    match cu_num {
        256 => Some("gfx950"),
        80 | 304 => Some("gfx942"),
        _ => None,
    }
}

/// Why aiter could never read rows written on `device`, if it could not.
pub fn device_refusal(device: &DeviceInfo) -> Option<String> {
    if device.backend != "hip" {
        return Some(format!(
            "aiter runs on AMD GPUs and finds a row by the GPU's CU count and arch, and this run is on {} ({}), so no row from it would ever be read; run on an AMD GPU to write this file",
            device.name, device.backend
        ));
    }
    let arch = device.arch.split(':').next().unwrap_or_default();
    match gfx_from_cu_num(i64::from(device.sm_count)) {
        Some(gfx) if gfx != arch => Some(format!(
            "aiter files rows of a table without a `gfx` column under {gfx} when cu_num is {}, and this GPU ({}) is {arch}, so aiter would not find them",
            device.sm_count, device.name
        )),
        _ => None,
    }
}

/// The aiter kernels a config names.
#[derive(Debug, Clone, PartialEq)]
struct AiterKernels {
    kernel1: String,
    kernel2: String,
    block_m: i64,
    ksplit: i64,
}

/// What a config says about aiter kernels.
enum Named {
    /// No `kernelName1`: not an aiter kernel's config.
    Nothing,
    /// aiter's one-stage path.
    OneStage(String),
    TwoStages(AiterKernels),
}

fn aiter_kernels(job: &JobRecord) -> Result<Named, String> {
    let config = &job.config;
    let Some(kernel1) = config.get("kernelName1") else {
        return Ok(Named::Nothing);
    };
    let text = |field: &str, v: &Json| -> Result<String, String> {
        match v {
            Json::String(s) => Ok(s.trim().to_string()),
            Json::Null => Ok(String::new()),
            other => Err(format!(
                "`{field}` of job {} is {other}, not a kernel name",
                job.job_id
            )),
        }
    };
    let int = |field: &str| -> Result<Option<i64>, String> {
        match config.get(field) {
            None => Ok(None),
            Some(v) => json_int(v)
                .map(Some)
                .ok_or_else(|| format!("`{field}` of job {} is {v}, not an integer", job.job_id)),
        }
    };
    let kernel1 = text("kernelName1", kernel1)?;
    if kernel1.is_empty() {
        return Err(format!(
            "job {} has an empty `kernelName1`; aiter needs the kernel's name",
            job.job_id
        ));
    }
    let block_m = int("block_m")?.ok_or_else(|| {
        format!(
            "job {} names `kernelName1` but has no `block_m`; aiter sorts tokens in blocks of `block_m`",
            job.job_id
        )
    })?;
    let kernel2 = match config.get("kernelName2") {
        Some(v) => text("kernelName2", v)?,
        None => String::new(),
    };
    let one_stage = match int("run_1stage")? {
        None => kernel2.is_empty() || kernel2 == "Null",
        Some(0) => false,
        Some(1) => true,
        Some(other) => {
            return Err(format!(
                "`run_1stage` of job {} is {other}, not 0 or 1",
                job.job_id
            ))
        }
    };
    if one_stage {
        return Ok(Named::OneStage(kernel1));
    }
    if kernel2.is_empty() || kernel2 == "Null" {
        return Err(format!(
            "job {} runs two stages (`run_1stage` 0) but names no `kernelName2`",
            job.job_id
        ));
    }
    Ok(Named::TwoStages(AiterKernels {
        kernel1,
        kernel2,
        block_m,
        ksplit: int("ksplit")?.unwrap_or(0),
    }))
}

/// The key columns ([`KEY_COLUMNS`]) of the row a shape would get on
/// `device`, with `token` = the shape's `M` as it is. `Ok(Err(dtype))`: a
/// dtype no row can be written for (only bf16 and fp16 can). `Err`: the
/// shape lacks a field a row needs.
pub fn key_cells(
    device: &DeviceInfo,
    shape: &ShapeFields,
) -> Result<Result<[String; 13], String>, String> {
    let int = |field: &str| -> Result<i64, String> {
        shape
            .get(field)
            .and_then(json_int)
            .ok_or_else(|| format!("no integer field `{field}`"))
    };
    let (m, k, n, e, topk) = (int("M")?, int("K")?, int("N")?, int("E")?, int("topk")?);
    let text = |field: &str| shape.get(field).map(json_text);
    let act = match text("activation").as_deref() {
        None | Some("silu") => "ActivationType.Silu",
        Some("gelu") => "ActivationType.Gelu",
        Some("swiglu" | "swiglu_oai") => "ActivationType.Swiglu",
        Some(other) => {
            return Err(format!(
                "activation `{other}` has no aiter ActivationType (silu, gelu, swiglu, swiglu_oai)"
            ))
        }
    };
    let dtype = match text("dtype").as_deref() {
        None | Some("bf16") => "torch.bfloat16",
        Some("fp16") => "torch.float16",
        Some(other) => return Ok(Err(other.to_string())),
    };
    Ok(Ok([
        device.sm_count.to_string(),
        m.to_string(),
        k.to_string(),
        n.to_string(),
        e.to_string(),
        topk.to_string(),
        act.into(),
        dtype.into(),
        dtype.into(),
        dtype.into(),
        "QuantType.No".into(),
        "1".into(),
        "0".into(),
    ]))
}

/// The dispatch columns (`kernelName1`, `kernelName2`, `block_m`, `ksplit`)
/// a job's config gives a row, when it names aiter's two-stage kernels.
pub fn dispatch_cells(job: &JobRecord) -> Option<[String; 4]> {
    match aiter_kernels(job) {
        Ok(Named::TwoStages(k)) => Some([
            k.kernel1,
            k.kernel2,
            k.block_m.to_string(),
            k.ksplit.to_string(),
        ]),
        _ => None,
    }
}

/// Why a shape with a best gets no row.
#[derive(Debug, Clone, PartialEq)]
enum LeftOut {
    /// Its best config names no aiter kernel.
    NoAiterKernel { method: String, kernel: String },
    /// aiter never looks this token count up.
    NotLookedUp { m: i64, padded: i64 },
    /// A dtype aiter's rows need more than the shape records for, or one aiter has no path for.
    Dtype(String),
    /// A one-stage config: aiter has no one-stage kernel for bf16/fp16 with `use_g1u1=1`.
    OneStage(String),
}

/// One shape's row, ready to write.
struct Row<'a> {
    cells: [String; 13],
    best: Timed<'a>,
    kernels: AiterKernels,
}

enum Planned<'a> {
    Row(Box<Row<'a>>),
    LeftOut(LeftOut),
}

/// Plans every shape with a best. Errors are data errors (a shape without
/// a field the row needs, an activation aiter has no type for).
fn plan<'a>(device: &DeviceInfo, shapes: &[&ShapeOutcome<'a>]) -> Result<Vec<Planned<'a>>, String> {
    let mut out = Vec::new();
    for shape in shapes {
        let Some((_, best)) = shape.overall_best() else {
            continue;
        };
        let cells = match key_cells(device, shape.shape)
            .map_err(|m| format!("shape {}: {m}", shape.key))?
        {
            Ok(cells) => cells,
            Err(dtype) => {
                out.push(Planned::LeftOut(LeftOut::Dtype(dtype)));
                continue;
            }
        };
        let m: i64 = cells[1].parse().expect("key_cells writes M as an integer");
        let kernels = match aiter_kernels(best.job)? {
            Named::TwoStages(k) => k,
            Named::Nothing => {
                out.push(Planned::LeftOut(LeftOut::NoAiterKernel {
                    method: best.job.method.clone(),
                    kernel: best.job.kernel.clone(),
                }));
                continue;
            }
            Named::OneStage(kernel) => {
                out.push(Planned::LeftOut(LeftOut::OneStage(kernel)));
                continue;
            }
        };
        let padded = padded_token(m);
        if padded != m {
            out.push(Planned::LeftOut(LeftOut::NotLookedUp { m, padded }));
            continue;
        }
        out.push(Planned::Row(Box::new(Row {
            cells,
            best,
            kernels,
        })));
    }
    Ok(out)
}

pub fn render(group: &Group<'_, '_>) -> Result<Option<String>, EmitError> {
    let device = &group.header.device;
    if device_refusal(device).is_some() {
        return Ok(None);
    }
    let planned = plan(device, &group.shapes).map_err(|m| group.data_error(m))?;
    let rows: Vec<&Row<'_>> = planned
        .iter()
        .filter_map(|p| match p {
            Planned::Row(r) => Some(r.as_ref()),
            Planned::LeftOut(_) => None,
        })
        .collect();
    if rows.is_empty() {
        return Ok(None);
    }
    check_one_row_per_shape(group, &rows)?;
    let mut w = csv::WriterBuilder::new()
        .terminator(csv::Terminator::Any(b'\n'))
        .from_writer(Vec::new());
    w.write_record(HEADER.split(','))
        .map_err(|e| csv_error(group, e))?;
    for row in rows {
        let k = &row.kernels;
        let us = py_float(row.best.time_us(), 4);
        let err = percent(
            row.best
                .job
                .check
                .as_ref()
                .map(|c| c.mismatch_frac)
                .unwrap_or(0.0),
        );
        let mut record: Vec<String> = row.cells.to_vec();
        record.extend([
            k.block_m.to_string(),
            k.ksplit.to_string(),
            String::new(),
            k.kernel1.clone(),
            err,
            String::new(),
            k.kernel2.clone(),
            String::new(),
            us,
            "0".into(),
            py_float(row.best.tflops().unwrap_or(0.0), 2),
            py_float(row.best.gbs().unwrap_or(0.0), 2),
            String::new(),
        ]);
        w.write_record(&record).map_err(|e| csv_error(group, e))?;
    }
    finish(group, w).map(Some)
}

/// Where `act_type` sits among the key cells.
const ACT_TYPE_CELL: usize = 6;

/// One row per lookup key, `act_type` left out. aiter (since its change
/// #4394) never matches a row's `act_type` (the key holds a pybind enum, the
/// table a string) and takes the first row of the shape whatever its
/// activation; and on duplicate keys it rewrites the source tables, deleting
/// the slower rows, and raises. Two rows that differ only in `act_type` (or
/// not at all) would therefore be wrong, or fatal, in aiter: refused, naming
/// the shapes.
fn check_one_row_per_shape(group: &Group<'_, '_>, rows: &[&Row<'_>]) -> Result<(), EmitError> {
    let mut seen: std::collections::HashMap<Vec<&str>, &Row<'_>> = std::collections::HashMap::new();
    for row in rows {
        let key: Vec<&str> = row
            .cells
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != ACT_TYPE_CELL)
            .map(|(_, c)| c.as_str())
            .collect();
        if let Some(first) = seen.insert(key, row) {
            return Err(group.data_error(format!(
                "shapes {} and {} give aiter one lookup key ({} and {} act_type): aiter matches no act_type and takes the first row of a shape, and on duplicate keys it rewrites its tables and raises; write them to separate files (put the field that differs in the path)",
                select::shape_key(&first.best.job.shape),
                select::shape_key(&row.best.job.shape),
                first.cells[ACT_TYPE_CELL],
                row.cells[ACT_TYPE_CELL]
            )));
        }
    }
    Ok(())
}

/// A fraction as aiter spells errors: Python's `f"{x:.1%}"`.
fn percent(frac: f64) -> String {
    if frac.is_finite() {
        format!("{:.1}%", frac * 100.0)
    } else {
        "100.0%".into()
    }
}

/// Whether a job feeds an aiter_fmoe_csv output: the rule of `emit::feeds`
/// (the named method, else every non-torch method whose configs carry
/// [`REQUIRED`]).
fn feeds(spec: &OutputSpec, job: &JobRecord) -> bool {
    match &spec.method {
        Some(m) => &job.method == m,
        None => {
            job.kind != MethodKind::Torch && REQUIRED.iter().all(|f| job.config.contains_key(*f))
        }
    }
}

/// One line per output of the run that is read by aiter and is not written,
/// or written without some of its shapes, saying why: what `tunelab run` and
/// `tunelab report` print after writing outputs: `aiter_fmoe_csv`, by this
/// module's rules.
pub fn notes(results: &Results) -> Vec<String> {
    let Some(header) = &results.header else {
        return Vec::new();
    };
    let device = &header.device;
    let mut notes = Vec::new();
    for spec in header
        .outputs
        .iter()
        .filter(|o| o.format == OutputFormat::AiterFmoeCsv)
    {
        let what = format!("{} `{}`", spec.format.name(), spec.path);
        if let Some(why) = device_refusal(device) {
            notes.push(format!("{what} not written: {why}"));
            continue;
        }
        let sel = Selection::build(results, |j| feeds(spec, j));
        let shapes: Vec<&ShapeOutcome<'_>> = sel.shapes.iter().collect();
        // A data error is the writer's to report.
        let Ok(planned) = plan(device, &shapes) else {
            continue;
        };
        if let Some(note) = left_out_note(&what, &planned) {
            notes.push(note);
        }
    }
    notes
}

fn left_out_note(what: &str, planned: &[Planned<'_>]) -> Option<String> {
    let written = planned
        .iter()
        .filter(|p| matches!(p, Planned::Row(_)))
        .count();
    let left: Vec<&LeftOut> = planned
        .iter()
        .filter_map(|p| match p {
            Planned::LeftOut(l) => Some(l),
            Planned::Row(_) => None,
        })
        .collect();
    if left.is_empty() {
        return None;
    }
    let mut why: Vec<String> = Vec::new();
    let mut kernels: Vec<String> = Vec::new();
    let mut no_kernel = 0;
    let mut not_looked_up: Vec<String> = Vec::new();
    let mut dtypes: Vec<String> = Vec::new();
    let mut dtype_shapes = 0;
    let mut one_stage: Vec<String> = Vec::new();
    for l in &left {
        match l {
            LeftOut::NoAiterKernel { method, kernel } => {
                no_kernel += 1;
                let k = format!("`{kernel}` of method `{method}`");
                if !kernels.contains(&k) {
                    kernels.push(k);
                }
            }
            LeftOut::NotLookedUp { m, padded } => {
                let s = format!("M={m} (looked up as {padded})");
                if !not_looked_up.contains(&s) {
                    not_looked_up.push(s);
                }
            }
            LeftOut::Dtype(d) => {
                dtype_shapes += 1;
                if !dtypes.contains(d) {
                    dtypes.push(d.clone());
                }
            }
            LeftOut::OneStage(k) => {
                let k = format!("`{k}`");
                if !one_stage.contains(&k) {
                    one_stage.push(k);
                }
            }
        }
    }
    if no_kernel > 0 {
        why.push(format!(
            "{no_kernel} shape(s) whose best config names no aiter kernel ({}): aiter dispatches rows only to its own kernels, by `kernelName1`/`kernelName2`, and fails the MoE call on any other name",
            kernels.join(", ")
        ));
    }
    if !not_looked_up.is_empty() {
        why.push(format!(
            "{}: aiter pads a batch's token count to the next power of two before the lookup, so a row keyed by this M would never be read",
            not_looked_up.join(", ")
        ));
    }
    if dtype_shapes > 0 {
        why.push(format!(
            "{dtype_shapes} shape(s) of dtype {}: a row needs aiter's quantisation columns, which shapes do not record (bf16 and fp16 only)",
            dtypes.join(", ")
        ));
    }
    if !one_stage.is_empty() {
        why.push(format!(
            "{} shape(s) whose best config is aiter's one-stage path ({}): aiter's one-stage kernels take int8, fp8, int4 or fp4 inputs, not bf16/fp16 with gate and up in one weight",
            left.iter().filter(|l| matches!(l, LeftOut::OneStage(_))).count(),
            one_stage.join(", ")
        ));
    }
    Some(if written == 0 {
        format!(
            "{what} not written: no row aiter could use; left out {}",
            why.join("; ")
        )
    } else {
        format!(
            "{what}: {written} row(s) written; left out {}",
            why.join("; ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_pad_as_aiter_pads_them() {
        let cases = [
            (1, 1),
            (2, 2),
            (3, 4),
            (24, 32),
            (32, 32),
            (33, 64),
            (1536, 2048),
            (3072, 4096),
            (16384, 16384),
            (16385, 32768),
            (32767, 32768),
            (32768, 32768),
            (100_000, 32768),
            (131072, 131072),
            (500_000, 131072),
        ];
        for (m, padded) in cases {
            assert_eq!(padded_token(m), padded, "M={m}");
        }
    }

    #[test]
    fn only_amd_devices_get_rows() {
        let h100 = crate::device::profile("h100").unwrap();
        assert!(device_refusal(&h100)
            .unwrap()
            .contains("NVIDIA H100 80GB HBM3 (cuda)"));
        let cpu = crate::device::profile("cpu").unwrap();
        assert!(device_refusal(&cpu).is_some());
        let mut mi300x = h100.clone();
        mi300x.backend = "hip".into();
        mi300x.arch = "gfx942".into();
        mi300x.sm_count = 304;
        assert_eq!(device_refusal(&mi300x), None);
        // 256 CUs is filed under gfx950 by aiter: a gfx1250 with 256 CUs would be misfiled.
        let mut other = mi300x.clone();
        other.arch = "gfx1250".into();
        other.sm_count = 256;
        assert!(device_refusal(&other).unwrap().contains("gfx950"));
        other.sm_count = 128;
        assert_eq!(device_refusal(&other), None);
    }
}
