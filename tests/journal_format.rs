//! The journal's on-disk format: what format 5 writes (pinned), how a
//! format-1 journal is read (and formats 2 to 4), what happens to a newer
//! one, a torn line, a packed journal and a journal resumed beside its
//! packed part.

use std::path::Path;

use indexmap::IndexMap;
use tunelab::manifest::{MethodKind, OutputFormat, Tolerance};
use tunelab::measure::{Flag, L2Flush, Stats, Timer};
use tunelab::plan::{Mode, RunMode};
use tunelab::search::StrategyName;
use tunelab::store::journal::{self, Journal};
use tunelab::store::{
    AbCode, AbJob, AbPair, AbRound, AbSetup, AbSide, Entry, Fingerprint, Interleave, JobRecord,
    JobStatus, LaneRetired, OutputSpec, PicksSource, RunHeader, SearchRecord, StoreError,
    FORMAT_VERSION,
};

fn header() -> RunHeader {
    let mut params = IndexMap::new();
    params.insert("eta".to_string(), 3);
    RunHeader {
        format: FORMAT_VERSION,
        experiment: "x".into(),
        description: None,
        problem: "gemm".into(),
        mode: Mode::Gpu,
        run_mode: RunMode::Tune,
        // Written out, not a profile: a profile's figures may change, the format may not.
        device: tunelab::device::DeviceInfo {
            name: "NVIDIA H100 80GB HBM3".into(),
            vllm_name: "NVIDIA_H100_80GB_HBM3".into(),
            backend: "cuda".into(),
            arch: "sm_90".into(),
            cc_major: 9,
            cc_minor: 0,
            sm_count: 132,
            l2_bytes: 52428800,
            smem_bytes: 232448,
            mem_bytes: 85899345920,
            mem_clock_khz: 2619000,
            bus_width_bits: 5120,
            peak_gbs: 3350.0,
            peak_tflops_bf16: 989.4,
            peak_tflops_fp16: 989.4,
            peak_tflops_fp8: 1978.9,
            peak_tflops_fp32: 66.9,
            warp_size: 32,
            driver: Some("580.159.04".into()),
            source: "discovered".into(),
        },
        outputs: vec![OutputSpec {
            format: OutputFormat::Report,
            path: "report.md".into(),
            method: None,
            legacy_keys: false,
        }],
        protocol: tunelab::measure::Protocol {
            warmup_launches: 3,
            warmup_ms: 5.0,
            timing: tunelab::measure::Timing::Cold,
            graph_calls: 10,
            retime_with: vec![tunelab::measure::Timing::Graph],
            flush: L2Flush::Read,
            flush_bytes: None,
            batch: 32,
            min_samples: 20,
            max_samples: 2000,
            target_ci: 0.005,
            max_gpu_ms: 100.0,
            max_wall_ms: 1500.0,
            finalists: 5,
            retime_rest: 1.0,
            race: 0.05,
            timeout_s: 60.0,
            seed: 0,
        },
        search: SearchRecord {
            strategy: StrategyName::Halving,
            params,
        },
        tolerance: Tolerance {
            atol: 0.01,
            rtol: 0.01,
            max_mismatch: 0.0,
            per_dtype: IndexMap::new(),
        },
        methods: vec![tunelab::store::MethodRecord {
            name: "triton".into(),
            kind: MethodKind::Triton,
            kernel: "matmul".into(),
            description: Some("tunelab's own Triton GEMM".into()),
            baseline: Some("baseline".into()),
            search: None,
        }],
        compared: Vec::new(),
        fingerprint: Fingerprint::default(),
        started_at: "2026-11-23T00:00:00Z".into(),
        planned_jobs: 1,
    }
}

