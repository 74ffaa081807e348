//! Exit codes, one table for the whole tool (documented in the README).

/// Everything asked for was done.
pub const OK: i32 = 0;
/// Something went wrong that is not the input's fault (I/O, a bug).
pub const INTERNAL: i32 = 1;
/// Bad input: a manifest, a flag, a settings file. Nothing was written.
pub const BAD_INPUT: i32 = 2;
/// The run finished, but some jobs failed (recorded in the journal).
pub const JOBS_FAILED: i32 = 3;
/// The environment is not usable: no Python with torch/triton, a journal locked by another run.
pub const ENVIRONMENT: i32 = 4;
/// `tunelab compare --fail-on-slower`: a shape is slower than allowed.
pub const REGRESSION: i32 = 5;
/// Interrupted (Ctrl-C); the journal holds every job finished so far.
pub const INTERRUPTED: i32 = 130;

/// Every code above, for the check that `--help` lists them all.
pub const ALL: [i32; 7] = [
    OK,
    INTERNAL,
    BAD_INPUT,
    JOBS_FAILED,
    ENVIRONMENT,
    REGRESSION,
    INTERRUPTED,
];
