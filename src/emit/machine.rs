//! The machine a run timed on, as a reviewer reads it beside a comparison:
//! the GPU, its driver and software, the commit, and the SM clocks its
//! timings ran at (the peak seen, the lowest, how many ran under the power
//! cap). `compare` names where two runs' machines differ; `tunelab ab`'s
//! report states its one machine.

use crate::measure::{Flag, Stats};
use crate::store::RunHeader;

/// A timing ran under the power cap when its SM clock (the lowest read
/// after any of its batches) was below this fraction of the highest clock
/// the run saw: the fraction of `measure`'s THROTTLED flag, taken against
/// the run's peak rather than the timing's own batches, so that a timing
/// that ran capped from its first batch to its last counts too.
pub const CAPPED_BELOW: f64 = 0.92;

/// One run's machine and clocks.
#[derive(Debug, Clone, PartialEq)]
pub struct Machine {
    pub gpu: String,
    /// The CUDA (HIP) driver version the device reported.
    pub driver: Option<String>,
    pub cuda: Option<String>,
    pub torch: Option<String>,
    pub triton: Option<String>,
    pub python: Option<String>,
    pub commit: Option<String>,
    /// The highest SM clock any timing of the run read, MHz.
    pub peak_clock_mhz: Option<f64>,
    /// The lowest.
    pub lowest_clock_mhz: Option<f64>,
    /// Timings read: all of them, under the power cap ([`CAPPED_BELOW`]), flagged THROTTLED.
    pub timings: usize,
    pub capped: usize,
    pub throttled: usize,
}

impl Machine {
    /// The machine of a run from its header and the statistics of its timings.
    pub fn of<'a>(header: &RunHeader, timings: impl IntoIterator<Item = &'a Stats>) -> Machine {
        let timings: Vec<&Stats> = timings.into_iter().collect();
        let clocks = || timings.iter().filter_map(|s| s.sm_clock_mhz);
        let peak = clocks().reduce(f64::max);
        let fp = &header.fingerprint;
        Machine {
            gpu: header.device.name.clone(),
            driver: header.device.driver.clone().or_else(|| fp.driver.clone()),
            cuda: fp.cuda.clone(),
            torch: fp.torch.clone(),
            triton: fp.triton.clone(),
            python: fp.python.clone(),
            commit: fp.git_commit.clone(),
            peak_clock_mhz: peak,
            lowest_clock_mhz: clocks().reduce(f64::min),
            timings: timings.len(),
            capped: timings
                .iter()
                .filter(|s| is_capped(peak, s.sm_clock_mhz))
                .count(),
            throttled: timings
                .iter()
                .filter(|s| s.flags.contains(&Flag::Throttled))
                .count(),
        }
    }

    /// Whether a timing at `clock` ran under this run's power cap.
    pub fn capped_at(&self, clock: Option<f64>) -> bool {
        is_capped(self.peak_clock_mhz, clock)
    }

    /// How much faster a timing at `clock` might have run at the run's peak
    /// clock, as a fraction (0.3: 30 %); 0 where it was not capped or a
    /// clock is unknown. Separate runs capped to other depths can differ by
    /// up to this much with no change of code.
    pub fn headroom(&self, clock: Option<f64>) -> f64 {
        match (self.peak_clock_mhz, clock) {
            (Some(peak), Some(c)) if self.capped_at(Some(c)) && c > 0.0 => peak / c - 1.0,
            _ => 0.0,
        }
    }

    /// `NVIDIA H200, driver 13.0, CUDA 13.0, torch 2.11.0, Triton 3.6.0`.
    pub fn describe(&self) -> String {
        let mut parts = vec![self.gpu.clone()];
        for (name, v) in self.software() {
            if let Some(v) = v {
                parts.push(format!("{name} {v}"));
            }
        }
        parts.join(", ")
    }

    /// `peak 1980 MHz, lowest 1470 MHz; 12 of 148 timings under the power cap, 3 flagged THROTTLED`.
    pub fn clocks(&self) -> String {
        let mhz = |x: Option<f64>| x.map_or("unknown".to_string(), |c| format!("{c:.0} MHz"));
        match self.peak_clock_mhz {
            None => "SM clock not read (no NVML, or the interpreter)".into(),
            Some(_) => format!(
                "SM clock peak {}, lowest {}; {} of {} timings under the power cap (below {:.0} % of the peak), {} flagged THROTTLED",
                mhz(self.peak_clock_mhz),
                mhz(self.lowest_clock_mhz),
                self.capped,
                self.timings,
                CAPPED_BELOW * 100.0,
                self.throttled
            ),
        }
    }

    fn software(&self) -> [(&'static str, &Option<String>); 5] {
        [
            ("driver", &self.driver),
            ("CUDA", &self.cuda),
            ("torch", &self.torch),
            ("Triton", &self.triton),
            ("Python", &self.python),
        ]
    }
}