fn job(id: &str) -> JobRecord {
    JobRecord {
        job_id: id.into(),
        method: "triton".into(),
        kind: MethodKind::Triton,
        kernel: "matmul".into(),
        shape: IndexMap::new(),
        config: IndexMap::new(),
        baseline: false,
        status: JobStatus::Ok,
        failure: None,
        check: None,
        stats: Some(Stats {
            n: 20,
            median_us: 10.0,
            ci_low_us: 9.9,
            ci_high_us: 10.1,
            min_us: 9.8,
            q1_us: 9.9,
            q3_us: 10.1,
            mean_us: 10.0,
            cv: 0.01,
            flags: vec![Flag::Drift, Flag::Outpaced],
            timer: Timer::CudaEvent,
            sm_clock_mhz: Some(1980.0),
            gpu_ms: 0.2,
            wall_ms: 1.0,
        }),
        flops: None,
        bytes: None,
        tflops: None,
        gbs: None,
        roofline_pct: None,
        compile_s: None,
        kernels: vec![tunelab::store::KernelResources {
            name: "matmul_kernel".into(),
            n_regs: Some(168),
            n_spills: Some(0),
            shared: 49152,
            num_warps: 4,
            num_stages: 3,
        }],
        duration_s: 0.5,
        lane: 0,
        finished_at: "2026-11-23T00:00:01Z".into(),
    }
}

fn write_lines(dir: &Path, lines: &[String]) {
    std::fs::write(dir.join(journal::JOURNAL), lines.join("\n") + "\n").unwrap();
}

/// A change here is a change of the on-disk format: bump FORMAT_VERSION and
/// keep a reader for the old one (see `store/v1.rs`), then update the snapshot.
#[test]
fn format_5_entries_serialise_as_pinned() {
    let run = serde_json::to_string_pretty(&Entry::Run(Box::new(header()))).unwrap();
    insta::assert_snapshot!("format_5_run_header", run);
    let job = serde_json::to_string_pretty(&Entry::Job(Box::new(job("j1")))).unwrap();
    insta::assert_snapshot!("format_5_job_record", job);
    let retired = serde_json::to_string_pretty(&Entry::LaneRetired(retired())).unwrap();
    insta::assert_snapshot!("format_5_lane_retired", retired);
    let setup = serde_json::to_string_pretty(&Entry::AbSetup(Box::new(ab_setup()))).unwrap();
    insta::assert_snapshot!("format_5_ab_setup", setup);
    let pair = serde_json::to_string_pretty(&Entry::AbPair(Box::new(ab_pair()))).unwrap();
    insta::assert_snapshot!("format_5_ab_pair", pair);
}

fn ab_setup() -> AbSetup {
    AbSetup {
        id: "9db5eb4dfcf56af6".into(),
        a: AbSide {
            picks: "results/gptoss/NVIDIA_H200".into(),
            source: PicksSource::Results,
            code: vec![AbCode {
                module: "tunelab.kernels.fused_moe".into(),
                from: "0123456789ab:python/tunelab/kernels/fused_moe.py".into(),
                blake3: "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262".into(),
            }],
        },
        b: AbSide {
            picks: "experiments/shipped/vllm/E=128,N=2880,device_name=NVIDIA_H100_80GB_HBM3.json"
                .into(),
            source: PicksSource::Shipped,
            code: Vec::new(),
        },
        aa_rounds: 6,
        rounds: 16,
        batch: 32,
        threshold: 0.01,
        extra_rounds: 0,
        plant: 0.03,
        interleave: Interleave::Samples,
    }
}

