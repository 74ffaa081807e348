//! Planner behaviour through the library API: counts, pruning, ids, filters,
//! strategies, includes and overrides.

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use tunelab::device;
use tunelab::manifest::{self, Experiment};
use tunelab::plan::{self, Filter, Job, Mode, PlanOptions, PlanSummary};

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, text).unwrap();
    path
}

fn load(path: &Path, overrides: &[&str]) -> Experiment {
    let overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
    manifest::load(path, &overrides, &device::profile("h100").unwrap())
        .unwrap_or_else(|d| panic!("{d}"))
}

fn plan_all(exp: &Experiment, only: &str, mode: Mode) -> (PlanSummary, Vec<Job>) {
    let dev = device::profile("h100").unwrap();
    let filter = Filter::parse(only).unwrap();
    let mut jobs = Vec::new();
    let summary = plan::plan(
        exp,
        &PlanOptions {
            device: &dev,
            filter: &filter,
            mode,
        },
        &mut |j| {
            jobs.push(j);
            ControlFlow::Continue(())
        },
    )
    .unwrap_or_else(|d| panic!("{d}"));
    (summary, jobs)
}

const SPACE: &str = r#"
experiment: counts
problem: gemm
shapes:
  product: {M: [16, 64], N: [32]}
  fixed: {K: 64, dtype: fp16}
methods:
  t:
    kind: triton
    kernel: matmul
    space:
      A: {pow2: [16, 128]}
      B: {range: [1, 5, 1]}
      C: [2, 3, 4]
    derived:
      AB: "A * B"
    constraints:
      - "A <= 64"
      - "A * B <= M * 8"
      - "AB * C <= 900"
"#;

/// The same counts by brute force, to check that pruning charges subtrees correctly.
fn brute_force(m: i64) -> (u64, u64, u64, u64) {
    let (mut r1, mut r2, mut r3, mut valid) = (0, 0, 0, 0);
    for a in [16i64, 32, 64, 128] {
        for b in 1..=5 {
            for c in [2i64, 3, 4] {
                if a > 64 {
                    r1 += 1;
                } else if a * b > m * 8 {
                    r2 += 1;
                } else if a * b * c > 900 {
                    r3 += 1;
                } else {
                    valid += 1;
                }
            }
        }
    }
    (r1, r2, r3, valid)
}

#[test]
fn pruned_counts_match_brute_force() {
    let dir = tempfile::tempdir().unwrap();
    let exp = load(&write(dir.path(), "m.yaml", SPACE), &[]);
    let (summary, jobs) = plan_all(&exp, "", Mode::Gpu);
    let m = &summary.methods[0];
    let (a, b) = (brute_force(16), brute_force(64));
    assert_eq!(m.space_points, 60);
    assert_eq!(m.points, 120);
    assert_eq!(
        m.removed.iter().map(|r| r.1).collect::<Vec<_>>(),
        vec![a.0 + b.0, a.1 + b.1, a.2 + b.2]
    );
    assert_eq!(m.valid, a.3 + b.3);
    assert_eq!(jobs.len() as u64, a.3 + b.3);
    // Derived values travel in the config.
    let j = &jobs[0];
    assert_eq!(
        j.config["AB"],
        serde_json::json!(j.config["A"].as_i64().unwrap() * j.config["B"].as_i64().unwrap())
    );
}

#[test]
fn job_ids_are_stable_and_depend_only_on_the_job() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "m.yaml", SPACE);
    let ids = |overrides: &[&str]| -> Vec<String> {
        plan_all(&load(&path, overrides), "", Mode::Gpu)
            .1
            .into_iter()
            .map(|j| j.id)
            .collect()
    };
    let first = ids(&[]);
    assert_eq!(first, ids(&[]), "same manifest, same ids");
    let unique: std::collections::HashSet<_> = first.iter().collect();
    assert_eq!(unique.len(), first.len(), "ids are unique");
    assert_eq!(
        first,
        ids(&["tolerance.atol=0.5", "protocol.min_samples=40"]),
        "tolerance and protocol are not part of a job"
    );
    let changed = ids(&["shapes.fixed.K=128"]);
    assert!(
        changed.iter().all(|id| !first.contains(id)),
        "another shape means other jobs"
    );
}

