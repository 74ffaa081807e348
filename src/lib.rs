//! tunelab: declarative tuning and benchmarking of GPU kernels.
//!
//! The pipeline, one direction, typed values between stages:
//! manifest (YAML with spans) -> model (validated) -> plan (jobs) -> schedule
//! -> backends -> journal -> outputs and report.

pub mod backend;
pub mod cli;
pub mod config;
pub mod device;
pub mod diag;
pub mod emit;
pub mod exit;
pub mod expr;
pub mod manifest;
pub mod measure;
pub mod merge;
pub mod native;
pub mod plan;
pub mod protocol;
pub mod rng;
pub mod schedule;
pub mod search;
pub mod store;
pub mod trace;
pub mod workbench;