fn ab_pair() -> AbPair {
    let j = job("j1");
    let round = |b_first: bool| AbRound {
        b_first,
        a_us: 10.0,
        b_us: 10.3,
        a_clock_mhz: Some(1980.0),
        b_clock_mhz: None,
        turns: b_first,
    };
    AbPair {
        setup: "9db5eb4dfcf56af6".into(),
        shape: j.shape.clone(),
        method: "triton".into(),
        kind: MethodKind::Triton,
        kernel: "matmul".into(),
        a: AbJob {
            job_id: "a1".into(),
            config: j.config.clone(),
            check: None,
            kernels: j.kernels.clone(),
        },
        b: AbJob {
            job_id: "b1".into(),
            config: j.config.clone(),
            check: None,
            kernels: Vec::new(),
        },
        aa_job_id: "a2".into(),
        plant_us: 0.3,
        aa: vec![round(false)],
        rounds: vec![round(false), round(true)],
        lost_rounds: 1,
        extra_rounds: 0,
        a_stats: j.stats.clone(),
        b_stats: None,
        failure: Some(tunelab::store::Failure {
            class: tunelab::store::FailureClass::Mismatch,
            message: "side B: 0.1 % of elements outside atol".into(),
        }),
        lane: 0,
        duration_s: 1.5,
        finished_at: "2026-12-02T00:00:00Z".into(),
    }
}

/// An A/B's records read back: its setup once (the last written last) and
/// the latest record of each pair.
#[test]
fn a_b_records_are_read_back_latest_pair_record_winning() {
    let dir = tempfile::tempdir().unwrap();
    let line = |e: Entry| serde_json::to_string(&e).unwrap();
    let mut ab_header = header();
    ab_header.run_mode = RunMode::Ab;
    let mut retried = ab_pair();
    retried.failure = None;
    let other = AbSetup {
        id: "other".into(),
        ..ab_setup()
    };
    write_lines(
        dir.path(),
        &[
            line(Entry::Run(Box::new(ab_header.clone()))),
            line(Entry::AbSetup(Box::new(ab_setup()))),
            line(Entry::AbPair(Box::new(ab_pair()))),
            line(Entry::AbSetup(Box::new(other))),
            line(Entry::Run(Box::new(ab_header))),
            line(Entry::AbSetup(Box::new(ab_setup()))),
            line(Entry::AbPair(Box::new(retried.clone()))),
        ],
    );
    let (results, warnings) = journal::read(dir.path()).unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
    let ids: Vec<&str> = results.ab_setups.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids, ["other", "9db5eb4dfcf56af6"]);
    assert_eq!(results.ab_pairs, vec![retried]);
    assert!(results.jobs.is_empty());
}

/// A format-4 journal as a run wrote it (an excerpt of a whole gpt-oss
/// tune on an H200, 2026-11-25: its run records and the records of 36 jobs,
/// 6 of them recorded twice by the resume) reads as format 5, every job as
/// it was.
#[test]
fn a_committed_format_4_journal_reads_as_format_5() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/journals/format4_gptoss");
    let packed = std::fs::read(dir.join("journal.jsonl.gz")).unwrap();
    let mut text = String::new();
    // Packed in members, as `tunelab pack` writes.
    std::io::Read::read_to_string(
        &mut flate2::read::MultiGzDecoder::new(&packed[..]),
        &mut text,
    )
    .unwrap();
    let first = text.lines().next().unwrap();
    assert!(first.contains(r#""format":4"#), "committed in format 4");
    // A resumed run records some jobs again: the latest record of each id counts.
    let ids: std::collections::HashSet<String> = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|e| e["type"] == "job")
        .map(|e| e["job_id"].as_str().unwrap().to_string())
        .collect();
    let (results, warnings) = journal::read(&dir).unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
    assert!(results.runs.iter().all(|r| r.format == FORMAT_VERSION));
    assert_eq!(results.jobs.len(), ids.len());
    assert!(results.ab_setups.is_empty() && results.ab_pairs.is_empty());
}

fn retired() -> LaneRetired {
    LaneRetired {
        lane: 1,
        device: Some("1".into()),
        reason: "3 consecutive crash/launch_error failures, then job j0 (which had passed) failed again on this lane: crash: worker died".into(),
        failed_jobs: vec!["j1".into(), "j2".into(), "j3".into()],
        requeued_jobs: 12,
        at: "2026-11-23T00:00:02Z".into(),
    }
}