#[test]
fn only_filters_shapes_methods_and_params() {
    let dir = tempfile::tempdir().unwrap();
    let exp = load(&write(dir.path(), "m.yaml", SPACE), &[]);
    let (all, _) = plan_all(&exp, "", Mode::Gpu);
    let (s, jobs) = plan_all(&exp, "M=64", Mode::Gpu);
    assert_eq!(s.shapes, 1);
    assert!(jobs.iter().all(|j| j.shape["M"] == 64));
    let (_, jobs) = plan_all(&exp, "M=64,C=3,C=4", Mode::Gpu);
    assert!(jobs.iter().all(|j| j.config["C"] != 2));
    assert!(s.jobs < all.jobs);
}

#[test]
fn random_search_draws_budget_configs_reproducibly() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "m.yaml", SPACE);
    let a = plan_all(
        &load(
            &path,
            &["search.strategy=random", "search.budget=5", "search.seed=3"],
        ),
        "",
        Mode::Gpu,
    )
    .1;
    let b = plan_all(
        &load(
            &path,
            &["search.strategy=random", "search.budget=5", "search.seed=3"],
        ),
        "",
        Mode::Gpu,
    )
    .1;
    let c = plan_all(
        &load(
            &path,
            &["search.strategy=random", "search.budget=5", "search.seed=4"],
        ),
        "",
        Mode::Gpu,
    )
    .1;
    assert_eq!(a.len(), 10, "5 per shape");
    assert_eq!(
        a.iter().map(|j| &j.id).collect::<Vec<_>>(),
        b.iter().map(|j| &j.id).collect::<Vec<_>>()
    );
    assert_ne!(
        a.iter().map(|j| &j.id).collect::<Vec<_>>(),
        c.iter().map(|j| &j.id).collect::<Vec<_>>()
    );
}

#[test]
fn baseline_is_emitted_first_and_not_twice() {
    let dir = tempfile::tempdir().unwrap();
    let text = SPACE.to_string() + "    baseline: {A: 32, B: \"2 if M <= 16 else 3\", C: 2}\n";
    let exp = load(&write(dir.path(), "m.yaml", &text), &[]);
    let (summary, jobs) = plan_all(&exp, "M=64", Mode::Gpu);
    assert!(jobs[0].baseline);
    assert_eq!(jobs[0].config["B"], 3);
    assert_eq!(
        jobs.iter().filter(|j| j.id == jobs[0].id).count(),
        1,
        "the grid copy of the baseline is skipped"
    );
    assert_eq!(summary.methods[0].jobs, summary.methods[0].valid);
}

#[test]
fn vllm_default_baseline_follows_vllm_rules() {
    let exp = load(
        Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/experiments/gptoss.yaml"
        )),
        &[],
    );
    let (_, jobs) = plan_all(&exp, "method=triton,E=128,N=2880", Mode::Gpu);
    let base = |m: i64| {
        jobs.iter()
            .find(|j| j.baseline && j.shape["M"] == m)
            .unwrap()
            .config
            .clone()
    };
    let cfg = |m| {
        let c = base(m);
        [
            "BLOCK_SIZE_M",
            "BLOCK_SIZE_N",
            "BLOCK_SIZE_K",
            "GROUP_SIZE_M",
            "num_warps",
            "num_stages",
        ]
        .map(|k| c[k].as_i64().unwrap())
    };
    assert_eq!(cfg(1), [16, 64, 128, 1, 4, 4]);
    assert_eq!(cfg(64), [32, 64, 128, 1, 4, 3]);
    assert_eq!(cfg(256), [64, 128, 64, 1, 8, 3]);
    assert_eq!(cfg(4096), [128, 128, 64, 1, 8, 3]);
    let (_, jobs) = plan_all(&exp, "method=triton,E=32,N=2880,M=4096", Mode::Gpu);
    assert_eq!(
        jobs.iter().find(|j| j.baseline).unwrap().config["GROUP_SIZE_M"],
        1,
        "4096 // 32 = 128 is not > 128"
    );
}

#[test]
fn extends_and_include_merge_with_later_winning() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "base.yaml", "experiment: base\nproblem: gemm\nshapes: {list: [{M: 1, N: 2, K: 3}]}\nmethods:\n  t: {include: space.yaml}\nprotocol: {min_samples: 30, batch: 16}\n");
    write(
        dir.path(),
        "space.yaml",
        "kind: triton\nkernel: matmul\nspace: {A: [1, 2, 3]}\n",
    );
    let child = write(dir.path(), "child.yaml", "extends: base.yaml\nexperiment: child\nprotocol: {batch: 8}\nmethods:\n  t: {space: {A: [4]}}\n");
    let exp = load(&child, &[]);
    assert_eq!(exp.name, "child");
    assert_eq!((exp.protocol.min_samples, exp.protocol.batch), (30, 8));
    assert_eq!(exp.methods[0].axes[0].values, vec![serde_json::json!(4)]);
    assert_eq!(exp.methods[0].kernel, "matmul");
}

