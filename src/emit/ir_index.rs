//! `ir`: the index of the winners' kept IR (`<path>/index.md`).
//!
//! The IR files themselves are not an output of the journal: a run with
//! `--keep-ir` (or an `ir` output in its manifest) compiles each winner again
//! after its last job and writes the kernels' stages into
//! `<path>/<shape>/<method>/` (`crate::workbench`). This index is what the
//! journal says of those winners: per kernel its registers per thread, spills
//! and shared memory, and the folder its IR is kept in. It is regenerated
//! from the journal like every output, so it lists a winner whose IR a run
//! did not keep too; `tunelab run --keep-ir` (or `--use-best DIR --keep-ir`)
//! fills the folders in.

use std::fmt::Write;

use super::num::{self, compact_config, DASH};
use super::{EmitError, Group};
use crate::manifest::shape_label;
use crate::store::JobRecord;

/// The index's file name, inside the output's folder.
pub const INDEX: &str = "index.md";

/// The folder a job's IR is kept in, relative to the `ir` folder: one per
/// shape and method (`M=64,N=64,K=64,dtype=bf16/triton`), and one per job
/// below it when every job is kept. Characters a file name should not hold
/// become `_`.
pub fn folder(job: &JobRecord, per_job: bool) -> String {
    let mut out = format!(
        "{}/{}",
        file_name(&shape_label(&job.shape)),
        file_name(&job.method)
    );
    if per_job {
        out.push('/');
        out.push_str(&file_name(&job.job_id));
    }
    out
}

fn file_name(text: &str) -> String {
    let cleaned: String = text
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "=,.+-_".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    match cleaned.as_str() {
        "" | "." | ".." => "_".to_string(),
        _ => cleaned,
    }
}

pub fn render(group: &Group<'_, '_>) -> Result<String, EmitError> {
    let mut out = String::new();
    let w = &mut out;
    let h = group.header;
    let _ = writeln!(w, "# {} — compiled kernels of the winners\n", h.experiment);
    let _ = writeln!(
        w,
        "Each winner's kernels as the compiler made them: registers per thread, registers spilled \
         per thread (local memory / 4), shared memory per block. `tunelab run --keep-ir` keeps their \
         ttir, ttgir, llir, ptx, cubin, sass and compile metadata in the folder named here \
         (docs/workbench.md).\n"
    );
    let mut rows = Vec::new();
    for s in &group.shapes {
        for m in &s.methods {
            let Some(best) = m.best else { continue };
            let job = best.job;
            let place = format!("[{0}]({0}/)", folder(job, false));
            let head = [
                shape_label(s.shape),
                m.method.to_string(),
                compact_config(&job.config),
                num::us(best.time_us()),
            ];
            if job.kernels.is_empty() {
                rows.push(
                    [
                        head.to_vec(),
                        vec![DASH.into(), DASH.into(), DASH.into(), DASH.into()],
                        vec![place.clone()],
                    ]
                    .concat(),
                );
            }
            for k in &job.kernels {
                let n = |v: Option<u32>| v.map_or(DASH.to_string(), |v| v.to_string());
                rows.push(
                    [
                        head.to_vec(),
                        vec![
                            format!("`{}`", k.name),
                            n(k.n_regs),
                            n(k.n_spills),
                            format!("{:.1}", k.shared as f64 / 1024.0),
                        ],
                        vec![place.clone()],
                    ]
                    .concat(),
                );
            }
        }
    }
    if rows.is_empty() {
        let _ = writeln!(w, "No Triton method has a winner yet.");
        return Ok(out);
    }
    let _ = writeln!(
        w,
        "| Shape | Method | Config | Median µs | Kernel | Registers | Spilled | Shared KiB | IR |"
    );
    let _ = writeln!(
        w,
        "| --- | --- | --- | ---: | --- | ---: | ---: | ---: | --- |"
    );
    for r in rows {
        let _ = writeln!(w, "| {} |", r.join(" | "));
    }
    let _ = writeln!(
        w,
        "\n{DASH}: not recorded (a journal from before tunelab recorded compiled kernels, or a \
         kernel whose binary could not be read)."
    );
    Ok(out)
}