/// The lane retirement entry joined format 2 after its first journals: a
/// journal without one reads as before, and one with it reads it back.
#[test]
fn a_lane_retirement_is_read_back_and_older_format_2_journals_still_read() {
    let dir = tempfile::tempdir().unwrap();
    let line = |e: Entry| serde_json::to_string(&e).unwrap();
    write_lines(
        dir.path(),
        &[
            line(Entry::Run(Box::new(header()))),
            line(Entry::Job(Box::new(job("j1")))),
        ],
    );
    let (before, warnings) = journal::read(dir.path()).unwrap();
    assert!(warnings.is_empty() && before.retired.is_empty());
    let (mut j, _) = Journal::open(dir.path()).unwrap();
    j.append(&Entry::LaneRetired(retired())).unwrap();
    drop(j);
    let (after, warnings) = journal::read(dir.path()).unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(after.retired, vec![retired()]);
    assert_eq!(after.jobs.len(), 1);
}

#[test]
fn a_format_1_journal_is_migrated_field_by_field() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/journals/moe.jsonl");
    let (results, warnings) = journal::read_file(&fixture).unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
    let h = results.header.expect("a header");
    assert_eq!(h.format, FORMAT_VERSION, "read as the current format");
    assert_eq!((h.mode, h.run_mode), (Mode::Gpu, RunMode::Tune));
    // Format 1 had no `flush_with`: those runs flushed with a memset.
    assert_eq!(h.protocol.flush, L2Flush::Memset);
    assert_eq!(h.search.strategy, StrategyName::Halving);
    assert_eq!(h.search.label(), "halving (eta 3)");
    assert_eq!(h.tolerance.atol, 0.02);
    assert!(results
        .jobs
        .iter()
        .all(|j| j.kind == MethodKind::Triton || j.kind == MethodKind::Torch));
    // Format 1 did not record the compiled kernels: every job reads as none.
    let lines = std::fs::read_to_string(&fixture).unwrap();
    let job_lines = lines
        .lines()
        .filter(|l| l.contains(r#""type":"job""#))
        .count();
    assert_eq!(results.jobs.len(), job_lines);
    assert!(results.jobs.iter().all(|j| j.kernels.is_empty()));
}

#[test]
fn a_committed_format_2_journal_reads_as_re_timed_back_to_back() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("results/gptoss-attention/NVIDIA_H200");
    let packed = std::fs::read(dir.join("journal.jsonl.gz")).unwrap();
    let mut text = String::new();
    // Packed in members, as `tunelab pack` writes.
    std::io::Read::read_to_string(
        &mut flate2::read::MultiGzDecoder::new(&packed[..]),
        &mut text,
    )
    .unwrap();
    assert!(
        text.lines().next().unwrap().contains(r#""format":2"#),
        "committed in format 2"
    );
    let (results, warnings) = journal::read(&dir).unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
    assert!(!results.runs.is_empty());
    for run in &results.runs {
        assert_eq!(
            (run.format, run.protocol.retime_rest, run.protocol.race),
            (FORMAT_VERSION, 0.0, 0.0)
        );
    }
    // Its records after the header read as format 2 wrote them, timings and all.
    assert!(!results.finals.is_empty() && !results.jobs.is_empty());
}

/// A format-3 journal committed with the retime_rest evidence (H100,
/// 2026-11-24): read with racing off, its jobs as they were.
#[test]
fn a_committed_format_3_journal_reads_with_racing_off() {
    let committed = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("results/bench/NVIDIA_H100_80GB_HBM3/retime_rest/rest1-run1.journal.jsonl.gz");
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(&committed, dir.path().join(journal::PACKED_JOURNAL)).unwrap();
    let (results, warnings) = journal::read(dir.path()).unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
    let run = results.header.expect("a header");
    assert_eq!(
        (run.format, run.protocol.retime_rest, run.protocol.race),
        (FORMAT_VERSION, 1.0, 0.0)
    );
    assert_eq!(results.jobs.len(), 48);
    assert!(results
        .jobs
        .iter()
        .filter_map(|j| j.stats.as_ref())
        .all(|s| !s.flags.contains(&Flag::Outpaced)));
}

#[test]
fn a_newer_format_is_refused_naming_both_versions() {
    let dir = tempfile::tempdir().unwrap();
    let mut newer = serde_json::to_value(Entry::Run(Box::new(header()))).unwrap();
    newer["format"] = serde_json::json!(FORMAT_VERSION + 1);
    newer["something_new"] = serde_json::json!(true);
    write_lines(dir.path(), &[newer.to_string()]);
    let err = journal::read(dir.path()).unwrap_err();
    assert!(matches!(err, StoreError::NewerFormat { .. }), "{err}");
    let message = err.to_string();
    assert!(
        message.contains(&format!("format {}", FORMAT_VERSION + 1))
            && message.contains(&format!("format {FORMAT_VERSION}"))
            && message.contains("journal.jsonl:1"),
        "{message}"
    );
}

#[test]
fn a_torn_last_line_is_cut_off_once_with_a_notice() {
    let dir = tempfile::tempdir().unwrap();
    let run = serde_json::to_string(&Entry::Run(Box::new(header()))).unwrap();
    let j1 = serde_json::to_string(&Entry::Job(Box::new(job("j1")))).unwrap();
    let torn = &j1[..j1.len() / 2];
    std::fs::write(
        dir.path().join(journal::JOURNAL),
        format!("{run}\n{j1}\n{torn}"),
    )
    .unwrap();
    let (_, warnings) = journal::read(dir.path()).unwrap();
    assert_eq!(warnings.len(), 1, "before repair the torn entry is skipped");
    let (mut j, notice) = Journal::open(dir.path()).unwrap();
    let notice = notice.expect("a notice");
    assert!(
        notice.contains("journal.jsonl:3") && notice.contains("torn"),
        "{notice}"
    );
    j.append(&Entry::Job(Box::new(job("j2")))).unwrap();
    drop(j);
    let (results, warnings) = journal::read(dir.path()).unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(
        results.jobs.len(),
        2,
        "j1 kept, j2 appended on its own line"
    );
    let (_, again) = Journal::open(dir.path()).unwrap();
    assert!(again.is_none(), "nothing left to repair");
}

#[test]
fn a_whole_last_entry_without_its_newline_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let run = serde_json::to_string(&Entry::Run(Box::new(header()))).unwrap();
    let j1 = serde_json::to_string(&Entry::Job(Box::new(job("j1")))).unwrap();
    std::fs::write(dir.path().join(journal::JOURNAL), format!("{run}\n{j1}")).unwrap();
    let (mut j, notice) = Journal::open(dir.path()).unwrap();
    assert!(notice.is_none(), "nothing was torn: {notice:?}");
    j.append(&Entry::Job(Box::new(job("j2")))).unwrap();
    drop(j);
    let (results, warnings) = journal::read(dir.path()).unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
    let ids: Vec<&str> = results.jobs.iter().map(|j| j.job_id.as_str()).collect();
    assert_eq!(ids, ["j1", "j2"]);
}

