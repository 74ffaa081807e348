//! The packed journal, `journal.jsonl.gz`: the journal's lines compressed
//! for committing, as a series of independent gzip members of at most
//! [`MEMBER_BYTES`] of text each, every member whole lines.
//!
//! A gzip member carries its own checksum and can be read without the ones
//! before it, so one damaged byte costs only the member it falls in: a reader
//! decodes the members that are whole, skips the one that is not (finding
//! the next member's header), and says which bytes it skipped. Packing never
//! rewrites what it cannot read: a damaged member is copied as it is.

use std::io::{BufRead, Read, Write};
use std::path::Path;

use super::journal::{repair_live, StoreError, JOURNAL, PACKED_JOURNAL};
use super::lock::Claim;
use super::results_dir;

/// Text per gzip member: a damaged byte loses at most this much (about a
/// hundred job records of a gpt-oss run). Members compress a little worse
/// than one stream: the committed H200 gpt-oss tune of 2026-11-25 (12.3 MB
/// of text) packs to 1.84 MB as one member, 1.88 MB in 256 KiB members
/// (+2.4 %), 2.01 MB in 64 KiB members (+9.3 %).
pub const MEMBER_BYTES: usize = 256 << 10;

/// A member header: gzip's magic and the deflate method.
const MAGIC: [u8; 3] = [0x1f, 0x8b, 0x08];

/// How many times its compressed size a member's text may be. The committed
/// journals compress 5 to 8 times; a member that inflates further is a
/// decompression bomb (1.5 MB that decode to 1.5 GB), read no further than
/// this and skipped as damaged, so reading a packed journal takes memory in
/// proportion to the file.
const MAX_RATIO: u64 = 64;

/// What a packed file holds: the text of its whole members, in order, and
/// the byte ranges it could not read.
#[derive(Debug, Default)]
pub struct Unpacked {
    pub text: Vec<u8>,
    /// Member by member: the raw bytes and whether they decoded.
    members: Vec<Member>,
}

#[derive(Debug)]
struct Member {
    start: usize,
    end: usize,
    /// The member's text, or `None` where it is damaged.
    text: Option<Vec<u8>>,
}

impl Unpacked {
    /// One line for each damaged stretch: which bytes were skipped.
    pub fn damage(&self, path: &Path) -> Vec<String> {
        self.members
            .iter()
            .filter(|m| m.text.is_none())
            .map(|m| {
                format!(
                    "{}: bytes {}..{} are damaged and were skipped (the entries they held are lost to this read; the rest of the journal is read)",
                    path.display(),
                    m.start,
                    m.end
                )
            })
            .collect()
    }
}

/// Decodes every member of `raw` that is whole.
pub fn unpack(raw: &[u8]) -> Unpacked {
    let mut out = Unpacked::default();
    let mut at = 0;
    while at < raw.len() {
        let mut cursor = &raw[at..];
        let mut text = Vec::new();
        let most = |compressed: usize| MAX_RATIO * compressed as u64 + MEMBER_BYTES as u64;
        let decoded = flate2::bufread::GzDecoder::new(&mut cursor)
            .take(most(raw.len() - at) + 1)
            .read_to_end(&mut text);
        let used = raw.len() - at - cursor.len();
        match decoded {
            Ok(_) if used > 0 && text.len() as u64 <= most(used) => {
                out.text.extend_from_slice(&text);
                out.members.push(Member {
                    start: at,
                    end: at + used,
                    text: Some(text),
                });
                at += used;
            }
            _ => {
                // Resume at the next member header, if any.
                let next = raw[at + 1..]
                    .windows(MAGIC.len())
                    .position(|w| w == MAGIC)
                    .map_or(raw.len(), |p| at + 1 + p);
                out.members.push(Member {
                    start: at,
                    end: next,
                    text: None,
                });
                at = next;
            }
        }
    }
    // A member's last line may have lost its tail to the damage that follows;
    // every line handed on ends in a newline.
    if !out.text.is_empty() && out.text.last() != Some(&b'\n') {
        out.text.push(b'\n');
    }
    out
}

/// Compresses `text` into members of whole lines, each at most
/// [`MEMBER_BYTES`] (a longer line gets a member of its own).
pub fn compress(text: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let cut = if rest.len() <= MEMBER_BYTES {
            rest.len()
        } else {
            match rest[..MEMBER_BYTES].iter().rposition(|&b| b == b'\n') {
                Some(i) => i + 1,
                None => rest
                    .iter()
                    .position(|&b| b == b'\n')
                    .map_or(rest.len(), |i| i + 1),
            }
        };
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        gz.write_all(&rest[..cut]).expect("writing to memory");
        out.extend(gz.finish().expect("writing to memory"));
        rest = &rest[cut..];
    }
    out
}

