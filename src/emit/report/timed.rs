//! "What was timed": each method's kind, kernel, description, baseline rule,
//! search and jobs; what the baseline means (for the builtin rule, the vLLM
//! release whose rule it copies); the timing protocol; the device; how to
//! read the tables.

use super::*;
use crate::manifest::BUILTIN_BASELINES;
use crate::store::{FailureClass, MethodRecord};

/// What `vllm_moe_default` is, checked against vLLM's source: the bf16/fp16
/// branch of `get_default_config` from the v0.17.0 release (the first with
/// this rule; v0.16.0 chose between two fixed configs by `M <= E`) to
/// v0.33.0; v0.33.0's per-tensor fp8 branch differs in BLOCK_SIZE_K only
/// (docs/peers.md), which the rule follows from 2026-12-02.
pub(super) const VLLM_MOE_DEFAULT: &str = "the config vLLM picks for a bf16/fp16 fused MoE on CUDA when it finds no tuned file for the shape (`get_default_config` in vllm/model_executor/layers/fused_moe/fused_moe.py), the same from vLLM v0.17.0 to v0.33.0 (releases up to v0.16 used a coarser rule); for per-tensor fp8 weights vLLM 0.33.0 takes BLOCK_SIZE_K 128 at every M, which the rule does from 2026-12-02 (each run's baseline configs are in its jobs)";

#[derive(Serialize)]
pub(super) struct Timed {
    methods: Table,
    bullets: Vec<String>,
}

/// A method's baseline, as the journal records it or as its configs show.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum BaselineRule {
    /// A builtin rule; `recorded`: named in the run header, else inferred.
    Builtin {
        name: String,
        recorded: bool,
    },
    /// A config the manifest writes out.
    Manifest,
    None,
}

impl BaselineRule {
    pub(super) fn short(&self) -> String {
        match self {
            BaselineRule::Builtin { name, recorded } if *recorded => format!("`{name}`"),
            BaselineRule::Builtin { name, .. } => format!("`{name}` (inferred)"),
            BaselineRule::Manifest => "the manifest's config".into(),
            BaselineRule::None => DASH.into(),
        }
    }

    /// `vLLM's default config`, `its manifest config`: for sentences.
    pub(super) fn phrase(&self) -> String {
        match self {
            BaselineRule::Builtin { name, .. } if name == "vllm_moe_default" => {
                "vLLM's default config".into()
            }
            BaselineRule::Builtin { name, .. } => format!("the `{name}` config"),
            BaselineRule::Manifest => "the manifest's baseline config".into(),
            BaselineRule::None => "no baseline".into(),
        }
    }
}

/// The method's record in the run header, if the journal has method records.
pub(super) fn record_in<'h>(
    header: &'h crate::store::RunHeader,
    method: &str,
) -> Option<&'h MethodRecord> {
    header.methods.iter().find(|m| m.name == method)
}

/// The baseline rule of a method: recorded, or inferred from its baseline
/// jobs' configs (journals from before method records).
pub(super) fn baseline_rule(a: &Analysis<'_, '_, '_>, method: &str) -> BaselineRule {
    if let Some(rec) = record_in(a.group.header, method) {
        return match rec.baseline.as_deref() {
            None => BaselineRule::None,
            Some("baseline") => BaselineRule::Manifest,
            Some(name) => BaselineRule::Builtin {
                name: name.to_string(),
                recorded: true,
            },
        };
    }
    let baseline_jobs: Vec<&JobRecord> = a
        .jobs
        .iter()
        .copied()
        .filter(|j| j.method == method && j.baseline)
        .collect();
    if baseline_jobs.is_empty() {
        return BaselineRule::None;
    }
    for name in BUILTIN_BASELINES {
        if baseline_jobs.iter().all(|j| follows_rule(name, j)) {
            return BaselineRule::Builtin {
                name: name.to_string(),
                recorded: false,
            };
        }
    }
    BaselineRule::Manifest
}

/// Whether a job's config is what a builtin rule gives at its shape.
fn follows_rule(rule: &str, job: &JobRecord) -> bool {
    let Some(exprs) = crate::manifest::builtin_baseline(rule) else {
        return false;
    };
    let env = crate::expr::environment();
    let ctx: serde_json::Map<String, Json> = job
        .shape
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    exprs.iter().all(|(param, source)| {
        let Some(have) = job.config.get(*param).and_then(Json::as_f64) else {
            return false;
        };
        crate::expr::eval_reference(&env, source, &ctx)
            .ok()
            .and_then(|v| v.to_json().as_f64())
            .is_some_and(|want| want == have)
    })
}

