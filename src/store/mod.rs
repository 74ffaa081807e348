//! The journal: append-only records of every run and job, resume, lock, fingerprint.

pub mod journal;
pub mod record;

pub use journal::{Journal, StoreError, JOURNAL};
pub use record::*;
