//! YAML text -> a tree of [`Node`]s that remember where they came from.
//!
//! yaml-rust2 gives us events with markers; we build our own small tree so
//! every scalar, key and collection keeps its `file:line:column`. Serde then
//! reads typed values out of this tree (see `de.rs`) and later stages look up
//! spans of fields to point their errors at the right line.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::{Marker, TScalarStyle};

use super::limits;
use crate::diag::{add_source, Diagnostic, FileId, Span};

#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Seq(Vec<Node>),
    Map(Vec<(Key, Node)>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Key {
    pub name: String,
    pub span: Span,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub value: Value,
    pub span: Span,
}

impl Node {
    pub fn kind(&self) -> &'static str {
        match self.value {
            Value::Null => "null",
            Value::Bool(_) => "a boolean",
            Value::Int(_) => "an integer",
            Value::Float(_) => "a number",
            Value::Str(_) => "a string",
            Value::Seq(_) => "a list",
            Value::Map(_) => "a mapping",
        }
    }

    #[cfg(test)]
    pub fn get(&self, key: &str) -> Option<&Node> {
        match &self.value {
            Value::Map(entries) => entries.iter().find(|(k, _)| k.name == key).map(|(_, v)| v),
            _ => None,
        }
    }

    #[cfg(test)]
    pub fn key_span(&self, key: &str) -> Option<Span> {
        match &self.value {
            Value::Map(entries) => entries
                .iter()
                .find(|(k, _)| k.name == key)
                .map(|(k, _)| k.span),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match &self.value {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The value as JSON, spans dropped. A NaN or infinite float becomes null.
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::Value as Json;
        match &self.value {
            Value::Null => Json::Null,
            Value::Bool(b) => Json::Bool(*b),
            Value::Int(i) => Json::from(*i),
            Value::Float(f) => serde_json::Number::from_f64(*f).map_or(Json::Null, Json::Number),
            Value::Str(s) => Json::String(s.clone()),
            Value::Seq(items) => Json::Array(items.iter().map(Node::to_json).collect()),
            Value::Map(entries) => Json::Object(
                entries
                    .iter()
                    .map(|(k, v)| (k.name.clone(), v.to_json()))
                    .collect(),
            ),
        }
    }

    /// Whether the value can be a shape field: a scalar, or a non-empty list
    /// of integers (`block_shape: [128, 128]`).
    pub fn is_shape_value(&self) -> bool {
        match &self.value {
            Value::Seq(items) => {
                !items.is_empty() && items.iter().all(|i| matches!(i.value, Value::Int(_)))
            }
            _ => self.is_scalar(),
        }
    }

    /// Whether the value is a number, string or boolean.
    pub fn is_scalar(&self) -> bool {
        matches!(
            self.value,
            Value::Bool(_) | Value::Int(_) | Value::Float(_) | Value::Str(_)
        )
    }

    #[cfg(test)]
    /// Follows a dotted path with `[i]` indices: `methods.triton.constraints[0]`.
    pub fn at_path(&self, path: &str) -> Option<&Node> {
        let mut node = self;
        for part in path.split('.').filter(|p| !p.is_empty()) {
            let (name, indices) = match part.find('[') {
                Some(i) => (&part[..i], &part[i..]),
                None => (part, ""),
            };
            if !name.is_empty() {
                node = node.get(name)?;
            }
            for index in indices.split('[').filter(|s| !s.is_empty()) {
                let i: usize = index.trim_end_matches(']').parse().ok()?;
                node = match &node.value {
                    Value::Seq(items) => items.get(i)?,
                    _ => return None,
                };
            }
        }
        Some(node)
    }
}

/// How much of the limits one manifest has used so far, over all its files
/// (the manifest, its `extends` parents, its `include`d files, its `--set`
/// values): values (aliases expanded), text (the files' bytes and the text
/// aliases repeat) and files read. Counted together, so a file included
/// many times, or files that each include the next one twice, are refused
/// as an alias that repeats an alias is, before they are read.
#[derive(Debug, Default)]
pub struct Budget {
    values: usize,
    text: u64,
    files: usize,
}

/// How much a value holds: values (itself and those nested in it) and the
/// bytes of its scalars' text.
#[derive(Debug, Clone, Copy)]
struct Size {
    values: usize,
    text: u64,
}

/// Parses one YAML document from a file, registering the text for diagnostics.
/// The file must be a regular file of at most [`limits::MAX_FILE_BYTES`], and
/// fit in what `budget` has left. `named_at`: where another file names it
/// (`include:`, `extends:`), where a limit it takes the manifest over is
/// reported.
pub fn load_file(
    path: &Path,
    budget: &mut Budget,
    named_at: Option<Span>,
) -> Result<Node, Diagnostic> {
    let over = |message: String, help: &str| {
        let d = match named_at {
            Some(span) => Diagnostic::at(span, message),
            None => Diagnostic::in_file(path, message),
        };
        d.help(help)
    };
    const HELP: &str = "a file is read, and counted, each time it is included or extended: \
                        include shared keys once, at the level that needs them";
    budget.files += 1;
    if budget.files > limits::MAX_MANIFEST_FILES {
        return Err(over(
            format!(
                "the manifest reads more than {} files (its `extends` parents and included files, each time one is named)",
                limits::MAX_MANIFEST_FILES
            ),
            HELP,
        ));
    }
    let bytes = super::files::read_bounded(path, limits::MAX_FILE_BYTES, "manifest file")?;
    budget.text += bytes.len() as u64;
    if budget.text > limits::MAX_MANIFEST_BYTES {
        return Err(over(
            format!(
                "the manifest's files hold more than {} bytes together: {} takes them over",
                limits::MAX_MANIFEST_BYTES,
                path.display()
            ),
            HELP,
        ));
    }
    let text = String::from_utf8(bytes).map_err(|e| {
        Diagnostic::in_file(
            path,
            format!(
                "{} is not UTF-8 text (invalid byte at offset {})",
                path.display(),
                e.utf8_error().valid_up_to()
            ),
        )
        .help("a manifest is a YAML text file")
    })?;
    parse_str(path, text, budget)
}

pub fn parse_str(path: &Path, text: String, budget: &mut Budget) -> Result<Node, Diagnostic> {
    // Editors on some systems start a UTF-8 file with a byte-order mark; it
    // is not part of the first key.
    let text = match text.strip_prefix('\u{feff}') {
        Some(rest) => rest.to_string(),
        None => text,
    };
    let file = add_source(path, text.clone());
    let mut builder = TreeBuilder {
        file,
        stack: Vec::new(),
        anchors: HashMap::new(),
        root: None,
        error: None,
        budget: std::mem::take(budget),
    };
    let mut parser = Parser::new_from_str(&text);
    let loaded = parser.load(&mut builder, false);
    *budget = std::mem::take(&mut builder.budget);
    if let Err(e) = loaded {
        let span = span_of(file, *e.marker());
        return Err(Diagnostic::at(span, format!("invalid YAML: {}", e.info()))
            .help("check indentation, quotes and the `key: value` layout on this line or the one above"));
    }
    if let Some(err) = builder.error {
        return Err(err);
    }
    Ok(builder.root.unwrap_or(Node {
        value: Value::Null,
        span: Span {
            file,
            line: 1,
            col: 1,
        },
    }))
}

fn span_of(file: FileId, mark: Marker) -> Span {
    // yaml-rust2 counts lines from 1 and columns from 0.
    Span {
        file,
        line: mark.line(),
        col: mark.col() + 1,
    }
}

enum Frame {
    Seq {
        node: Node,
        anchor: usize,
        /// What the list holds so far, nested values included (for anchors).
        size: Size,
    },
    Map {
        node: Node,
        anchor: usize,
        pending_key: Option<Key>,
        /// The keys so far: a duplicate is found in constant time, so a
        /// mapping of many keys parses in linear time.
        keys: HashSet<String>,
        size: Size,
    },
}

impl Size {
    const ONE: Size = Size { values: 1, text: 0 };

    fn add(&mut self, other: Size) {
        self.values = self.values.saturating_add(other.values);
        self.text = self.text.saturating_add(other.text);
    }
}

/// An anchored value and how much it holds: an alias adds that much to the
/// manifest's count without copying anything first.
struct Anchored {
    node: Node,
    size: Size,
}

struct TreeBuilder {
    file: FileId,
    stack: Vec<Frame>,
    anchors: HashMap<usize, Anchored>,
    root: Option<Node>,
    error: Option<Diagnostic>,
    /// The manifest's count so far, this file's values and aliases included.
    budget: Budget,
}

impl TreeBuilder {
    /// Adds `values` values, and `text` bytes an alias repeats, to the
    /// manifest's count; past a limit, the error names the place that went
    /// over it.
    fn count(&mut self, values: usize, text: u64, span: Span, alias: bool) -> bool {
        self.budget.values = self.budget.values.saturating_add(values);
        self.budget.text = self.budget.text.saturating_add(text);
        let why = if alias {
            "this alias repeats its anchor's values, which"
        } else {
            "this value"
        };
        let error = if self.budget.values > limits::MAX_NODES {
            Diagnostic::at(
                span,
                format!(
                    "the manifest holds more than {} values: {why} takes it over the limit",
                    limits::MAX_NODES
                ),
            )
            .help("a manifest describes an experiment; large shape sets belong in a CSV (`shapes: {csv: FILE}`), YAML aliases that nest other aliases multiply their size, and an included file counts each time it is included")
        } else if self.budget.text > limits::MAX_MANIFEST_BYTES {
            Diagnostic::at(
                span,
                format!(
                    "the manifest's text, with what its aliases repeat, is more than {} bytes: this alias takes it over the limit",
                    limits::MAX_MANIFEST_BYTES
                ),
            )
            .help("an alias repeats its anchor's text each time it is used: anchor short values, and write long text once")
        } else {
            return true;
        };
        self.error.get_or_insert(error);
        false
    }

    fn push_value(&mut self, node: Node, size: Size) {
        match self.stack.last_mut() {
            None => self.root = Some(node),
            Some(Frame::Seq {
                node: seq,
                size: total,
                ..
            }) => {
                total.add(size);
                if let Value::Seq(items) = &mut seq.value {
                    items.push(node);
                }
            }
            Some(Frame::Map {
                node: map,
                pending_key,
                keys,
                size: total,
                ..
            }) => match pending_key.take() {
                None => {
                    let name = match &node.value {
                        Value::Str(s) => s.clone(),
                        Value::Int(i) => i.to_string(),
                        Value::Bool(b) => b.to_string(),
                        Value::Float(f) => f.to_string(),
                        Value::Null => "null".into(),
                        _ => {
                            self.error.get_or_insert(
                                Diagnostic::at(node.span, "a mapping key must be a plain value")
                                    .help("use a name such as `M:` as the key"),
                            );
                            return;
                        }
                    };
                    if !keys.insert(name.clone()) {
                        if let Value::Map(entries) = &map.value {
                            if let Some((first, _)) = entries.iter().find(|(k, _)| k.name == name) {
                                let first_line = first.span.line;
                                self.error.get_or_insert(
                                    Diagnostic::at(node.span, format!("duplicate key `{name}`"))
                                        .help(format!("`{name}` is already defined on line {first_line}; keep one of them")),
                                );
                            }
                        }
                    }
                    total.add(size);
                    *pending_key = Some(Key {
                        name,
                        span: node.span,
                    });
                }
                Some(key) => {
                    total.add(size);
                    if let Value::Map(entries) = &mut map.value {
                        entries.push((key, node));
                    }
                }
            },
        }
    }

    fn record_anchor(&mut self, anchor: usize, node: &Node, size: Size) {
        if anchor > 0 {
            self.anchors.insert(
                anchor,
                Anchored {
                    node: node.clone(),
                    size,
                },
            );
        }
    }

    /// A new list or mapping, unless it nests deeper than the limit.
    fn open(&mut self, frame: Frame, span: Span) {
        if self.stack.len() >= limits::MAX_DEPTH {
            self.error.get_or_insert(
                Diagnostic::at(
                    span,
                    format!(
                        "lists and mappings nest more than {} deep here",
                        limits::MAX_DEPTH
                    ),
                )
                .help("a manifest's values nest a few levels deep; check the indentation"),
            );
            return;
        }
        if self.count(1, 0, span, false) {
            self.stack.push(frame);
        }
    }
}

impl MarkedEventReceiver for TreeBuilder {
    fn on_event(&mut self, ev: Event, mark: Marker) {
        if self.error.is_some() {
            return;
        }
        let span = span_of(self.file, mark);
        match ev {
            Event::Scalar(text, style, anchor, _tag) => {
                // Its text is counted with the file's bytes; an alias of
                // it counts it again.
                if !self.count(1, 0, span, false) {
                    return;
                }
                let size = Size {
                    values: 1,
                    text: text.len() as u64,
                };
                let value = if style == TScalarStyle::Plain {
                    plain_scalar(text)
                } else {
                    Value::Str(text)
                };
                let node = Node { value, span };
                self.record_anchor(anchor, &node, size);
                self.push_value(node, size);
            }
            Event::SequenceStart(anchor, _) => self.open(
                Frame::Seq {
                    node: Node {
                        value: Value::Seq(Vec::new()),
                        span,
                    },
                    anchor,
                    size: Size::ONE,
                },
                span,
            ),
            Event::MappingStart(anchor, _) => self.open(
                Frame::Map {
                    node: Node {
                        value: Value::Map(Vec::new()),
                        span,
                    },
                    anchor,
                    pending_key: None,
                    keys: HashSet::new(),
                    size: Size::ONE,
                },
                span,
            ),
            Event::SequenceEnd | Event::MappingEnd => {
                if let Some(
                    Frame::Seq { node, anchor, size }
                    | Frame::Map {
                        node, anchor, size, ..
                    },
                ) = self.stack.pop()
                {
                    self.record_anchor(anchor, &node, size);
                    self.push_value(node, size);
                }
            }
            Event::Alias(id) => {
                let Some(size) = self.anchors.get(&id).map(|a| a.size) else {
                    self.error = Some(Diagnostic::at(span, "alias to an unknown anchor"));
                    return;
                };
                // Counted before it is copied: an alias of an alias of ...,
                // or of a long text, is refused without building what it
                // would expand to.
                if !self.count(size.values, size.text, span, true) {
                    return;
                }
                let mut node = self.anchors[&id].node.clone();
                node.span = span;
                self.push_value(node, size);
            }
            Event::Nothing
            | Event::StreamStart
            | Event::StreamEnd
            | Event::DocumentStart
            | Event::DocumentEnd => {}
        }
    }
}

/// YAML 1.2 core-schema resolution of an unquoted scalar.
fn plain_scalar(text: String) -> Value {
    match text.as_str() {
        "" | "~" | "null" | "Null" | "NULL" => return Value::Null,
        "true" | "True" | "TRUE" => return Value::Bool(true),
        "false" | "False" | "FALSE" => return Value::Bool(false),
        ".inf" | ".Inf" | "+.inf" => return Value::Float(f64::INFINITY),
        "-.inf" | "-.Inf" => return Value::Float(f64::NEG_INFINITY),
        ".nan" | ".NaN" => return Value::Float(f64::NAN),
        _ => {}
    }
    let digits = text.strip_prefix(['-', '+']).unwrap_or(&text);
    if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit() || b == b'_') {
        if let Ok(i) = text.replace('_', "").parse::<i64>() {
            return Value::Int(i);
        }
    }
    if let Some(hex) = text.strip_prefix("0x") {
        if let Ok(i) = i64::from_str_radix(hex, 16) {
            return Value::Int(i);
        }
    }
    let looks_numeric = digits.starts_with(|c: char| c.is_ascii_digit() || c == '.')
        && digits
            .chars()
            .all(|c| c.is_ascii_digit() || matches!(c, '.' | 'e' | 'E' | '-' | '+'));
    if looks_numeric {
        if let Ok(f) = text.parse::<f64>() {
            return Value::Float(f);
        }
    }
    Value::Str(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Node {
        parse_str(
            Path::new("t.yaml"),
            text.to_string(),
            &mut Budget::default(),
        )
        .unwrap()
    }

    #[test]
    fn scalars_resolve_like_yaml_core_schema() {
        let n = parse("a: 1\nb: 1e-2\nc: true\nd: ~\ne: '12'\nf: 2_048\ng: sm_90\n");
        assert_eq!(n.get("a").unwrap().value, Value::Int(1));
        assert_eq!(n.get("b").unwrap().value, Value::Float(0.01));
        assert_eq!(n.get("c").unwrap().value, Value::Bool(true));
        assert_eq!(n.get("d").unwrap().value, Value::Null);
        assert_eq!(n.get("e").unwrap().value, Value::Str("12".into()));
        assert_eq!(n.get("f").unwrap().value, Value::Int(2048));
        assert_eq!(n.get("g").unwrap().value, Value::Str("sm_90".into()));
    }

    #[test]
    fn spans_are_one_based_lines_and_columns() {
        let n = parse("top:\n  inner: [1, 22]\n");
        let inner = n.at_path("top.inner[1]").unwrap();
        assert_eq!((inner.span.line, inner.span.col), (2, 14));
        assert_eq!(
            n.get("top")
                .unwrap()
                .key_span("inner")
                .map(|s| (s.line, s.col)),
            Some((2, 3))
        );
    }

    #[test]
    fn duplicate_keys_are_errors_that_name_the_first() {
        let err = parse_str(
            Path::new("t.yaml"),
            "a: 1\nb: 2\na: 3\n".into(),
            &mut Budget::default(),
        )
        .unwrap_err();
        assert_eq!(err.span.map(|s| (s.line, s.col)), Some((3, 1)));
        assert!(err.help.unwrap().contains("line 1"));
    }

    #[test]
    fn aliases_copy_the_anchored_value() {
        let n = parse("a: &x [1, 2]\nb: *x\n");
        assert_eq!(n.get("a").unwrap().value, n.get("b").unwrap().value);
    }
}
