//! Timing, as the Python worker's `CudaEventTimer` times
//! (python/tunelab/worker.py; the rules both follow are
//! `crate::protocol::timing`'s): a warm-up in batches between one event
//! pair; a batch of samples queued behind a spin kernel that holds the GPU
//! while the host queues them, an event pair around each launch, the L2
//! flush buffer read (or written) before each cold sample, one host
//! synchronisation per batch; graph timing's replays of one captured CUDA
//! graph; the SM clock read after each batch. A passing check's `then` runs
//! the warm-up and batches in the same call, under `until` until the
//! runner's own stopping rule says enough.

use std::ffi::c_void;
use std::time::Instant;

use super::{answer, Failure, Reply, Server};
use crate::measure::{Decision, Sampling};
use crate::native::gpu::Ptr;
use crate::protocol::native::{LaunchCost, LaunchCostAnswer};
use crate::protocol::timing::{MAX_SPIN_US, MAX_WARMUP_BATCH};
use crate::protocol::{
    FailureKind, FlushWith, MoreBatch, Sample, SampleAnswer, Then, ThenAnswer, Timer, Timing,
    Warmup, WarmupAnswer,
};

/// Spin cycles per microsecond: at or above the SM clock of the GPUs tunelab
/// targets, so a spin lasts at least as long as asked.
const SPIN_CYCLES_PER_US: f64 = 2000.0;

/// A batch's samples and its wall time into `so_far`.
fn add_batch(so_far: &mut Sampling, sampled: &SampleAnswer, wall_ms: f64) {
    // A sample that is not a number (a NaN, written as null) still counts
    // towards `max_samples`, which bounds the loop.
    so_far.samples_us.extend(&sampled.us);
    so_far.wall_ms += wall_ms;
}

impl Server {
    /// A passing check's `then`: the warm-up and the first batch (and under
    /// `until` the later ones, in `more`), or why they failed (the check's
    /// verdict stands either way).
    pub(super) fn then(&mut self, job_id: &str, then: &Then) -> ThenAnswer {
        let result = self.warmup(job_id, &then.warmup).and_then(|warmed| {
            let mut batch = || -> Result<(SampleAnswer, f64), Failure> {
                let started = Instant::now();
                let sampled = self.sample(job_id, &then.sample)?;
                Ok((sampled, started.elapsed().as_secs_f64() * 1e3))
            };
            let (sampled, wall_ms) = batch()?;
            let mut more = Vec::new();
            if let Some(rule) = &then.until {
                // The runner's own rule on what the runner will hold: the
                // samples and each batch's wall time, as this answer gives them.
                let mut so_far = Sampling::default();
                add_batch(&mut so_far, &sampled, wall_ms);
                while so_far.decide_by(rule) == Decision::Continue {
                    let (sampled, wall_ms) = batch()?;
                    add_batch(&mut so_far, &sampled, wall_ms);
                    more.push(MoreBatch {
                        sample: sampled,
                        wall_ms,
                    });
                }
            }
            Ok(ThenAnswer {
                ok: true,
                warmup: Some(warmed),
                sample: Some(sampled),
                wall_ms: Some(wall_ms),
                more: Some(more),
                class: None,
                message: None,
            })
        });
        result.unwrap_or_else(|f| ThenAnswer {
            class: Some(f.class.as_str().to_string()),
            message: Some(f.message),
            ..ThenAnswer::default()
        })
    }

    fn events(&mut self, count: usize) -> Result<(), Failure> {
        while self.starts.len() < count {
            let s = self.gpu.new_event()?;
            let e = self.gpu.new_event()?;
            self.starts.push(s);
            self.ends.push(e);
        }
        Ok(())
    }

    pub(super) fn warmup(&mut self, job_id: &str, w: &Warmup) -> Result<WarmupAnswer, Failure> {
        w.check().map_err(Failure::bad)?;
        let (min_launches, min_ms) = (w.min_launches, w.min_ms);
        self.prepared(job_id)?;
        self.events(1)?;
        let (start, end) = (self.starts[0], self.ends[0]);
        let mut prepared = self.prepared.take();
        let p = prepared.as_mut().expect("checked above");
        let gpu = self.gpu.as_ref();
        let result = (|| -> Result<(u64, f64), Failure> {
            let (mut launches, mut ms) = (0u64, 0.0f64);
            let mut batch = min_launches.max(1);
            loop {
                gpu.record(start)?;
                for _ in 0..batch {
                    p.launch(gpu)?;
                }
                gpu.record(end)?;
                gpu.synchronize()?;
                launches += batch;
                ms += gpu.elapsed_ms(start, end)? as f64;
                if launches >= min_launches && ms >= min_ms {
                    return Ok((launches, ms));
                }
                // The next batch from the time per launch so far, at most 4x larger.
                let per = ms / launches as f64;
                let needed = if per > 0.0 {
                    ((min_ms - ms) / per).ceil().max(1.0) as u64
                } else {
                    2 * batch
                };
                batch = needed.min(4 * batch).clamp(1, MAX_WARMUP_BATCH);
            }
        })();
        self.prepared = prepared;
        let (launches, ms) = result?;
        Ok(WarmupAnswer { launches, ms })
    }