#[test]
fn csv_shapes_map_columns_by_name() {
    let exp = load(
        Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/experiments/aiter-fmoe.yaml"
        )),
        &[],
    );
    assert_eq!(exp.shapes.len(), 4);
    let s = &exp.shapes[2];
    assert_eq!(
        (
            s["M"].as_i64(),
            s["K"].as_i64(),
            s["N"].as_i64(),
            s["E"].as_i64()
        ),
        (Some(64), Some(2880), Some(1440), Some(128))
    );
    assert_eq!(s["dtype"], "bf16");
}

#[test]
fn interpreter_mode_uses_its_own_shapes_and_config_cap() {
    let exp = load(
        Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/experiments/quickstart.yaml"
        )),
        &[],
    );
    let (summary, jobs) = plan_all(&exp, "method=triton", Mode::Interpreter);
    assert_eq!(summary.shapes, 2);
    assert!(jobs.iter().all(|j| j.shape["M"].as_i64().unwrap() <= 48));
    // Two sampled configs plus the baseline per shape, at most.
    assert!(jobs.len() <= 6, "{}", jobs.len());
}

#[test]
fn shape_fields_may_be_lists_of_integers() {
    // Quantised shapes name their weights' block shape as vLLM does: [block_n, block_k].
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        "q.yaml",
        r#"
experiment: q
problem: moe
shapes:
  product:
    M: [1, 8]
    quant:
      - {weight_quant: block, block_shape: [128, 128]}
      - {weight_quant: block, block_shape: [64, 128]}
  fixed: {E: 8, topk: 2, K: 256, N: 256, dtype: fp8}
methods:
  triton:
    kind: triton
    kernel: fused_moe
    space: {BLOCK_SIZE_K: [64, 128]}
    constraints: ["block_shape == '[128,128]' or BLOCK_SIZE_K == 64"]
"#,
    );
    let exp = load(&path, &[]);
    let (summary, jobs) = plan_all(&exp, "", Mode::Gpu);
    assert_eq!(summary.shapes, 4);
    assert_eq!(jobs[0].shape["block_shape"], serde_json::json!([128, 128]));
    // Expressions see a list as its JSON text.
    assert_eq!(jobs.len(), 2 * 2 + 2);
}

#[test]
fn every_manifest_in_experiments_validates_and_plans() {
    let dir = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/experiments"));
    let mut seen = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let exp = load(&path, &[]);
            let (summary, _) = plan_all(&exp, "", Mode::Gpu);
            assert!(summary.jobs > 0, "{}", path.display());
            if exp.interpreter.is_some() {
                let (summary, _) = plan_all(&exp, "", Mode::Interpreter);
                assert!(summary.jobs > 0, "{} (interpreter)", path.display());
            }
            seen += 1;
        }
    }
    assert!(seen >= 3);
}

#[test]
fn checked_in_schema_is_current() {
    let path = Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/schemas/manifest.schema.json"
    ));
    let on_disk = std::fs::read_to_string(path).unwrap_or_default();
    assert!(on_disk == manifest::json_schema(), "schemas/manifest.schema.json is stale: run `just schemas` (or `tunelab schema > schemas/manifest.schema.json`)");
}

