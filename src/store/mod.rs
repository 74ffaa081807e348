//! The journal: append-only records of every run and job, resume, lock, fingerprint.

pub mod record;

pub use record::*;