    /// Queues the spin kernel for about `us` microseconds.
    fn hold_gpu(&self, us: f64) -> Result<(), Failure> {
        let Some(h) = &self.helpers else {
            return Ok(());
        };
        let mut cycles: i64 = (us.min(MAX_SPIN_US) * SPIN_CYCLES_PER_US) as i64;
        let mut params = [(&mut cycles as *mut i64).cast::<c_void>()];
        // SAFETY: tunelab_spin takes one 8-byte integer.
        unsafe {
            self.gpu
                .launch(h.spin, [1, 1, 1], [1, 1, 1], 0, params.as_mut_ptr())?
        };
        Ok(())
    }

    /// The flush buffer of `bytes` (zeroed once), allocated or grown on demand.
    fn flush_buffer(&mut self, bytes: u64) -> Result<Option<(Ptr, u64)>, Failure> {
        if bytes == 0 {
            return Ok(None);
        }
        let bytes = bytes.div_ceil(16) * 16;
        match self.flush {
            Some((p, n)) if n >= bytes => return Ok(Some((p, bytes))),
            Some((p, _)) => {
                self.gpu.free(p);
                self.flush = None;
            }
            None => {}
        }
        let p = self.gpu.alloc(bytes as usize)?;
        self.gpu.fill(p, &[0, 0, 0, 0], (bytes / 4) as usize)?;
        self.gpu.synchronize()?;
        self.flush = Some((p, bytes));
        if self.sink.is_none() {
            self.sink = Some(self.gpu.alloc(16)?);
        }
        Ok(Some((p, bytes)))
    }

    fn evict(&self, buf: (Ptr, u64), with: FlushWith) -> Result<(), Failure> {
        match (with, &self.helpers) {
            (FlushWith::Read, Some(h)) => {
                let (mut ptr, mut chunks, mut sink) = (buf.0, buf.1 / 16, self.sink.unwrap_or(0));
                let mut params = [
                    (&mut ptr as *mut u64).cast::<c_void>(),
                    (&mut chunks as *mut u64).cast::<c_void>(),
                    (&mut sink as *mut u64).cast::<c_void>(),
                ];
                // SAFETY: tunelab_flush_read(const uint4*, unsigned long long, unsigned*).
                unsafe {
                    self.gpu.launch(
                        h.flush_read,
                        [1024, 1, 1],
                        [256, 1, 1],
                        0,
                        params.as_mut_ptr(),
                    )?
                };
            }
            // A memset, or a read with no helper kernel to do it.
            _ => self.gpu.fill(buf.0, &[0, 0, 0, 0], (buf.1 / 4) as usize)?,
        }
        Ok(())
    }

    pub(super) fn sample(&mut self, job_id: &str, r: &Sample) -> Result<SampleAnswer, Failure> {
        r.check().map_err(Failure::bad)?;
        let count = r.count as usize;
        let (flush_bytes, flush_with, graph_calls) = (r.flush_bytes, r.flush_with, r.graph_calls);
        self.prepared(job_id)?;
        self.events(count)?;
        let (us, timer) = match r.timing {
            Timing::Cold | Timing::Hot => {
                let flush = if r.timing == Timing::Cold {
                    self.flush_buffer(flush_bytes)?
                } else {
                    None
                };
                (
                    self.sample_launches(count, flush, flush_with)?,
                    Timer::CudaEvent,
                )
            }
            Timing::Graph => (self.sample_graph(count, graph_calls)?, Timer::CudaGraph),
        };
        let sm_clock_mhz = self.sm_clock();
        Ok(SampleAnswer {
            us,
            timer,
            sm_clock_mhz,
        })
    }