fn is_capped(peak: Option<f64>, clock: Option<f64>) -> bool {
    matches!((peak, clock), (Some(p), Some(c)) if c < CAPPED_BELOW * p)
}

/// What differs between the machines of two runs, a sentence each, the
/// device first (in bold: it changes what every verdict means).
pub fn differences(base: &Machine, new: &Machine) -> Vec<String> {
    let mut out = Vec::new();
    if base.gpu != new.gpu {
        out.push(format!(
            "**The devices differ**: the base ran on {}, the new on {}: these verdicts compare the devices as much as the code.",
            base.gpu, new.gpu
        ));
    }
    for ((name, a), (_, b)) in base.software().into_iter().zip(new.software()) {
        if a != b {
            let shown = |v: &Option<String>| v.clone().unwrap_or_else(|| "unknown".into());
            out.push(format!(
                "**{name} differs**: {} in the base, {} in the new.",
                shown(a),
                shown(b)
            ));
        }
    }
    if let (Some(a), Some(b)) = (base.peak_clock_mhz, new.peak_clock_mhz) {
        if (a - b).abs() >= 1.0 {
            out.push(format!(
                "**The peak SM clocks differ**: {a:.0} MHz in the base, {b:.0} MHz in the new."
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine(peak: Option<f64>) -> Machine {
        Machine {
            gpu: "NVIDIA H200".into(),
            driver: Some("13.0".into()),
            cuda: Some("13.0".into()),
            torch: Some("2.11.0".into()),
            triton: Some("3.6.0".into()),
            python: Some("3.12.3".into()),
            commit: None,
            peak_clock_mhz: peak,
            lowest_clock_mhz: peak,
            timings: 1,
            capped: 0,
            throttled: 0,
        }
    }

    #[test]
    fn a_timing_below_92_per_cent_of_the_peak_ran_capped_with_that_headroom() {
        let m = machine(Some(1980.0));
        assert!(!m.capped_at(Some(1830.0)));
        assert!(m.capped_at(Some(1485.0)));
        assert!((m.headroom(Some(1485.0)) - (1980.0 / 1485.0 - 1.0)).abs() < 1e-12);
        assert_eq!(m.headroom(Some(1965.0)), 0.0);
        assert_eq!(m.headroom(None), 0.0);
        assert_eq!(machine(None).headroom(Some(1000.0)), 0.0);
    }

    #[test]
    fn differences_name_the_device_first_then_software_and_clocks() {
        let a = machine(Some(1980.0));
        assert!(differences(&a, &a).is_empty());
        let b = Machine {
            gpu: "NVIDIA H100 80GB HBM3".into(),
            driver: Some("12.8".into()),
            peak_clock_mhz: Some(1755.0),
            ..a.clone()
        };
        let d = differences(&a, &b);
        assert_eq!(d.len(), 3, "{d:?}");
        assert!(d[0].contains("devices differ") && d[0].contains("H100"));
        assert!(d[1].contains("driver differs") && d[1].contains("12.8"));
        assert!(d[2].contains("1980") && d[2].contains("1755"));
    }
}
