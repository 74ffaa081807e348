//! The measured figures of the README and docs/performance.md agree with the
//! files they cite.
//!
//! Rule (stated at the top of docs/performance.md): in docs/performance.md,
//! and under the README's `## Performance`, every figure — a number with a
//! decimal point, or a number with a unit (µs, ms, s, min, ×, %, TFLOP/s,
//! GB/s, TB/s, MB, M/s) — must appear in a file that its section (the text
//! under one `##` or `###` heading) cites. A citation is a repository path in
//! backticks or a markdown link (relative to the file that holds it); a
//! directory stands for the text files in it, and a `<device>`-style
//! component for every directory at that place. Version numbers (CUDA 13.0,
//! torch 2.11, 580.159.04) are not figures.

use std::path::{Path, PathBuf};

const UNITS: &[&str] = &[
    "TFLOP/s", "GB/s", "TB/s", "M/s", "µs", "ms", "min", "MB", "s", "×", "%",
];
/// Words after which a number is a version, not a figure.
const VERSION_WORDS: &[&str] = &["CUDA", "Triton", "torch", "driver", "Python", "v", "vLLM"];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[derive(Debug, Clone, PartialEq)]
struct Figure {
    line: usize,
    number: String,
    shown: String,
}

/// Parts of a line outside code spans, and the code spans themselves.
fn split_code(line: &str) -> (String, Vec<String>) {
    let mut prose = String::new();
    let mut code = Vec::new();
    let mut parts = line.split('`');
    if let Some(first) = parts.next() {
        prose.push_str(first);
    }
    for (i, part) in parts.enumerate() {
        if i % 2 == 0 {
            code.push(part.to_string());
            prose.push(' ');
        } else {
            prose.push_str(part);
        }
    }
    (prose, code)
}

/// Markdown link targets `](target)` of a piece of prose, and the prose
/// without them.
fn split_links(prose: &str) -> (String, Vec<String>) {
    let mut out = String::new();
    let mut links = Vec::new();
    let mut rest = prose;
    while let Some(at) = rest.find("](") {
        out.push_str(&rest[..at + 1]);
        let after = &rest[at + 2..];
        match after.find(')') {
            Some(end) => {
                links.push(after[..end].to_string());
                rest = &after[end + 1..];
            }
            None => {
                rest = after;
            }
        }
    }
    out.push_str(rest);
    (out, links)
}

fn figures_in(line_no: usize, prose: &str) -> Vec<Figure> {
    let chars: Vec<char> = prose.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let starts = c.is_ascii_digit()
            && (i == 0 || {
                let p = chars[i - 1];
                !(p.is_alphanumeric() || p == '.' || p == '=' || p == '_' || p == '-')
            });
        if !starts {
            i += 1;
            continue;
        }
        let begin = i;
        while i < chars.len() && chars[i].is_ascii_digit() {
            i += 1;
        }
        let mut decimal = false;
        if i + 1 < chars.len() && chars[i] == '.' && chars[i + 1].is_ascii_digit() {
            decimal = true;
            i += 1;
            while i < chars.len() && chars[i].is_ascii_digit() {
                i += 1;
            }
        }
        let number: String = chars[begin..i].iter().collect();
        // 580.159.04: a version.
        if i + 1 < chars.len() && chars[i] == '.' && chars[i + 1].is_ascii_digit() {
            while i < chars.len() && (chars[i].is_ascii_digit() || chars[i] == '.') {
                i += 1;
            }
            continue;
        }
        let before: String = chars[..begin].iter().collect();
        let word = before
            .trim_end()
            .rsplit(|c: char| !c.is_alphanumeric())
            .next()
            .unwrap_or("");
        if VERSION_WORDS.contains(&word) || before.ends_with('v') {
            continue;
        }
        let after: String = chars[i..].iter().collect();
        let spaced = after.trim_start_matches(' ');
        let unit = UNITS.iter().find(|u| {
            spaced.starts_with(**u)
                && !spaced[u.len()..]
                    .chars()
                    .next()
                    .is_some_and(|n| n.is_alphanumeric())
        });
        if decimal || unit.is_some() {
            let shown = match unit {
                Some(u) => format!("{number} {u}"),
                None => number.clone(),
            };
            out.push(Figure {
                line: line_no,
                number,
                shown,
            });
        }
    }
    out
}