#[test]
fn a_line_torn_inside_a_character_does_not_make_the_journal_unreadable() {
    let dir = tempfile::tempdir().unwrap();
    let run = serde_json::to_string(&Entry::Run(Box::new(header()))).unwrap();
    let mut bytes = format!("{run}\n{{\"type\":\"job\",\"job_id\":\"µ").into_bytes();
    bytes.pop(); // half of the two bytes of µ
    std::fs::write(dir.path().join(journal::JOURNAL), &bytes).unwrap();
    let (results, warnings) = journal::read(dir.path()).unwrap();
    assert!(results.header.is_some());
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    let (_, notice) = Journal::open(dir.path()).unwrap();
    assert!(notice.is_some());
    assert!(journal::read(dir.path()).unwrap().1.is_empty());
}

#[test]
fn packing_keeps_every_entry_and_a_resumed_run_appends_beside_it() {
    let dir = tempfile::tempdir().unwrap();
    let (mut j, _) = Journal::open(dir.path()).unwrap();
    j.append(&Entry::Run(Box::new(header()))).unwrap();
    j.append(&Entry::Job(Box::new(job("j1")))).unwrap();
    drop(j);
    tunelab::store::packed::pack(dir.path()).unwrap();
    assert!(dir.path().join(journal::PACKED_JOURNAL).is_file());
    assert!(!dir.path().join(journal::JOURNAL).exists());
    let (packed, _) = journal::read(dir.path()).unwrap();
    assert_eq!(packed.jobs.len(), 1);

    // A resumed run appends to a live journal next to the packed one.
    let (mut j, _) = Journal::open(dir.path()).unwrap();
    j.append(&Entry::Job(Box::new(job("j2")))).unwrap();
    drop(j);
    let (both, _) = journal::read(dir.path()).unwrap();
    let ids: Vec<&str> = both.jobs.iter().map(|j| j.job_id.as_str()).collect();
    assert_eq!(
        ids,
        ["j1", "j2"],
        "packed entries first, then the live ones"
    );

    tunelab::store::packed::pack(dir.path()).unwrap();
    let (repacked, _) = journal::read(dir.path()).unwrap();
    assert_eq!(repacked.jobs, both.jobs);
    assert!(!dir.path().join(journal::JOURNAL).exists());
}

