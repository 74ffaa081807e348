//! What the templates (`templates/`) are given: every string already in its
//! final form (C string literals, C comments made safe, markdown cells
//! escaped, numbers formatted, C expressions translated), so that the
//! templates hold only the layout of the C and markdown files.

use std::fmt::Write;

use serde::Serialize;

use super::{Interface, Library, Spec};
use crate::emit::num::compact_config;
use crate::manifest::shape_label;

/// `<prefix>.h`.
#[derive(Serialize)]
pub(super) struct Header<'a> {
    about: &'a str,
    /// The prefix of every C symbol.
    p: &'a str,
    /// `<PREFIX>_H`.
    guard: String,
    upper_prefix: String,
    args: String,
    /// Each specialisation's description, safe in a C comment.
    spec_descriptions: Vec<String>,
}

/// `<prefix>.c`.
#[derive(Serialize)]
pub(super) struct Source<'a> {
    about: &'a str,
    /// The prefix of every C symbol.
    p: &'a str,
    args: String,
    /// The arguments' names, comma-separated, to pass them on.
    call: String,
    /// The arguments' names, each cast to void where it may go unused.
    arg_names: Vec<&'a str>,
    images: Vec<Image>,
    /// The image of each specialisation.
    spec_image: &'a [usize],
    /// C string literals of the kernel symbols.
    symbols: Vec<String>,
    /// C string literals of the specialisations' descriptions.
    spec_names: Vec<String>,
    /// The integer helpers translated expressions call.
    helpers: String,
    specs: Vec<SourceSpec<'a>>,
    buckets: Vec<Bucket<'a>>,
    /// The dispatcher's bucket tests, in the order they are tried.
    choices: Vec<Choice>,
    /// Whether the interface has `M` (without it, no bucket test reads the
    /// arguments).
    has_m: bool,
}

/// One embedded image.
#[derive(Serialize)]
struct Image {
    len: usize,
    /// The bytes as C, 16 to a row, each row ending in a newline: formatted
    /// here, as a template loop over a cubin's bytes would be slow.
    rows: String,
}

#[derive(Serialize)]
struct SourceSpec<'a> {
    description: String,
    conditions: Vec<CCondition<'a>>,
    grid: &'a [String; 3],
    block: &'a [String; 3],
    shared: &'a str,
    params: Vec<CParam<'a>>,
}

#[derive(Serialize)]
struct CCondition<'a> {
    c: &'a str,
    /// The condition in words, safe in a C comment.
    comment: String,
}

#[derive(Serialize)]
struct CParam<'a> {
    c_type: &'a str,
    value: &'a str,
    /// The parameter's name, safe in a C comment.
    comment: String,
}

#[derive(Serialize)]
struct Bucket<'a> {
    key: &'a str,
    candidates: &'a [usize],
}

/// A branch of the dispatcher: the bucket it takes, and when (no test: the
/// `any` bucket, taken when no earlier test held).
#[derive(Serialize)]
struct Choice {
    bucket: usize,
    test: Option<String>,
    count: usize,
}

/// `index.md`.
#[derive(Serialize)]
pub(super) struct Index<'a> {
    about: &'a str,
    /// The prefix of every C symbol.
    p: &'a str,
    args: String,
    buckets: Vec<Bucket<'a>>,
    specs: Vec<IndexSpec<'a>>,
    left_out: Vec<IndexLeftOut<'a>>,
}

/// A row of the specialisations' table, each cell as markdown.
#[derive(Serialize)]
struct IndexSpec<'a> {
    method: &'a str,
    kind: &'a str,
    config: String,
    won_at: String,
    compiled_at: String,
    /// With two decimals, `—` when there is none.
    median_us: String,
    image: usize,
    symbol: &'a str,
    /// In words, `|` escaped.
    conditions: Vec<String>,
}

#[derive(Serialize)]
struct IndexLeftOut<'a> {
    shape: String,
    method: &'a str,
    job_id: &'a str,
    /// On one line, `|` escaped.
    reason: String,
}