/// Existing repository paths a citation names, from the repository's root
/// or from `base` (the folder of the file that holds it); `<x>` components
/// match every entry there.
fn resolve_from(citation: &str, base: &Path) -> Vec<PathBuf> {
    let mut found = resolve(citation);
    if found.is_empty() && base != root() {
        found = resolve_under(citation, base);
    }
    found
}

/// Existing repository paths a citation names from the repository's root;
/// `<x>` components match every entry there.
fn resolve(citation: &str) -> Vec<PathBuf> {
    resolve_under(citation, &root())
}

fn resolve_under(citation: &str, base: &Path) -> Vec<PathBuf> {
    let cleaned = citation
        .trim()
        .trim_end_matches(['.', ',', ';', ':'])
        .split(['#', ' '])
        .next()
        .unwrap_or("");
    if cleaned.is_empty() || cleaned.starts_with("http") || cleaned.contains("..") {
        return Vec::new();
    }
    let mut found = vec![base.to_path_buf()];
    for component in cleaned.split('/').filter(|c| !c.is_empty()) {
        let mut next = Vec::new();
        for base in &found {
            if component.starts_with('<') && component.ends_with('>') {
                if let Ok(entries) = std::fs::read_dir(base) {
                    next.extend(entries.flatten().map(|e| e.path()));
                }
            } else {
                let p = base.join(component);
                if p.exists() {
                    next.push(p);
                }
            }
        }
        found = next;
    }
    found.retain(|p| p != base);
    found
}

fn texts(path: &Path, into: &mut String) {
    if path.is_dir() {
        let mut entries: Vec<_> = std::fs::read_dir(path)
            .map(|r| r.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        entries.sort();
        for e in entries {
            texts(&e, into);
        }
        return;
    }
    let text_like = matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("md" | "json" | "csv" | "txt" | "rs" | "py" | "yaml" | "svg")
    );
    if text_like {
        if let Ok(s) = std::fs::read_to_string(path) {
            into.push_str(&s);
            into.push('\n');
        }
    }
}

/// `number` occurs in `corpus` as a whole number (not inside a longer one).
fn occurs(corpus: &str, number: &str) -> bool {
    let bytes = corpus.as_bytes();
    let mut from = 0;
    while let Some(at) = corpus[from..].find(number) {
        let start = from + at;
        let end = start + number.len();
        let before_ok = start == 0 || {
            let p = bytes[start - 1];
            !(p.is_ascii_digit() || p == b'.')
        };
        let after_ok = end >= bytes.len()
            || !(bytes[end].is_ascii_digit()
                || (bytes[end] == b'.'
                    && end + 1 < bytes.len()
                    && bytes[end + 1].is_ascii_digit()));
        if before_ok && after_ok {
            return true;
        }
        from = start + 1;
    }
    false
}

struct Section {
    heading: String,
    figures: Vec<Figure>,
    citations: Vec<String>,
}

/// The sections whose figures are checked: with `under` a `##` heading,
/// the text under it (split at its `###` headings); else the whole file,
/// split at every `##` and `###` heading.
fn sections(text: &str, under: Option<&str>) -> Vec<Section> {
    let mut sections = Vec::new();
    let mut inside = under.is_none();
    let mut fenced = false;
    if inside {
        sections.push(Section {
            heading: "(top)".to_string(),
            figures: Vec::new(),
            citations: Vec::new(),
        });
    }
    for (n, line) in text.lines().enumerate() {
        if line.starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let heading = line
            .strip_prefix("## ")
            .or_else(|| line.strip_prefix("### "));
        if let (Some(h), Some(wanted), true) = (heading, under, line.starts_with("## ")) {
            inside = h.trim() == wanted;
        }
        if !inside {
            continue;
        }
        if let Some(h) = heading {
            sections.push(Section {
                heading: h.to_string(),
                figures: Vec::new(),
                citations: Vec::new(),
            });
            continue;
        }
        let section = sections.last_mut().expect("a section");
        let (prose, code) = split_code(line);
        let (prose, links) = split_links(&prose);
        section.citations.extend(code);
        section.citations.extend(links);
        section.figures.extend(figures_in(n + 1, &prose));
    }
    sections
}

