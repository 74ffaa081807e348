//! "What was timed": each method's kind, kernel, what it is (a short name,
//! and what sets it apart from the methods that share its kernel), baseline
//! rule, search and jobs; each kernel's whole description once; what the
//! baseline means (for the builtin rule, the vLLM release whose rule it
//! copies); the timing protocol; the device; how to read the tables.

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
            BaselineRule::Builtin { name, .. } if name == "vllm_triton_kernels_sm90" => {
                "vLLM's triton_kernels setting".into()
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

/// The builtin rule a method's baseline is: named in the run header,
/// inferred for an old journal, or a config the manifest writes out that is
/// the rule's at every baseline job's shape (gptoss-mxfp4's triton_kernels
/// baseline is `vllm_triton_kernels_sm90` written out).
pub(super) fn baseline_rule_name(a: &Analysis<'_, '_, '_>, method: &str) -> Option<String> {
    match baseline_rule(a, method) {
        BaselineRule::Builtin { name, .. } => Some(name),
        BaselineRule::None => None,
        BaselineRule::Manifest => {
            let jobs: Vec<&JobRecord> = a
                .jobs
                .iter()
                .copied()
                .filter(|j| j.method == method && j.baseline)
                .collect();
            BUILTIN_BASELINES
                .iter()
                .find(|rule| !jobs.is_empty() && jobs.iter().all(|j| follows_rule(rule, j)))
                .map(|rule| rule.to_string())
        }
    }
}

/// Whether every baseline job of a method has the config a builtin rule
/// gives at its shape today (a journal from before a rule changed does not).
pub(super) fn baseline_follows(a: &Analysis<'_, '_, '_>, method: &str, rule: &str) -> bool {
    let mut jobs = a
        .jobs
        .iter()
        .filter(|j| j.method == method && j.baseline)
        .peekable();
    jobs.peek().is_some() && jobs.all(|j| follows_rule(rule, j))
}

/// Whether a job's config is what a builtin rule gives at its shape.
fn follows_rule(rule: &str, job: &JobRecord) -> bool {
    let Some(exprs) = crate::manifest::builtin_baseline(rule) else {
        return false;
    };
    let ctx: serde_json::Map<String, Json> = job
        .shape
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    exprs.iter().all(|(param, source)| {
        let Some(have) = job.config.get(*param).and_then(Json::as_f64) else {
            return false;
        };
        crate::expr::evaluate(source, &ctx)
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

/// Whether a description is visibly cut short: its brackets or backticks
/// left open, or it ends inside a clause. Workers before 2026-12 recorded
/// the first line of a wrapped docstring.
fn looks_cut(description: &str) -> bool {
    let text = description.trim_end();
    let mut depth = 0i32;
    for c in text.chars() {
        match c {
            '(' | '[' => depth += 1,
            ')' | ']' => depth -= 1,
            _ => {}
        }
    }
    depth > 0 || text.matches('`').count() % 2 == 1 || text.ends_with([':', ',', ';'])
}

/// A description's whole text as the report prints it once, as a sentence:
/// an older worker's cut one marked as such.
fn whole(description: &str) -> String {
    let text = description.split_whitespace().collect::<Vec<_>>().join(" ");
    if looks_cut(&text) {
        format!("{text} … (the worker that ran it kept the first line of its description only).")
    } else if text.ends_with(['.', '!', '?']) {
        text
    } else {
        format!("{text}.")
    }
}

/// The short name of a description, for tables: its text up to the first
/// bracket, colon, semicolon, comma or full stop outside backticks (the
/// whole text when there is none).
fn short_name(description: &str) -> String {
    let text = description.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut quoted = false;
    for (i, c) in text.char_indices() {
        match c {
            '`' => quoted = !quoted,
            ' ' if !quoted && text[i + 1..].starts_with('(') => return text[..i].to_string(),
            ':' | ';' | ',' if !quoted => return text[..i].to_string(),
            '.' if !quoted && text[i + 1..].starts_with(' ') => return text[..i].to_string(),
            _ => {}
        }
    }
    text.trim_end_matches('.').to_string()
}

/// The values each config key takes over a method's jobs, in the order the
/// configs name the keys (a method's fixed parameters first).
fn key_values<'j>(jobs: &[&'j JobRecord]) -> indexmap::IndexMap<&'j str, Vec<&'j Json>> {
    let mut out: indexmap::IndexMap<&str, Vec<&Json>> = indexmap::IndexMap::new();
    for j in jobs {
        for (k, v) in &j.config {
            let values = out.entry(k.as_str()).or_default();
            if !values.contains(&v) {
                values.push(v);
            }
        }
    }
    for values in out.values_mut() {
        values.sort_by(|x, y| match (x.as_f64(), y.as_f64()) {
            (Some(x), Some(y)) => x.total_cmp(&y),
            _ => x.to_string().cmp(&y.to_string()),
        });
    }
    out
}

/// What sets `method` apart from the other methods of its kernel: each key
/// it holds at one value that some other method does not hold at that value
/// alone, and each key some other method lacks (when it takes at most four
/// values). `DOT_SCALED=0, MX_PTX=1`, `GEMV ∈ {1, 2}`.
fn set_apart(
    method: &str,
    siblings: &[&str],
    per_method: &HashMap<&str, Vec<&JobRecord>>,
) -> String {
    let empty = Vec::new();
    let values = |m: &str| key_values(per_method.get(m).unwrap_or(&empty));
    let mine = values(method);
    let others: Vec<_> = siblings
        .iter()
        .filter(|s| **s != method)
        .map(|s| values(s))
        .collect();
    mine.iter()
        .filter(|(k, v)| {
            let constant_here = v.len() == 1 && others.iter().any(|o| o.get(*k) != Some(*v));
            let missing_there = v.len() <= 4 && others.iter().any(|o| !o.contains_key(*k));
            constant_here || missing_there
        })
        .map(|(k, v)| match v.as_slice() {
            [one] => format!("{k}={}", num::json_text(one)),
            many => format!(
                "{k} ∈ {{{}}}",
                many.iter()
                    .map(|x| num::json_text(x))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

pub(super) fn timed(a: &Analysis<'_, '_, '_>) -> Timed {
    let h = a.group.header;
    let per_method = by_method(&a.jobs);
    let kernel_of = |m: &str| -> String {
        record_in(h, m)
            .map(|r| r.kernel.clone())
            .or_else(|| {
                per_method
                    .get(m)
                    .and_then(|j| j.first())
                    .map(|j| j.kernel.clone())
            })
            .unwrap_or_else(|| DASH.into())
    };
    let mut descriptions: Vec<(String, String)> = Vec::new();
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
        let kernel = kernel_of(m);
        let mut what = match rec.and_then(|r| r.description.as_deref()) {
            Some(d) => {
                if !descriptions.iter().any(|(k, _)| *k == kernel) {
                    descriptions.push((kernel.clone(), whole(d)));
                }
                short_name(d)
            }
            None if rec.is_some() => DASH.into(),
            None => "not recorded (older journal)".into(),
        };
        let siblings: Vec<&str> = a
            .methods
            .iter()
            .map(|(n, _)| *n)
            .filter(|n| kernel_of(n) == kernel)
            .collect();
        if siblings.len() > 1 {
            let apart = set_apart(m, &siblings, &per_method);
            if !apart.is_empty() {
                what.push_str(&format!(", with {apart}"));
            }
        }
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
            cell(&what),
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
    if !descriptions.is_empty() {
        bullets.push(format!(
            "**What the kernels are**: {}",
            descriptions
                .iter()
                .map(|(k, d)| format!("`{k}`: {d}"))
                .collect::<Vec<_>>()
                .join(" ")
        ));
    }
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
                } else if let Some(what) = with
                    .first()
                    .and_then(|w| record_in(a.group.header, w))
                    .and_then(|r| crate::manifest::consumer_runs(name, &r.kernel))
                {
                    what.to_string()
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
                let kernel = record_in(a.group.header, m)
                    .map(|r| r.kernel.clone())
                    .unwrap_or_default();
                let rule = baseline_rule_name(a, m)
                    .map(|r| match crate::manifest::consumer_runs(&r, &kernel) {
                        Some(what) => format!(": `{r}`, {what}"),
                        None => format!(": the builtin rule `{r}`"),
                    })
                    .unwrap_or_default();
                bullets.push(format!(
                    "**Baseline** of {m}: the config the manifest gives{}{rule}.",
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_name_ends_at_the_first_bracket_or_clause_and_never_inside_backticks() {
        let fused = "Our Triton fused MoE (tunelab.kernels.fused_moe; quantised weights: tunelab.kernels.quant_moe), vLLM-style config.";
        assert_eq!(short_name(fused), "Our Triton fused MoE");
        assert_eq!(
            short_name("torch.matmul (cuBLAS on GPU) writing into the preallocated output."),
            "torch.matmul"
        );
        assert_eq!(
            short_name("CUDA kernel `mxfp4_moe_gemv` (mxfp4_moe_gemv.cu), compiled with NVRTC"),
            "CUDA kernel `mxfp4_moe_gemv`"
        );
        assert_eq!(
            short_name("vLLM's `a, b: c` call. More."),
            "vLLM's `a, b: c` call"
        );
        assert_eq!(short_name("One plain sentence."), "One plain sentence");
    }

    #[test]
    fn a_description_cut_by_an_older_worker_is_marked_and_a_whole_one_is_not() {
        assert!(looks_cut(
            "Our Triton fused MoE (tunelab.kernels.fused_moe; quantised weights:"
        ));
        assert!(whole("x (y:").ends_with("kept the first line of its description only)."));
        assert!(!looks_cut(
            "CUDA kernel `k` (k.cu), compiled with NVRTC and launched natively"
        ));
        assert_eq!(
            whole("A  whole\n sentence (with brackets)."),
            "A whole sentence (with brackets)."
        );
        assert_eq!(
            whole("CUDA kernel `k`, launched natively"),
            "CUDA kernel `k`, launched natively."
        );
    }

    #[test]
    fn methods_of_one_kernel_are_told_apart_by_their_configs() {
        let job = |method: &str, config: serde_json::Value| -> JobRecord {
            serde_json::from_value(serde_json::json!({
                "job_id": format!("{method}{config}"), "method": method, "kind": "triton",
                "kernel": "fused_moe", "shape": {"M": 1}, "config": config, "baseline": false,
                "status": "ok", "failure": null, "check": null, "stats": null, "flops": null,
                "bytes": null, "tflops": null, "gbs": null, "roofline_pct": null,
                "compile_s": null, "duration_s": 1.0, "lane": 0, "kernels": [],
                "finished_at": "2026-12-02T00:00:00Z"
            }))
            .expect("a job record")
        };
        let jobs = [
            job(
                "triton",
                serde_json::json!({"DOT_SCALED": 0, "BLOCK_SIZE_M": 16}),
            ),
            job(
                "triton",
                serde_json::json!({"DOT_SCALED": 0, "BLOCK_SIZE_M": 32}),
            ),
            job(
                "triton_ptx",
                serde_json::json!({"DOT_SCALED": 0, "MX_PTX": 1, "BLOCK_SIZE_M": 16}),
            ),
            job(
                "triton_ptx",
                serde_json::json!({"DOT_SCALED": 0, "MX_PTX": 1, "BLOCK_SIZE_M": 32}),
            ),
            job(
                "triton_gemv",
                serde_json::json!({"DOT_SCALED": 0, "BLOCK_SIZE_M": 1, "GEMV": 1}),
            ),
            job(
                "triton_gemv",
                serde_json::json!({"DOT_SCALED": 0, "BLOCK_SIZE_M": 1, "GEMV": 2}),
            ),
        ];
        let refs: Vec<&JobRecord> = jobs.iter().collect();
        let per_method = by_method(&refs);
        let all = ["triton", "triton_ptx", "triton_gemv"];
        assert_eq!(set_apart("triton", &all, &per_method), "");
        assert_eq!(set_apart("triton_ptx", &all, &per_method), "MX_PTX=1");
        assert_eq!(
            set_apart("triton_gemv", &all, &per_method),
            "BLOCK_SIZE_M=1, GEMV ∈ {1, 2}"
        );
    }
}
