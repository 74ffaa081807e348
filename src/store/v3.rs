//! Reading journals of format 3 (tunelab of 2026-11-24). Frozen: format 3 is
//! format 4 but for one field of the run header's protocol. Format 4 records
//! `protocol.race`, racing's threshold; format 3 had no racing, which is
//! `race: 0`. Job, finalist and lane records are the same in both (a format-3
//! job never carries the `OUTPACED` flag format 4 added). A format-3 header
//! is made format 4 here, then read as format 4 is (`v4.rs`).

use serde_json::Value as Json;

use super::record::RunHeader;

/// A format-3 run header (a parsed `{"type": "run", "format": 3, ...}` line)
/// as this build reads it, or why it is not one.
pub fn migrate_header(mut value: Json) -> Result<RunHeader, String> {
    let protocol = value
        .get_mut("protocol")
        .and_then(Json::as_object_mut)
        .ok_or("a format-3 run header without a protocol")?;
    if protocol.contains_key("race") {
        return Err("a format-3 run header with `race`, which format 4 added".into());
    }
    protocol.insert("race".into(), Json::from(0.0));
    value["format"] = Json::from(4);
    super::v4::migrate_header(value).map_err(|e| e.replace("format-4", "format-3"))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::store::{Entry, FORMAT_VERSION};

    /// A format-3 header line, as the format-3 writer pinned it.
    pub(crate) fn format_3_line() -> Json {
        serde_json::from_str(include_str!(
            "../../tests/fixtures/journals/format_3_run_header.json"
        ))
        .expect("the pinned header is JSON")
    }

    #[test]
    fn a_format_3_header_reads_with_racing_off() {
        let line = format_3_line();
        assert_eq!(line["format"], Json::from(3));
        // Format 4's reader refuses it as it is...
        assert!(serde_json::from_value::<Entry>(line.clone()).is_err());
        // ...and reads it migrated, every other field as it was.
        let h = migrate_header(line.clone()).unwrap();
        assert_eq!((h.format, h.protocol.race), (FORMAT_VERSION, 0.0));
        assert_eq!(
            Json::from(h.protocol.retime_rest),
            line["protocol"]["retime_rest"]
        );
        assert_eq!(h.experiment, "x");
    }

    #[test]
    fn a_format_3_header_that_names_race_is_not_one() {
        let mut line = format_3_line();
        line["protocol"]["race"] = Json::from(0.05);
        assert!(migrate_header(line).unwrap_err().contains("format 4 added"));
    }
}