/// Each figure of `file`'s checked sections that none of its section's
/// citations holds; and how many figures were checked.
fn unsourced(file: &str, under: Option<&str>) -> (Vec<String>, usize) {
    let path = root().join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    let base = path.parent().unwrap().to_path_buf();
    let mut problems = Vec::new();
    let mut checked = 0;
    for s in &sections(&text, under) {
        let cited: Vec<PathBuf> = s
            .citations
            .iter()
            .flat_map(|c| resolve_from(c, &base))
            .collect();
        let mut corpus = String::new();
        for p in &cited {
            texts(p, &mut corpus);
        }
        for f in &s.figures {
            checked += 1;
            if !occurs(&corpus, &f.number) {
                let names: Vec<String> = cited
                    .iter()
                    .map(|p| p.strip_prefix(root()).unwrap().display().to_string())
                    .collect();
                problems.push(format!(
                    "{file}:{}: `{}` (section \"{}\") is in none of the files it cites: [{}]",
                    f.line,
                    f.shown,
                    s.heading,
                    names.join(", ")
                ));
            }
        }
    }
    (problems, checked)
}

#[test]
fn every_performance_figure_is_in_a_file_its_section_cites() {
    let (mut problems, in_docs) = unsourced("docs/performance.md", None);
    let (readme, in_readme) = unsourced("README.md", Some("Performance"));
    problems.extend(readme);
    assert!(
        in_docs > 100,
        "only {in_docs} figures found in docs/performance.md: is the parser right?"
    );
    assert!(
        in_readme > 2,
        "only {in_readme} figures found under the README's ## Performance"
    );
    assert!(
        problems.is_empty(),
        "{} figures disagree with their sources:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn figures_are_numbers_with_a_decimal_point_or_a_unit_and_not_versions() {
    let shown =
        |s: &str| -> Vec<String> { figures_in(1, s).into_iter().map(|f| f.shown).collect() };
    assert_eq!(shown("M=1 at 75.1 of E=128"), vec!["75.1"]);
    assert_eq!(
        shown("took 79.2 µs, 3.7× and 17 %"),
        vec!["79.2 µs", "3.7 ×", "17 %"]
    );
    assert_eq!(shown("13 min 18 s over 7712 jobs"), vec!["13 min", "18 s"]);
    assert!(shown("CUDA 13.0, torch 2.11, driver 580.159.04, v0.17.0").is_empty());
    assert!(shown("4096³ bf16, 48-config, sm_90, 2026-11-22").is_empty());
    assert_eq!(shown("1.00–2.41×"), vec!["1.00", "2.41 ×"]);
    // A unit must end where the word ends: "5 steps" is not "5 s".
    assert!(shown("in 5 steps").is_empty());
}

#[test]
fn a_figure_matches_only_as_a_whole_number() {
    assert!(occurs("median 75.1 µs", "75.1"));
    assert!(!occurs("median 175.12 µs", "75.1"));
    assert!(!occurs("median 75.15", "75.1"));
    assert!(occurs("| 75.1 |", "75.1"));
    assert!(occurs("x 3.", "3"));
}

#[test]
fn citations_resolve_placeholders_and_links() {
    let (prose, code) = split_code("see `results/gptoss/<device>/` and `just tune`");
    assert_eq!(code, vec!["results/gptoss/<device>/", "just tune"]);
    assert!(!prose.contains("results"));
    assert!(resolve("results/gptoss/<device>/").len() >= 2);
    assert!(resolve("just tune").is_empty());
    let (_, links) = split_links("[scaling](docs/scaling.md), more");
    assert_eq!(links, vec!["docs/scaling.md"]);
    assert_eq!(resolve("docs/scaling.md").len(), 1);
    // A link in docs/ is relative to docs/.
    assert_eq!(resolve_from("scaling.md", &root().join("docs")).len(), 1);
    assert!(resolve("scaling.md").is_empty());
}

#[test]
fn sections_split_at_headings_and_skip_code() {
    let text = "intro 1.5 µs\n## A\nx 2.5 s `a.md`\n```\n9.9 s\n```\n### B\ny 3.5 %\n## Performance\nz 4.5 ms\n";
    let whole = sections(text, None);
    let shown: Vec<(String, Vec<String>)> = whole
        .iter()
        .map(|s| {
            (
                s.heading.clone(),
                s.figures.iter().map(|f| f.shown.clone()).collect(),
            )
        })
        .collect();
    assert_eq!(
        shown,
        vec![
            ("(top)".into(), vec!["1.5 µs".to_string()]),
            ("A".into(), vec!["2.5 s".to_string()]),
            ("B".into(), vec!["3.5 %".to_string()]),
            ("Performance".into(), vec!["4.5 ms".to_string()]),
        ]
    );
    assert_eq!(whole[1].citations, vec!["a.md"]);
    let under = sections(text, Some("Performance"));
    assert_eq!(under.len(), 1);
    assert_eq!(under[0].figures.len(), 1);
}
