//! How a run measures and searches, as the manifest says: `tolerance`,
//! `protocol` (with its defaults) and `search`. Called from `validate.rs`.

use indexmap::IndexMap;

use super::de::{place, Spanned};
use super::model::{DtypeOverride, Tolerance, DTYPES};
use super::raw::{FlushWith, RawProtocol, RawSearch, RawStrategy, RawTolerance};
use super::values::unknown;
use crate::diag::{Diagnostic, Span};
use crate::measure::{L2Flush, Protocol, Timing};
use crate::search::{Search, SearchKind};

pub(super) fn tolerance(t: &Spanned<RawTolerance>, root: Span) -> Result<Tolerance, Diagnostic> {
    let section = place(t.span, root);
    let check = |v: &Spanned<f64>, name: &str, max: Option<f64>| -> Result<f64, Diagnostic> {
        if v.is_nan() || v.value < 0.0 || max.is_some_and(|m| v.value > m) {
            let range = if max.is_some() {
                "between 0 and 1"
            } else {
                "zero or positive"
            };
            return Err(Diagnostic::at(
                place(v.span, section),
                format!("`{name}` must be {range}, found {}", v.value),
            ));
        }
        Ok(v.value)
    };
    let atol = check(&t.atol, "atol", None)?;
    let rtol = check(&t.rtol, "rtol", None)?;
    let max_mismatch = check(&t.max_mismatch, "max_mismatch", Some(1.0))?;
    let mut per_dtype = IndexMap::new();
    for (dtype, o) in &t.per_dtype {
        if !DTYPES.contains(&dtype.as_str()) {
            return Err(unknown(dtype.span, "dtype", dtype, DTYPES));
        }
        let field = |v: &Option<Spanned<f64>>, name: &str, max| {
            v.as_ref().map(|v| check(v, name, max)).transpose()
        };
        per_dtype.insert(
            dtype.value.clone(),
            DtypeOverride {
                atol: field(&o.atol, "atol", None)?,
                rtol: field(&o.rtol, "rtol", None)?,
                max_mismatch: field(&o.max_mismatch, "max_mismatch", Some(1.0))?,
            },
        );
    }
    Ok(Tolerance {
        atol,
        rtol,
        max_mismatch,
        per_dtype,
    })
}

/// The longest a timeout or a time cap may be: a run waits this long at
/// most, and every such time becomes a `Duration` added to an `Instant`.
const MAX_SECONDS: f64 = 1e6;