/// The jobs cell: status counts, and why a method's jobs were skipped.
fn jobs_cell(jobs: &[&JobRecord]) -> String {
    let mut text = status_counts(jobs);
    let reasons = distinct(
        jobs.iter()
            .filter(|j| j.status == JobStatus::Skipped)
            .filter_map(|j| j.failure.as_ref())
            .filter(|f| f.class == FailureClass::Unavailable)
            .map(|f| truncate(&f.message, 80)),
    );
    if !reasons.is_empty() {
        text.push_str(&format!(": unavailable ({})", reasons.join("; ")));
    }
    text
}

pub(super) fn timed(a: &Analysis<'_, '_, '_>) -> Timed {
    let h = a.group.header;
    let per_method = by_method(&a.jobs);
    let ships: Vec<&str> = h
        .outputs
        .iter()
        .filter(|o| {
            matches!(
                o.format,
                OutputFormat::VllmMoeJson
                    | OutputFormat::AiterFmoeCsv
                    | OutputFormat::TritonKernelsJson
                    | OutputFormat::TritonMbucket
            )
        })
        .filter_map(|o| o.method.as_deref())
        .collect();
    let mut rows = Vec::new();
    for (m, kind) in &a.methods {
        let jobs = per_method.get(m).cloned().unwrap_or_default();
        let rec = record_in(h, m);
        let kernel = rec
            .map(|r| r.kernel.clone())
            .or_else(|| jobs.first().map(|j| j.kernel.clone()))
            .unwrap_or_else(|| DASH.into());
        let description = match rec {
            Some(r) => r.description.clone().unwrap_or_else(|| DASH.into()),
            None => "not recorded (older journal)".into(),
        };
        let search = if jobs.iter().all(|j| j.config.is_empty()) {
            "one call, no configs".to_string()
        } else {
            rec.and_then(|r| r.search.as_ref())
                .map(|s| s.label())
                .unwrap_or_else(|| h.search.label())
        };
        let name = if ships.contains(m) {
            format!("**{m}** (tuned files)")
        } else {
            m.to_string()
        };
        rows.push(vec![
            cell(&name),
            cell(&format!("`{kernel}` ({})", kind.as_str())),
            cell(&truncate(&description, 120)),
            cell(&baseline_rule(a, m).short()),
            cell(&search),
            cell(&jobs_cell(&jobs)),
        ]);
    }
    let methods = Table::new(
        [
            "Method",
            "Kernel",
            "What it is",
            "Baseline",
            "Search",
            "Jobs",
        ]
        .map(String::from)
        .to_vec(),
        rows,
        &[0, 1, 2, 3, 4, 5],
    );

    let mut bullets = Vec::new();
    // What each baseline is.
    let mut explained: Vec<BaselineRule> = Vec::new();
    for (m, _) in &a.methods {
        let rule = baseline_rule(a, m);
        if rule == BaselineRule::None {
            continue;
        }
        let with: Vec<&str> = a
            .methods
            .iter()
            .map(|(n, _)| *n)
            .filter(|n| baseline_rule(a, n) == rule)
            .collect();
        match &rule {
            BaselineRule::Builtin { name, recorded } => {
                let key = BaselineRule::Builtin {
                    name: name.clone(),
                    recorded: *recorded,
                };
                if explained.contains(&key) {
                    continue;
                }
                explained.push(key);
                let what = if name == "vllm_moe_default" {
                    VLLM_MOE_DEFAULT.to_string()
                } else {
                    format!("the builtin rule `{name}`")
                };
                bullets.push(format!(
                    "**Baseline** `{name}` ({}): {what}. tunelab runs that config in each method's own kernel and call{}.",
                    with.join(", "),
                    if *recorded {
                        String::new()
                    } else {
                        "; this journal predates method records, so the rule is inferred: every baseline job's config is the rule's at its shape".into()
                    }
                ));
            }
            BaselineRule::Manifest => {
                let configs = distinct(
                    a.jobs
                        .iter()
                        .filter(|j| j.method == *m && j.baseline)
                        .map(|j| config_text(&j.config)),
                );
                bullets.push(format!(
                    "**Baseline** of {m}: the config the manifest gives{}.",
                    match configs.as_slice() {
                        [] => String::new(),
                        [one] => format!(", {one}"),
                        [first, ..] => format!(" (per shape; e.g. {first})"),
                    }
                ));
            }
            BaselineRule::None => {}
        }
    }
    bullets.push(protocol_bullet(a));
    bullets.push(device_bullet(a));
    bullets.push(legend_bullet(a));
    Timed { methods, bullets }
}

