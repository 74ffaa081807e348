//! Output writers: one per format, all fed from the journal's records.