pub(super) fn protocol(p: &Spanned<RawProtocol>, root: Span) -> Result<Protocol, Diagnostic> {
    let section = place(p.span, root);
    let at = |s: Span| place(s, section);
    if p.graph_calls.value == 0 || p.graph_calls.value > 10_000 {
        return Err(Diagnostic::at(
            at(p.graph_calls.span),
            format!(
                "`graph_calls` must be between 1 and 10000, found {}",
                p.graph_calls.value
            ),
        ));
    }
    let mut retime_with: Vec<Timing> = Vec::new();
    for t in &p.retime_with {
        if t.value == p.timing || retime_with.contains(&t.value) {
            return Err(Diagnostic::at(
                at(t.span),
                format!(
                    "`retime_with` names `{}` twice, or the run's own `timing`",
                    t.value.as_str()
                ),
            )
            .help("list other timings only: the finalists are timed the run's way already"));
        }
        retime_with.push(t.value);
    }
    if p.batch.value == 0 {
        return Err(Diagnostic::at(
            at(p.batch.span),
            "`batch` must be at least 1",
        ));
    }
    if p.min_samples.value == 0 || p.min_samples.value > p.max_samples {
        return Err(Diagnostic::at(
            at(p.min_samples.span),
            format!(
                "`min_samples` ({}) must be between 1 and `max_samples` ({})",
                p.min_samples.value, p.max_samples
            ),
        ));
    }
    if !(p.target_ci.value > 0.0 && p.target_ci.value < 1.0) {
        return Err(Diagnostic::at(
            at(p.target_ci.span),
            format!(
                "`target_ci` is a fraction of the median, between 0 and 1; found {}",
                p.target_ci.value
            ),
        )
        .help("0.005 means within 0.5 %"));
    }
    for (cap, name) in [
        (&p.max_gpu_ms, "max_gpu_ms"),
        (&p.max_wall_ms, "max_wall_ms"),
    ] {
        if cap.is_nan() || cap.value <= 0.0 {
            return Err(Diagnostic::at(
                at(cap.span),
                format!("`{name}` must be positive; found {}", cap.value),
            )
            .help(".inf for no cap"));
        }
        // A finite cap becomes a `Duration`, which a number this large
        // cannot be (1e300 made the run panic).
        if cap.value.is_finite() && cap.value / 1e3 > MAX_SECONDS {
            return Err(Diagnostic::at(
                at(cap.span),
                format!(
                    "`{name}` must be at most {} (ms); found {:?}",
                    MAX_SECONDS * 1e3,
                    cap.value
                ),
            )
            .help(".inf for no cap"));
        }
    }
    if p.timeout_s.is_nan() || p.timeout_s.value <= 0.0 {
        return Err(Diagnostic::at(
            at(p.timeout_s.span),
            "`timeout_s` must be positive",
        ));
    }
    if p.timeout_s.value > MAX_SECONDS {
        return Err(Diagnostic::at(
            at(p.timeout_s.span),
            format!(
                "`timeout_s` must be at most {MAX_SECONDS} (about 11 days); found {:?}",
                p.timeout_s.value
            ),
        ));
    }
    if !(0.0..=100.0).contains(&p.retime_rest.value) {
        return Err(Diagnostic::at(
            at(p.retime_rest.span),
            format!(
                "`retime_rest` must be between 0 and 100, found {}",
                p.retime_rest.value
            ),
        )
        .help("1 rests as long as each batch ran; 0 re-times back to back"));
    }
    if !(0.0..=10.0).contains(&p.race.value) {
        return Err(Diagnostic::at(
            at(p.race.span),
            format!(
                "`race` is a fraction of the best median so far, between 0 and 10; found {}",
                p.race.value
            ),
        )
        .help("0.05 stops refining a config once it is clearly over 5 % slower than the best so far; 0 turns racing off"));
    }
    if p.warmup_ms.is_nan() || p.warmup_ms.value < 0.0 {
        return Err(Diagnostic::at(
            at(p.warmup_ms.span),
            "`warmup_ms` must be zero or positive",
        ));
    }
    let flush = match (p.flush_l2, p.flush_with.unwrap_or_default()) {
        (false, _) => L2Flush::Off,
        (true, FlushWith::Read) => L2Flush::Read,
        (true, FlushWith::Memset) => L2Flush::Memset,
    };
    Ok(Protocol {
        warmup_launches: p.warmup_launches,
        warmup_ms: p.warmup_ms.value,
        timing: p.timing,
        graph_calls: p.graph_calls.value,
        retime_with,
        flush,
        flush_bytes: p.flush_bytes,
        batch: p.batch.value,
        min_samples: p.min_samples.value,
        max_samples: p.max_samples,
        target_ci: p.target_ci.value,
        max_gpu_ms: p.max_gpu_ms.value,
        max_wall_ms: p.max_wall_ms.value,
        race: p.race.value,
        finalists: p.finalists,
        retime_rest: p.retime_rest.value,
        timeout_s: p.timeout_s.value,
        seed: p.seed,
    })
}

pub(super) fn search(s: &Spanned<RawSearch>, root: Span) -> Result<Search, Diagnostic> {
    let section = place(s.span, root);
    let at = |sp: Span| place(sp, section);
    if s.eta.value < 2 {
        return Err(Diagnostic::at(
            at(s.eta.span),
            format!("`eta` must be at least 2, found {}", s.eta.value),
        ));
    }
    let kind = match s.strategy.value {
        RawStrategy::Grid => SearchKind::Grid,
        RawStrategy::Random => match s.budget.as_ref().map(|b| b.value) {
            Some(budget) if budget > 0 => SearchKind::Random { budget },
            _ => {
                return Err(
                    Diagnostic::at(at(s.strategy.span), "random search needs a budget")
                        .help("add `budget: 64` (configs per shape and method) under `search`"),
                )
            }
        },
        RawStrategy::Halving => SearchKind::Halving { eta: s.eta.value },
        RawStrategy::Surrogate => match &s.budget {
            Some(b) if b.value == 0 => return Err(Diagnostic::at(
                at(b.span),
                "a surrogate search needs a budget of at least 1",
            )
            .help(
                "give configs per shape and method, or leave `budget` out for 30 % of each group",
            )),
            budget => SearchKind::Surrogate {
                budget: budget.as_ref().map(|b| b.value),
            },
        },
    };
    Ok(Search { kind, seed: s.seed })
}
