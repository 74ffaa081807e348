//! A lane whose GPU fails a job that passed before retires; one whose
//! kernels crash does not.

use super::*;

/// Runs the group on a lane that may retire, `good` having passed on
/// some lane before; returns the records and what was handed back.
fn run_watched(
    dies: impl Fn(&Job) -> bool,
    good: Option<Job>,
    may_retire: bool,
) -> (Vec<JobRecord>, Option<Group>, Health) {
    let peak = |_: Option<&str>| 1000.0;
    let prior = HashMap::new();
    let last_good = Mutex::new(good.map(|job| JobRef {
        job,
        kernel: "k".into(),
        kind: MethodKind::Triton,
    }));
    let retire = move || may_retire;
    let mut protocol = crate::manifest::default_protocol();
    protocol.finalists = 0;
    let ctx = LaneContext {
        protocol,
        tolerance: Tolerance {
            atol: 0.0,
            rtol: 0.0,
            max_mismatch: 0.0,
            per_dtype: IndexMap::new(),
        },
        strategies: &Strategies::single(Box::new(Grid)),
        run_mode: RunMode::Tune,
        sampling: SampleMode::PLAIN,
        peak_gbs: 1000.0,
        peak_tflops: &peak,
        compile: None,
        lane: 1,
        prior: &prior,
        health: Some(HealthWatch {
            state: Default::default(),
            last_good: &last_good,
            retire: &retire,
        }),
        ab: None,
    };
    let mut backend = Dying {
        inner: Fake {
            prepared: None,
            spread: 0.0,
            taken: 0,
            unavailable: IndexMap::new(),
        },
        dies,
        log: Vec::new(),
    };
    let mut jobs = Vec::new();
    let rest = run_group(&ctx, &mut backend, group(), &mut |e| {
        if let Event::Job(r) = e {
            jobs.push(*r)
        }
    });
    let health = ctx.health.unwrap().state.into_inner();
    (jobs, rest, health)
}

fn good_job() -> Job {
    let mut job = group().jobs.remove(5);
    job.id = "good".into();
    job
}

#[test]
fn a_lane_whose_gpu_fails_a_job_that_passed_before_retires() {
    // Every check dies, the known-good job's too: the GPU is at fault.
    let (jobs, rest, health) = run_watched(|_| true, Some(good_job()), true);
    assert_eq!(jobs.len(), RETIRE_AFTER, "it stops at the third failure");
    assert!(health.retired.as_deref().unwrap().contains("job good"));
    assert_eq!(health.streak.len(), RETIRE_AFTER);
    let rest = rest.expect("the unrecorded jobs are handed back");
    assert_eq!(rest.jobs.len(), 10 - RETIRE_AFTER);
}

#[test]
fn kernels_that_crash_on_a_healthy_gpu_do_not_retire_a_lane() {
    // Every config but the known-good one dies: the kernels are at fault.
    let (jobs, rest, health) = run_watched(|j| j.id != "good", Some(good_job()), true);
    assert_eq!(jobs.len(), 10, "the group runs to its end");
    assert!(rest.is_none() && health.retired.is_none());
    // Nothing passed anywhere yet: nothing tells GPU from kernels.
    let (jobs, rest, _) = run_watched(|_| true, None, true);
    assert_eq!((jobs.len(), rest.is_none()), (10, true));
    // The last lane never retires.
    let (jobs, rest, _) = run_watched(|_| true, Some(good_job()), false);
    assert_eq!((jobs.len(), rest.is_none()), (10, true));
}