pub(super) fn header(lib: &Library) -> Header<'_> {
    let p = &lib.interface.prefix;
    Header {
        about: &lib.about,
        p,
        guard: format!("{}_H", p.to_uppercase()),
        upper_prefix: p.to_uppercase(),
        args: arguments(&lib.interface),
        spec_descriptions: lib.specs.iter().map(describe).collect(),
    }
}

pub(super) fn source<'a>(
    lib: &'a Library,
    images: &[&[u8]],
    spec_image: &'a [usize],
) -> Source<'a> {
    let i = &lib.interface;
    let arg_names: Vec<&str> = i
        .tensors
        .iter()
        .chain(&i.ints)
        .map(String::as_str)
        .collect();
    let m = i.ints.iter().find(|n| *n == "M");
    Source {
        about: &lib.about,
        p: &i.prefix,
        args: arguments(i),
        call: arg_names.join(", "),
        arg_names,
        images: images
            .iter()
            .map(|image| Image {
                len: image.len(),
                rows: byte_rows(image),
            })
            .collect(),
        spec_image,
        symbols: lib.specs.iter().map(|s| c_string(&s.symbol)).collect(),
        spec_names: lib.specs.iter().map(|s| c_string(&describe(s))).collect(),
        helpers: super::cexpr::helpers(&i.prefix),
        specs: lib.specs.iter().map(source_spec).collect(),
        buckets: buckets(lib),
        choices: m
            .map_or_else(Vec::new, |m| bucket_tests(lib, m))
            .into_iter()
            .chain(any_bucket(lib))
            .collect(),
        has_m: m.is_some(),
    }
}

fn source_spec(s: &Spec) -> SourceSpec<'_> {
    SourceSpec {
        description: describe(s),
        conditions: s
            .conditions
            .iter()
            .map(|c| CCondition {
                c: &c.c,
                comment: comment_safe(&c.text),
            })
            .collect(),
        grid: &s.grid,
        block: &s.block,
        shared: &s.shared,
        params: s
            .params
            .iter()
            .map(|p| CParam {
                c_type: &p.c_type,
                value: &p.value,
                comment: comment_safe(&p.name),
            })
            .collect(),
    }
}

fn buckets(lib: &Library) -> Vec<Bucket<'_>> {
    lib.buckets
        .iter()
        .map(|(key, candidates)| Bucket { key, candidates })
        .collect()
}

/// The `M_LEQ_x` buckets in their order (ascending x), then `M_GEQ_x`.
fn bucket_tests(lib: &Library, m: &str) -> Vec<Choice> {
    let indexed = || lib.buckets.iter().enumerate();
    let leq = indexed().filter(|(_, (k, _))| k.starts_with("M_LEQ_"));
    let geq = indexed().filter(|(_, (k, _))| k.starts_with("M_GEQ_"));
    leq.chain(geq)
        .filter_map(|(bucket, (key, candidates))| {
            Some(Choice {
                bucket,
                test: Some(bucket_test(key, m)?),
                count: candidates.len(),
            })
        })
        .collect()
}

/// The `any` bucket, taken when no test held.
fn any_bucket(lib: &Library) -> Option<Choice> {
    let (bucket, _, candidates) = lib.buckets.get_full("any")?;
    Some(Choice {
        bucket,
        test: None,
        count: candidates.len(),
    })
}

/// The condition of one bucket key, in C over `M`; `None` for `any`.
fn bucket_test(key: &str, m: &str) -> Option<String> {
    if let Some(x) = key.strip_prefix("M_LEQ_") {
        return Some(format!("{m} <= INT64_C({x})"));
    }
    key.strip_prefix("M_GEQ_")
        .map(|x| format!("{m} >= INT64_C({x})"))
}