#[test]
fn packing_refuses_a_directory_a_run_holds() {
    let dir = tempfile::tempdir().unwrap();
    let (mut j, _) = Journal::open(dir.path()).unwrap();
    j.append(&Entry::Run(Box::new(header()))).unwrap();
    let err = tunelab::store::packed::pack(dir.path()).unwrap_err();
    assert!(matches!(err, StoreError::Locked { .. }), "{err}");
    drop(j);
    tunelab::store::packed::pack(dir.path()).expect("free once the run is done");
}

#[test]
fn a_resume_keeps_what_earlier_runs_recorded_and_it_does_not_name() {
    // The first run timed a shipped file (`--compare-to`) and had a method the
    // second run's manifest no longer names; the second run (a resume without
    // the flag) adds a method of its own and describes `triton` anew.
    let mut first = header();
    first.compared.push(tunelab::manifest::Compared {
        method: "shipped E=8,N=16".into(),
        file: "E=8,N=16,device_name=X.json".into(),
        format: OutputFormat::VllmMoeJson,
        against: "triton".into(),
    });
    first.methods.push(tunelab::store::MethodRecord {
        name: "old".into(),
        kind: MethodKind::Triton,
        kernel: "matmul_old".into(),
        description: Some("a method since dropped".into()),
        baseline: None,
        search: None,
    });
    let mut second = header();
    second.started_at = "2026-11-24T00:00:00Z".into();
    second.methods[0].description = Some("described anew".into());
    second.methods.push(tunelab::store::MethodRecord {
        name: "new".into(),
        kind: MethodKind::Triton,
        kernel: "matmul_new".into(),
        description: None,
        baseline: None,
        search: None,
    });
    let dir = tempfile::tempdir().unwrap();
    let (mut j, _) = Journal::open(dir.path()).unwrap();
    j.append(&Entry::Run(Box::new(first.clone()))).unwrap();
    j.append(&Entry::Job(Box::new(job("j1")))).unwrap();
    j.append(&Entry::Run(Box::new(second.clone()))).unwrap();
    drop(j);
    let (results, _) = journal::read(dir.path()).unwrap();
    let h = results.header.unwrap();
    assert_eq!(h.started_at, second.started_at, "the last run's header");
    assert_eq!(
        h.compared, first.compared,
        "the earlier run's compared file is kept"
    );
    let names: Vec<&str> = h.methods.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names, ["triton", "new", "old"]);
    assert_eq!(
        h.methods[0].description.as_deref(),
        Some("described anew"),
        "the last run's record wins"
    );
    // Each run's own header is kept as it was written.
    assert_eq!(results.runs, vec![first, second]);
}