/// Compresses a results directory's journal for committing: the packed
/// file's members (damaged ones copied as they are, whole ones re-cut into
/// [`MEMBER_BYTES`] members), then the live journal's lines, into a new
/// `journal.jsonl.gz` (written beside and renamed into place); then removes
/// `journal.jsonl`. Returns the text's bytes and the packed file's.
/// Refuses while a run holds the lock.
pub fn pack(dir: &Path) -> Result<(u64, u64), StoreError> {
    let packed = dir.join(PACKED_JOURNAL);
    let live = dir.join(JOURNAL);
    results_dir::refuse_link(&packed)?;
    results_dir::refuse_link(&live)?;
    if !packed.is_file() && !live.is_file() {
        return Err(StoreError::Missing(dir.to_path_buf()));
    }
    let _claim = Claim::take(dir)?;
    if live.is_file() {
        // A torn tail must not be frozen into the packed file, where no
        // repair reaches it.
        if let Some(notice) = repair_live(&live)? {
            eprintln!("warning: {notice}");
        }
    }
    let raw = if packed.is_file() {
        std::fs::read(&packed).map_err(|source| StoreError::Read {
            path: packed.clone(),
            source,
        })?
    } else {
        Vec::new()
    };
    if !live.is_file() && raw.is_empty() {
        return Err(StoreError::Missing(dir.to_path_buf()));
    }
    let old = unpack(&raw);
    for d in old.damage(&packed) {
        eprintln!("warning: {d}; pack keeps those bytes as they are");
    }
    let mut bytes = Vec::new();
    let mut text_len = 0u64;
    // Whole members are re-cut together (an old single member becomes many);
    // a damaged one stays between them, byte for byte.
    let mut pending: Vec<u8> = Vec::new();
    for m in &old.members {
        match &m.text {
            Some(text) => pending.extend_from_slice(text),
            None => {
                text_len += pending.len() as u64;
                bytes.extend(compress(&pending));
                pending.clear();
                bytes.extend_from_slice(&raw[m.start..m.end]);
            }
        }
    }
    if !pending.is_empty() && pending.last() != Some(&b'\n') {
        pending.push(b'\n');
    }
    if live.is_file() {
        let live_text = std::fs::read(&live).map_err(|source| StoreError::Read {
            path: live.clone(),
            source,
        })?;
        pending.extend_from_slice(&live_text);
    }
    text_len += pending.len() as u64;
    bytes.extend(compress(&pending));
    results_dir::write_file(dir, Path::new(PACKED_JOURNAL), &bytes)?;
    // Only now, with every entry safely in the packed file, is the live one removed.
    if live.is_file() {
        std::fs::remove_file(&live).map_err(|source| StoreError::Io {
            path: live.clone(),
            source,
        })?;
    }
    Ok((text_len, bytes.len() as u64))
}

