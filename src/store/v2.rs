//! Reading journals of format 2 (tunelab from 2026-11-23 to 2026-11-24).
//! Frozen: format 2 is format 3 but for one field of the run header's
//! protocol. Format 3 records `protocol.retime_rest`, how long the GPU idled
//! after each batch of the finalists' re-timing; format 2 re-timed them back
//! to back and did not say so, which is `retime_rest: 0`. Job, finalist and
//! lane records are the same in both. A format-2 header is made format 3
//! here, then read as format 3 is (`v3.rs`).

use serde_json::Value as Json;

use super::record::RunHeader;

/// A format-2 run header (a parsed `{"type": "run", "format": 2, ...}` line)
/// as this build reads it, or why it is not one.
pub fn migrate_header(mut value: Json) -> Result<RunHeader, String> {
    let protocol = value
        .get_mut("protocol")
        .and_then(Json::as_object_mut)
        .ok_or("a format-2 run header without a protocol")?;
    if protocol.contains_key("retime_rest") {
        return Err("a format-2 run header with `retime_rest`, which format 3 added".into());
    }
    protocol.insert("retime_rest".into(), Json::from(0.0));
    value["format"] = Json::from(3);
    super::v3::migrate_header(value).map_err(|e| e.replace("format-3", "format-2"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Entry, FORMAT_VERSION};

    /// A format-3 header line written as format 2 wrote it: no `retime_rest`.
    fn format_2_line() -> Json {
        let mut line = crate::store::v3::tests::format_3_line();
        assert_eq!(line["protocol"]["retime_rest"], Json::from(1.0));
        line["protocol"]
            .as_object_mut()
            .unwrap()
            .remove("retime_rest");
        line["format"] = Json::from(2);
        line
    }

    #[test]
    fn a_format_2_header_reads_as_re_timed_back_to_back() {
        let line = format_2_line();
        // This build's reader refuses it as it is...
        assert!(serde_json::from_value::<Entry>(line.clone()).is_err());
        // ...and reads it migrated.
        let h = migrate_header(line).unwrap();
        assert_eq!(
            (h.format, h.protocol.retime_rest, h.protocol.race),
            (FORMAT_VERSION, 0.0, 0.0)
        );
    }

    #[test]
    fn a_format_2_header_that_names_retime_rest_is_not_one() {
        let mut line = format_2_line();
        line["protocol"]["retime_rest"] = Json::from(1.0);
        assert!(migrate_header(line).unwrap_err().contains("format 3 added"));
    }
}
