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

/// Parses one YAML document from a file, registering the text for diagnostics.
/// The file must be a regular file of at most [`limits::MAX_FILE_BYTES`].
pub fn load_file(path: &Path) -> Result<Node, Diagnostic> {
    let bytes = super::files::read_bounded(path, limits::MAX_FILE_BYTES, "manifest file")?;
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
    parse_str(path, text)
}

pub fn parse_str(path: &Path, text: String) -> Result<Node, Diagnostic> {
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
        nodes: 0,
    };
    let mut parser = Parser::new_from_str(&text);
    if let Err(e) = parser.load(&mut builder, false) {
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
        /// Values in the list so far, nested ones included (for anchors).
        size: usize,
    },
    Map {
        node: Node,
        anchor: usize,
        pending_key: Option<Key>,
        /// The keys so far: a duplicate is found in constant time, so a
        /// mapping of many keys parses in linear time.
        keys: HashSet<String>,
        size: usize,
    },
}

/// An anchored value and how many values it holds: an alias adds that many
/// to the document's count without copying anything first.
struct Anchored {
    node: Node,
    size: usize,
}

struct TreeBuilder {
    file: FileId,
    stack: Vec<Frame>,
    anchors: HashMap<usize, Anchored>,
    root: Option<Node>,
    error: Option<Diagnostic>,
    /// Values in the document, aliases counted as the values they repeat.
    nodes: usize,
}

impl TreeBuilder {
    /// Adds `size` values to the document's count; past the limit, the
    /// error names the place that went over it.
    fn count(&mut self, size: usize, span: Span, alias: bool) -> bool {
        self.nodes = self.nodes.saturating_add(size);
        if self.nodes <= limits::MAX_NODES {
            return true;
        }
        let why = if alias {
            "this alias repeats its anchor's values, which"
        } else {
            "this value"
        };
        self.error.get_or_insert(
            Diagnostic::at(
                span,
                format!(
                    "the manifest holds more than {} values: {why} takes it over the limit",
                    limits::MAX_NODES
                ),
            )
            .help("a manifest describes an experiment; large shape sets belong in a CSV (`shapes: {csv: FILE}`), and YAML aliases that nest other aliases multiply their size"),
        );
        false
    }

    fn push_value(&mut self, node: Node, size: usize) {
        match self.stack.last_mut() {
            None => self.root = Some(node),
            Some(Frame::Seq {
                node: seq,
                size: total,
                ..
            }) => {
                *total += size;
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
                    *total += size;
                    *pending_key = Some(Key {
                        name,
                        span: node.span,
                    });
                }
                Some(key) => {
                    *total += size;
                    if let Value::Map(entries) = &mut map.value {
                        entries.push((key, node));
                    }
                }
            },
        }
    }

    fn record_anchor(&mut self, anchor: usize, node: &Node, size: usize) {
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
        if self.count(1, span, false) {
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
                if !self.count(1, span, false) {
                    return;
                }
                let value = if style == TScalarStyle::Plain {
                    plain_scalar(text)
                } else {
                    Value::Str(text)
                };
                let node = Node { value, span };
                self.record_anchor(anchor, &node, 1);
                self.push_value(node, 1);
            }
            Event::SequenceStart(anchor, _) => self.open(
                Frame::Seq {
                    node: Node {
                        value: Value::Seq(Vec::new()),
                        span,
                    },
                    anchor,
                    size: 1,
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
                    size: 1,
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
                // Counted before it is copied: an alias of an alias of ...
                // is refused without building what it would expand to.
                if !self.count(size, span, true) {
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
        parse_str(Path::new("t.yaml"), text.to_string()).unwrap()
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
        let err = parse_str(Path::new("t.yaml"), "a: 1\nb: 2\na: 3\n".into()).unwrap_err();
        assert_eq!(err.span.map(|s| (s.line, s.col)), Some((3, 1)));
        assert!(err.help.unwrap().contains("line 1"));
    }

    #[test]
    fn aliases_copy_the_anchored_value() {
        let n = parse("a: &x [1, 2]\nb: *x\n");
        assert_eq!(n.get("a").unwrap().value, n.get("b").unwrap().value);
    }
}