/// The quantised companions of gptoss.yaml measure at most their surrogate
/// budget plus the baseline in each (shape, method) group, or every job of a
/// method searched exhaustively (`cuda_gemv`'s 24 configs): the job
/// counts docs/quantisation.md ("Tuning budget") gives for `just tune gptoss`.
#[test]
fn quantised_gptoss_companions_stay_within_their_job_budget() {
    use std::collections::BTreeMap;
    use tunelab::search::SearchKind;

    for (file, groups, planned, measured) in [
        ("gptoss-fp8.yaml", 56, 1268, 504),
        ("gptoss-mxfp4.yaml", 324, 8792, 2540),
    ] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("experiments")
            .join(file);
        let exp = load(&path, &[]);
        let SearchKind::Surrogate {
            budget: Some(budget),
        } = exp.search.kind
        else {
            panic!(
                "{file}: a surrogate search with a fixed budget, not {:?}",
                exp.search.kind
            );
        };
        // A method's own search: only exhaustive (grid) ones here, which time every job.
        let exhaustive: Vec<&str> = exp
            .methods
            .iter()
            .filter_map(|m| {
                let kind = &m.search.as_ref()?.kind;
                assert!(
                    matches!(kind, SearchKind::Grid),
                    "{file}: {} searched by {kind:?}",
                    m.name
                );
                Some(m.name.as_str())
            })
            .collect();
        let (_, jobs) = plan_all(&exp, "", Mode::Gpu);
        // (shape, method) -> (baseline jobs, the rest)
        let mut by_group: BTreeMap<(usize, String), (u64, u64)> = BTreeMap::new();
        for j in &jobs {
            let g = by_group
                .entry((j.shape_index, j.method.clone()))
                .or_default();
            if j.baseline {
                g.0 += 1;
            } else {
                g.1 += 1;
            }
        }
        let timed: u64 = by_group
            .iter()
            .map(|((_, method), (b, rest))| {
                b + if exhaustive.contains(&method.as_str()) {
                    *rest
                } else {
                    *rest.min(&budget)
                }
            })
            .sum();
        assert_eq!(
            (by_group.len(), jobs.len(), timed),
            (groups, planned, measured),
            "{file}: groups, planned jobs, measured jobs"
        );
    }
}

/// gptoss-mxfp4's `triton_ptx_split` restates the shared fused-MoE space's
/// constraints (a method's list replaces an included one) and adds its
/// decode-size rule: a constraint changed in spaces/fused-moe.yaml must be
/// changed there too.
#[test]
fn the_split_k_method_keeps_the_shared_constraints() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("experiments/gptoss-mxfp4.yaml");
    let exp = load(&path, &[]);
    let constraints = |name: &str| -> Vec<String> {
        let method = exp.methods.iter().find(|m| m.name == name).expect(name);
        method
            .constraints
            .iter()
            .map(|c| c.source.clone())
            .collect()
    };
    let mut expected = constraints("triton_ptx");
    assert_eq!(expected.len(), 6, "spaces/fused-moe.yaml's constraints");
    expected.push("M * topk <= 8".to_string());
    assert_eq!(constraints("triton_ptx_split"), expected);
}

/// An `ir:` method's jobs are named by the IR file's contents: an edited
/// file is new jobs (a resumed run runs them again), the source method's
/// jobs stay what they were.
#[test]
fn an_ir_files_contents_are_part_of_its_jobs_ids() {
    let dir = tempfile::tempdir().unwrap();
    let ir = write(dir.path(), "edits/matmul_kernel.ttgir", "module {}\n");
    let manifest = write(
        dir.path(),
        "ir.yaml",
        r#"
experiment: ir
problem: gemm
shapes:
  list: [{M: 64, N: 64, K: 64, dtype: fp16}]
methods:
  triton:
    kind: triton
    kernel: matmul
    params: {BLOCK_SIZE_M: 64, BLOCK_SIZE_N: 64, BLOCK_SIZE_K: 32, num_warps: 4, num_stages: 3}
  edited:
    kind: triton
    kernel: matmul
    ir: edits/matmul_kernel.ttgir
    params: {BLOCK_SIZE_M: 64, BLOCK_SIZE_N: 64, BLOCK_SIZE_K: 32, num_warps: 4, num_stages: 3}
"#,
    );
    let ids = || {
        let exp = load(&manifest, &[]);
        let (_, jobs) = plan_all(&exp, "", Mode::Gpu);
        let by_method = |m: &str| {
            jobs.iter()
                .filter(|j| j.method == m)
                .map(|j| j.id.clone())
                .collect::<Vec<_>>()
        };
        (by_method("triton"), by_method("edited"), exp.ir_files())
    };
    let (source, edited, files) = ids();
    assert_eq!((source.len(), edited.len()), (1, 1));
    assert_ne!(source, edited, "same config, another kernel: another job");
    assert_eq!(files["edited"], ir.canonicalize().unwrap());
    assert!(!files.contains_key("triton"));
    std::fs::write(&ir, "module { }\n").unwrap();
    let (source_after, edited_after, _) = ids();
    assert_eq!(source_after, source);
    assert_ne!(edited_after, edited, "an edited IR file is a new job");
}