    fn sample_launches(
        &mut self,
        count: usize,
        flush: Option<(Ptr, u64)>,
        with: FlushWith,
    ) -> Result<Vec<f64>, Failure> {
        self.hold_gpu(1.5 * self.enqueue_us * count as f64)?;
        let mut p = self.prepared.take().expect("checked by the caller");
        let queued = (|| -> Result<f64, Failure> {
            let queued_at = Instant::now();
            for i in 0..count {
                if let Some(buf) = flush {
                    self.evict(buf, with)?;
                }
                self.gpu.record(self.starts[i])?;
                p.launch(self.gpu.as_ref())?;
                self.gpu.record(self.ends[i])?;
            }
            Ok(queued_at.elapsed().as_secs_f64() * 1e6 / count as f64)
        })();
        self.prepared = Some(p);
        self.enqueue_us = queued?;
        self.gpu.synchronize()?;
        (0..count)
            .map(|i| Ok(self.gpu.elapsed_ms(self.starts[i], self.ends[i])? as f64 * 1e3))
            .collect()
    }

    fn sample_graph(&mut self, count: usize, calls: u64) -> Result<Vec<f64>, Failure> {
        let mut p = self.prepared.take().expect("checked by the caller");
        let graph = match p.graphs.get(&calls) {
            Some(&g) => Ok(g),
            None => {
                (|| -> Result<u64, Failure> {
                    // One launch outside the capture, as the Python worker does.
                    p.launch(self.gpu.as_ref())?;
                    self.gpu.synchronize()?;
                    self.gpu.begin_capture()?;
                    let mut captured = Ok(());
                    for _ in 0..calls {
                        captured = p.launch(self.gpu.as_ref());
                        if captured.is_err() {
                            break;
                        }
                    }
                    // The capture ends whatever happened, so the stream is usable again.
                    let ended = self.gpu.end_capture();
                    captured.map_err(|e| {
                    Failure::new(FailureKind::LaunchError, format!("timing 'graph': this launch cannot be captured in a CUDA graph ({e})"))
                })?;
                    let g = ended?;
                    p.graphs.insert(calls, g);
                    Ok(g)
                })()
            }
        };
        let result = graph.and_then(|g| {
            self.hold_gpu(1.5 * self.enqueue_us * count as f64)?;
            let queued_at = Instant::now();
            for i in 0..count {
                self.gpu.record(self.starts[i])?;
                self.gpu.launch_graph(g)?;
                self.gpu.record(self.ends[i])?;
            }
            self.enqueue_us = queued_at.elapsed().as_secs_f64() * 1e6 / count as f64;
            self.gpu.synchronize()?;
            (0..count)
                .map(|i| {
                    Ok(
                        self.gpu.elapsed_ms(self.starts[i], self.ends[i])? as f64 * 1e3
                            / calls as f64,
                    )
                })
                .collect()
        });
        self.prepared = Some(p);
        result
    }

    /// Host cost of launching the prepared job: `count` launches queued
    /// behind a spin (so the queue never fills), timed on the host, then one
    /// synchronisation. Answers the mean and the median of per-launch times
    /// over batches of 100, in microseconds.
    pub(super) fn launch_cost(&mut self, r: &LaunchCost) -> Reply {
        let count = r.count;
        self.prepared(&r.job_id)?;
        let mut p = self.prepared.take().expect("just checked");
        let result = (|| -> Result<LaunchCostAnswer, Failure> {
            let mut per_batch = Vec::new();
            let started = Instant::now();
            let mut done = 0;
            while done < count {
                let n = (count - done).min(100);
                // Enough spin for the batch: launches are then queued, never blocked on a full queue.
                self.hold_gpu(n as f64 * 20.0)?;
                let t = Instant::now();
                for _ in 0..n {
                    p.launch(self.gpu.as_ref())?;
                }
                per_batch.push(t.elapsed().as_secs_f64() * 1e6 / n as f64);
                self.gpu.synchronize()?;
                done += n;
            }
            let total = started.elapsed().as_secs_f64();
            per_batch.sort_by(f64::total_cmp);
            Ok(LaunchCostAnswer {
                launches: count,
                mean_us: per_batch.iter().sum::<f64>() / per_batch.len() as f64,
                median_us: per_batch[per_batch.len() / 2],
                wall_s: total,
            })
        })();
        self.prepared = Some(p);
        answer(result?)
    }

    fn sm_clock(&mut self) -> Option<f64> {
        let uuid = self.gpu.facts().uuid.clone();
        if self.clock.is_none() {
            self.clock = Some(crate::native::nvml::SmClock::open(&uuid));
        }
        self.clock.as_ref().and_then(|c| c.read())
    }
}