fn protocol_bullet(a: &Analysis<'_, '_, '_>) -> String {
    let h = a.group.header;
    let p = &h.protocol;
    if !a.gpu {
        let samples = if p.min_samples == p.max_samples {
            p.min_samples.to_string()
        } else {
            format!("{}–{}", p.min_samples, p.max_samples)
        };
        return format!(
            "**Timing**: interpreted, {samples} wall-clock samples a job; the times show the pipeline works, nothing about a GPU."
        );
    }
    let mut text = format!(
        "**Timing**: {}; {}–{} samples a job, until the median's 95 % CI is within ±{} %{} (caps: {} ms GPU, {} ms wall: CAP_HIT)",
        run_facts::timing_text(p.timing, p, h.device.l2_bytes),
        p.min_samples,
        p.max_samples,
        run_facts::trim_float(p.target_ci * 100.0),
        run_facts::race_text(p.race),
        run_facts::trim_float(p.max_gpu_ms),
        run_facts::trim_float(p.max_wall_ms),
    );
    if p.finalists > 0 {
        text.push_str(&format!(
            "; the best {} configs of each (shape, method) re-timed interleaved{}, and those times rank",
            p.finalists,
            run_facts::rest_text(p.retime_rest)
        ));
    }
    if !p.retime_with.is_empty() {
        text.push_str(&format!(
            "; finalists also re-timed under {} (summary)",
            p.retime_with
                .iter()
                .map(|t| t.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    text.push('.');
    text
}

fn device_bullet(a: &Analysis<'_, '_, '_>) -> String {
    let h = a.group.header;
    let d = &h.device;
    let fp = &h.fingerprint;
    let versions: Vec<String> = [
        ("driver", d.driver.clone().or_else(|| fp.driver.clone())),
        ("CUDA", fp.cuda.clone()),
        ("torch", fp.torch.clone()),
        ("Triton", fp.triton.clone()),
    ]
    .into_iter()
    .filter_map(|(k, v)| v.filter(|v| !v.is_empty()).map(|v| format!("{k} {v}")))
    .collect();
    let tunelab = match (&fp.tunelab, &fp.git_commit) {
        (t, Some(c)) if !t.is_empty() => format!("; tunelab {t} at `{}`", &c[..c.len().min(12)]),
        (t, None) if !t.is_empty() => format!("; tunelab {t}"),
        _ => String::new(),
    };
    if !a.gpu {
        return format!(
            "**Device**: Triton's interpreter on the CPU (TRITON_INTERPRET=1); {}{tunelab}.",
            versions.join(", ")
        );
    }
    let mut facts = vec![d.arch.clone(), format!("{} SMs", d.sm_count)];
    if d.peak_gbs > 0.0 {
        facts.push(format!("{} GB/s", num::rate(Some(d.peak_gbs))));
    }
    if d.peak_tflops_bf16 > 0.0 {
        facts.push(format!(
            "{} bf16 TFLOP/s dense",
            num::fixed(Some(d.peak_tflops_bf16), 1)
        ));
    }
    format!(
        "**Device**: {} ({}); {}{tunelab}.",
        d.name,
        facts.join(", "),
        versions.join(", ")
    )
}

fn legend_bullet(a: &Analysis<'_, '_, '_>) -> String {
    let mut parts = vec![
        "µs = the best median of each method (a finalist's interleaved re-timing where it has one), the fastest in bold".to_string(),
    ];
    if let Some(p) = a.primary {
        match a.reference {
            Reference::Baseline(b) if b == p => {
                parts.push(format!("speedup = baseline µs / {p} µs"));
            }
            Reference::None => {}
            _ => parts.push(format!("speedup = {} µs / {p} µs", a.reference_name())),
        }
        if a.gpu {
            parts.push(format!(
                "% of bound = max(flops / peak flops, bytes / peak bandwidth) / time, of {p}'s best"
            ));
        }
        parts.push(format!(
            "config = {p}'s best (BM×BN×BK, GM = GROUP_SIZE_M, w = warps, s = stages; \"= baseline\" where the baseline config is the best)"
        ));
    }
    let fixed = a.labels.fixed_text();
    if fixed.is_empty() {
        format!("**Tables**: {}.", parts.join("; "))
    } else {
        format!("**Tables** (every shape: {fixed}): {}.", parts.join("; "))
    }
}
