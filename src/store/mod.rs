//! The journal: append-only, versioned records of every run and job; resume,
//! lock, environment fingerprint, packing for commits.

pub mod ab;
pub mod journal;
pub mod lock;
pub mod packed;
pub mod record;
pub mod results_dir;
mod v1;
mod v2;
mod v3;
mod v4;

pub use ab::{AbCode, AbJob, AbPair, AbRound, AbSetup, AbSide, Interleave, PicksSource};
pub use journal::{Journal, StoreError, JOURNAL, PACKED_JOURNAL};
pub use record::*;