pub(super) fn index<'a>(lib: &'a Library, spec_image: &[usize]) -> Index<'a> {
    Index {
        about: &lib.about,
        p: &lib.interface.prefix,
        args: arguments(&lib.interface),
        buckets: buckets(lib),
        specs: lib
            .specs
            .iter()
            .zip(spec_image)
            .map(|(s, &image)| IndexSpec {
                method: &s.method,
                kind: &s.kind,
                config: compact_config(&s.config),
                won_at: shape_label(&s.won_at),
                compiled_at: shape_label(&s.compiled_at),
                median_us: s.median_us.map_or("—".into(), |m| format!("{m:.2}")),
                image,
                symbol: &s.symbol,
                conditions: s.conditions.iter().map(|c| cell(&c.text)).collect(),
            })
            .collect(),
        left_out: lib
            .left_out
            .iter()
            .map(|l| IndexLeftOut {
                shape: shape_label(&l.shape),
                method: &l.method,
                job_id: &l.job_id,
                reason: cell(&l.reason).replace('\n', " "),
            })
            .collect(),
    }
}

/// `CUdeviceptr a, CUdeviceptr b, ..., int64_t M, ...`
fn arguments(i: &Interface) -> String {
    i.tensors
        .iter()
        .map(|t| format!("CUdeviceptr {t}"))
        .chain(i.ints.iter().map(|n| format!("int64_t {n}")))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `triton (triton) BM128 ..., won at M=4096,N=...,K=...`, safe in a C
/// comment.
fn describe(s: &Spec) -> String {
    let mut text = format!(
        "{} ({}) {}, won at {}",
        s.method,
        s.kind,
        compact_config(&s.config),
        shape_label(&s.won_at)
    );
    if s.compiled_at != s.won_at {
        let _ = write!(text, ", compiled at {}", shape_label(&s.compiled_at));
    }
    comment_safe(&text)
}

/// Text that cannot end the C comment it is in.
fn comment_safe(text: &str) -> String {
    text.replace("*/", "* /")
}

/// Text safe in a markdown table cell.
fn cell(text: &str) -> String {
    text.replace('|', "\\|")
}

/// A C string literal: quotes and backslashes escaped, anything but
/// printable ASCII as octal bytes of its UTF-8.
fn c_string(text: &str) -> String {
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c if c.is_ascii() && !c.is_ascii_control() => out.push(c),
            c => {
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    let _ = write!(out, "\\{b:03o}");
                }
            }
        }
    }
    out.push('"');
    out
}

/// An image's bytes as the rows of a C array: `    0x7f, 0x45, ...,` with
/// 16 bytes a row, each row ending in a newline.
fn byte_rows(image: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    // "0x00, " is 6 bytes; a row adds its 4-space indent and a newline.
    let mut out = String::with_capacity(image.len() * 6 + image.len().div_ceil(16) * 5);
    for row in image.chunks(16) {
        out.push_str("    ");
        for (k, &b) in row.iter().enumerate() {
            if k > 0 {
                out.push_str(", ");
            }
            out.push_str("0x");
            out.push(HEX[usize::from(b >> 4)] as char);
            out.push(HEX[usize::from(b & 0xf)] as char);
        }
        out.push_str(",\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_tests_follow_the_keys() {
        assert_eq!(bucket_test("M_LEQ_64", "M").unwrap(), "M <= INT64_C(64)");
        assert_eq!(
            bucket_test("M_GEQ_8192", "M").unwrap(),
            "M >= INT64_C(8192)"
        );
        assert!(bucket_test("any", "M").is_none());
    }

    #[test]
    fn strings_are_escaped_for_c() {
        assert_eq!(c_string("a\"b\\c"), "\"a\\\"b\\\\c\"");
        assert_eq!(c_string("µ"), "\"\\302\\265\"");
    }

    #[test]
    fn bytes_are_rows_of_sixteen() {
        let image: Vec<u8> = (0..18).collect();
        assert_eq!(
            byte_rows(&image),
            "    0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f,\n    0x10, 0x11,\n"
        );
        assert_eq!(byte_rows(&[0xff]), "    0xff,\n");
        assert_eq!(byte_rows(&[]), "");
    }
}
