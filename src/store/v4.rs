//! Reading journals of format 4 (tunelab from 2026-11-24 to 2026-12-02).
//! Frozen: format 5 adds two records, an A/B run's setup and its pairs
//! (`store/ab.rs`), and the run mode `ab` they follow; a format-4 journal
//! holds neither, so its header is format 5's but for its number, and its
//! records after it are format 5's.

use serde_json::Value as Json;

use super::record::{RunHeader, FORMAT_VERSION};

/// A format-4 run header (a parsed `{"type": "run", "format": 4, ...}` line)
/// as format 5 reads it, or why it is not one.
pub fn migrate_header(mut value: Json) -> Result<RunHeader, String> {
    let object = value
        .as_object_mut()
        .ok_or("a format-4 run header that is not an object")?;
    if object.get("run_mode").and_then(Json::as_str) == Some("ab") {
        return Err("a format-4 run header of an A/B run, which format 5 added".into());
    }
    object.remove("type");
    object.insert("format".into(), Json::from(FORMAT_VERSION));
    serde_json::from_value(value).map_err(|e| format!("a format-4 run header: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Entry;

    /// A format-4 header line, as the format-4 writer pinned it.
    fn format_4_line() -> Json {
        serde_json::from_str(include_str!(
            "../../tests/fixtures/journals/format_4_run_header.json"
        ))
        .expect("the pinned header is JSON")
    }

    #[test]
    fn a_format_4_header_reads_as_format_5_unchanged_but_for_its_number() {
        let line = format_4_line();
        assert_eq!(line["format"], Json::from(4));
        let h = migrate_header(line.clone()).unwrap();
        assert_eq!(h.format, FORMAT_VERSION);
        // Every other field as it was.
        let mut back = serde_json::to_value(Entry::Run(Box::new(h))).unwrap();
        back["format"] = Json::from(4);
        assert_eq!(back, line);
    }

    #[test]
    fn a_format_4_header_of_an_a_b_run_is_not_one() {
        let mut line = format_4_line();
        line["run_mode"] = Json::from("ab");
        assert!(migrate_header(line).unwrap_err().contains("format 5 added"));
    }
}