/// A reader over the packed file's whole members, and what it skipped.
pub fn open(path: &Path) -> Result<(Box<dyn BufRead>, Vec<String>), StoreError> {
    let raw = std::fs::read(path).map_err(|source| StoreError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let unpacked = unpack(&raw);
    let warnings = unpacked.damage(path);
    Ok((Box::new(std::io::Cursor::new(unpacked.text)), warnings))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(n: usize) -> Vec<u8> {
        (0..n)
            .map(|i| {
                format!(
                    "{{\"type\":\"job\",\"n\":{i},\"pad\":\"{}\"}}\n",
                    "x".repeat(200)
                )
            })
            .collect::<String>()
            .into_bytes()
    }

    #[test]
    fn members_round_trip_whole_lines() {
        let text = lines(8000);
        let packed = compress(&text);
        let out = unpack(&packed);
        assert_eq!(out.text, text);
        assert!(out.members.len() > 3, "{} members", out.members.len());
        assert!(out.damage(Path::new("j.gz")).is_empty());
    }

    #[test]
    fn one_flipped_byte_loses_only_its_member() {
        let text = lines(8000);
        let mut packed = compress(&text);
        let middle = packed.len() / 2;
        packed[middle] ^= 0x55;
        let out = unpack(&packed);
        let damage = out.damage(Path::new("journal.jsonl.gz"));
        assert_eq!(damage.len(), 1, "{damage:?}");
        assert!(damage[0].contains("journal.jsonl.gz: bytes"));
        let got = String::from_utf8(out.text).unwrap();
        let kept = got.lines().count();
        assert!(
            kept >= 8000 - 2 * MEMBER_BYTES / 230,
            "kept {kept} of 8000 lines"
        );
        assert!(kept < 8000);
        // Every line read is a whole line of the original (a set of them: a
        // substring search per line took this test 35 s unoptimised).
        let original = String::from_utf8(text).unwrap();
        let whole: std::collections::HashSet<&str> = original.lines().collect();
        assert!(got.lines().all(|l| whole.contains(l)));
    }

    #[test]
    fn an_old_single_member_file_is_read_and_recut_by_pack() {
        let dir = tempfile::tempdir().unwrap();
        let text = lines(4000);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        gz.write_all(&text).unwrap();
        std::fs::write(dir.path().join(PACKED_JOURNAL), gz.finish().unwrap()).unwrap();
        std::fs::write(dir.path().join(JOURNAL), "{\"type\":\"job\",\"n\":-1}\n").unwrap();
        pack(dir.path()).unwrap();
        assert!(!dir.path().join(JOURNAL).exists());
        let raw = std::fs::read(dir.path().join(PACKED_JOURNAL)).unwrap();
        let out = unpack(&raw);
        assert!(out.members.len() > 1);
        assert_eq!(
            out.text.len(),
            text.len() + "{\"type\":\"job\",\"n\":-1}\n".len()
        );
    }

    #[test]
    fn pack_keeps_a_damaged_member_byte_for_byte() {
        let dir = tempfile::tempdir().unwrap();
        let mut packed = compress(&lines(8000));
        let middle = packed.len() / 2;
        packed[middle] ^= 0x55;
        std::fs::write(dir.path().join(PACKED_JOURNAL), &packed).unwrap();
        let before = unpack(&packed).text.len();
        std::fs::write(dir.path().join(JOURNAL), "{\"type\":\"job\",\"n\":-1}\n").unwrap();
        pack(dir.path()).unwrap();
        let raw = std::fs::read(dir.path().join(PACKED_JOURNAL)).unwrap();
        let damaged = unpack(&packed)
            .members
            .into_iter()
            .find(|m| m.text.is_none())
            .unwrap();
        let bad = &packed[damaged.start..damaged.end];
        assert!(
            raw.windows(bad.len()).any(|w| w == bad),
            "the damaged bytes are kept"
        );
        let after = unpack(&raw);
        assert_eq!(
            after.text.len(),
            before + "{\"type\":\"job\",\"n\":-1}\n".len()
        );
    }

    #[test]
    fn a_member_that_inflates_past_its_ratio_is_skipped_not_read_whole() {
        // 8 MB of spaces in an 8 kB member, between two good members.
        let mut raw = compress(b"{\"type\":\"job\",\"n\":1}\n");
        let bomb_at = raw.len();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        for _ in 0..8 {
            gz.write_all(&[b' '; 1 << 20]).unwrap();
        }
        raw.extend(gz.finish().unwrap());
        let bomb_end = raw.len();
        raw.extend(compress(b"{\"type\":\"job\",\"n\":2}\n"));
        let unpacked = unpack(&raw);
        assert_eq!(
            unpacked.text,
            b"{\"type\":\"job\",\"n\":1}\n{\"type\":\"job\",\"n\":2}\n"
        );
        let damage = unpacked.damage(Path::new("j.gz"));
        assert_eq!(damage.len(), 1, "{damage:?}");
        assert!(
            damage[0].contains(&format!("bytes {bomb_at}..{bomb_end}")),
            "{damage:?}"
        );
    }

    #[test]
    fn pack_truncates_nothing_through_a_link() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let victim = outside.path().join("notes");
        std::fs::write(&victim, "precious, no newline at the end").unwrap();
        std::os::unix::fs::symlink(&victim, dir.path().join(JOURNAL)).unwrap();
        let err = pack(dir.path()).unwrap_err();
        assert!(err.to_string().contains("symbolic link"), "{err}");
        assert_eq!(
            std::fs::read_to_string(&victim).unwrap(),
            "precious, no newline at the end"
        );

        // A hard link: its torn-looking last line would be cut off in
        // place, in the other file as well.
        std::fs::remove_file(dir.path().join(JOURNAL)).unwrap();
        std::fs::hard_link(&victim, dir.path().join(JOURNAL)).unwrap();
        let err = pack(dir.path()).unwrap_err();
        assert!(err.to_string().contains("2 hard links"), "{err}");
        assert_eq!(
            std::fs::read_to_string(&victim).unwrap(),
            "precious, no newline at the end"
        );
        assert!(!dir.path().join(PACKED_JOURNAL).exists());
    }
}
