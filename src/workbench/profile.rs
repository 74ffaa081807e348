//! `tunelab profile`: placeholder, filled in below.
