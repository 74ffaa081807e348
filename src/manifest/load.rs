//! Reading a manifest: `extends`, `include`, `--set` overrides -> one merged tree.
//!
//! Merging happens on spanned nodes, so after any number of includes every
//! value still points at the file and line it came from.

use std::path::{Path, PathBuf};

use std::collections::HashMap;

use super::files::Access;
use super::yaml::{self, Budget, Key, Node, Value};
use crate::diag::Diagnostic;

/// Loads `path`, resolves `extends` and every `include` (files `access`
/// allows), then applies `--set` overrides.
/// Every file the manifest reads counts against one [`Budget`].
pub fn load_tree(path: &Path, overrides: &[String], access: &Access) -> Result<Node, Diagnostic> {
    let mut stack = Vec::new();
    let mut budget = Budget::default();
    let mut root = load_with_extends(path, None, &mut stack, access, &mut budget)?;
    for text in overrides {
        apply_override(&mut root, text, &mut budget)?;
    }
    Ok(root)
}

fn canonical(path: &Path) -> PathBuf {
    path.canonicalize().unwrap_or_else(|_| path.to_path_buf())
}

/// `named_at`: where the file extending this one names it.
fn load_with_extends(
    path: &Path,
    named_at: Option<crate::diag::Span>,
    stack: &mut Vec<PathBuf>,
    access: &Access,
    budget: &mut Budget,
) -> Result<Node, Diagnostic> {
    let mut node = yaml::load_file(path, budget, named_at)?;
    if !matches!(node.value, Value::Map(_)) {
        return Err(Diagnostic::at(
            node.span,
            format!("a manifest must be a mapping, found {}", node.kind()),
        )
        .help("start the file with `experiment: NAME`"));
    }
    stack.push(canonical(path));
    resolve_includes(&mut node, stack, access, budget)?;
    let parents = take_key(&mut node, "extends");
    let mut merged: Option<Node> = None;
    if let Some(parents) = parents {
        for (file, span) in string_list(&parents, "extends")? {
            let target = relative_to(&span.path(), &file);
            check_cycle(&target, stack, span)?;
            access.check(&target, span, "extends")?;
            ensure_exists(&target, span, "extends")?;
            let base = load_with_extends(&target, Some(span), stack, access, budget)?;
            merged = Some(match merged {
                None => base,
                Some(acc) => merge(acc, base),
            });
        }
    }
    stack.pop();
    Ok(match merged {
        None => node,
        Some(base) => merge(base, node),
    })
}

/// Replaces every `include:` key inside mappings with the included files' contents,
/// merged under the mapping's own keys.
fn resolve_includes(
    node: &mut Node,
    stack: &mut Vec<PathBuf>,
    access: &Access,
    budget: &mut Budget,
) -> Result<(), Diagnostic> {
    match &mut node.value {
        Value::Seq(items) => {
            for item in items {
                resolve_includes(item, stack, access, budget)?;
            }
        }
        Value::Map(entries) => {
            for (_, value) in entries.iter_mut() {
                resolve_includes(value, stack, access, budget)?;
            }
            if let Some(files) = take_key(node, "include") {
                let mut base: Option<Node> = None;
                for (file, span) in string_list(&files, "include")? {
                    let target = relative_to(&span.path(), &file);
                    check_cycle(&target, stack, span)?;
                    access.check(&target, span, "include")?;
                    ensure_exists(&target, span, "include")?;
                    let mut included = yaml::load_file(&target, budget, Some(span))?;
                    if !matches!(included.value, Value::Map(_)) {
                        return Err(Diagnostic::at(
                            included.span,
                            "an included file must hold a mapping",
                        )
                        .help("write the shared keys at the top level of the file"));
                    }
                    stack.push(canonical(&target));
                    resolve_includes(&mut included, stack, access, budget)?;
                    stack.pop();
                    base = Some(match base {
                        None => included,
                        Some(acc) => merge(acc, included),
                    });
                }
                if let Some(base) = base {
                    let own = std::mem::replace(node, base.clone());
                    *node = merge(base, own);
                }
            }
        }
        _ => {}
    }
    Ok(())
}

fn relative_to(including_file: &Path, target: &str) -> PathBuf {
    let dir = including_file.parent().unwrap_or(Path::new("."));
    dir.join(target)
}

fn check_cycle(
    target: &Path,
    stack: &[PathBuf],
    span: crate::diag::Span,
) -> Result<(), Diagnostic> {
    let target = canonical(target);
    if stack.contains(&target) {
        let chain: Vec<String> = stack
            .iter()
            .skip_while(|p| **p != target)
            .map(|p| {
                p.file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .into_owned()
            })
            .chain(std::iter::once(
                target
                    .file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .into_owned(),
            ))
            .collect();
        return Err(
            Diagnostic::at(span, format!("include cycle: {}", chain.join(" -> ")))
                .help("a file cannot include itself, directly or through other files"),
        );
    }
    Ok(())
}

fn ensure_exists(target: &Path, span: crate::diag::Span, what: &str) -> Result<(), Diagnostic> {
    if !target.is_file() {
        return Err(
            Diagnostic::at(span, format!("{what} file not found: {}", target.display()))
                .help("paths are relative to the file that names them"),
        );
    }
    Ok(())
}

fn take_key(node: &mut Node, key: &str) -> Option<Node> {
    if let Value::Map(entries) = &mut node.value {
        if let Some(i) = entries.iter().position(|(k, _)| k.name == key) {
            return Some(entries.remove(i).1);
        }
    }
    None
}

fn string_list(node: &Node, what: &str) -> Result<Vec<(String, crate::diag::Span)>, Diagnostic> {
    let bad = || {
        Diagnostic::at(
            node.span,
            format!(
                "`{what}` takes a file path or a list of file paths, found {}",
                node.kind()
            ),
        )
    };
    match &node.value {
        Value::Str(s) => Ok(vec![(s.clone(), node.span)]),
        Value::Seq(items) => items
            .iter()
            .map(|item| {
                item.as_str()
                    .map(|s| (s.to_string(), item.span))
                    .ok_or_else(bad)
            })
            .collect(),
        _ => Err(bad()),
    }
}

/// `overlay` wins; mappings merge key by key, everything else is replaced.
/// Keys are found through an index, so merging large mappings stays linear.
pub fn merge(base: Node, overlay: Node) -> Node {
    match (base.value, overlay.value) {
        (Value::Map(mut base_entries), Value::Map(overlay_entries)) => {
            let mut index: HashMap<String, usize> = base_entries
                .iter()
                .enumerate()
                .map(|(i, (k, _))| (k.name.clone(), i))
                .collect();
            for (key, value) in overlay_entries {
                match index.get(&key.name) {
                    Some(&i) => {
                        let placeholder = Node {
                            value: Value::Null,
                            span: key.span,
                        };
                        let old = std::mem::replace(&mut base_entries[i].1, placeholder);
                        base_entries[i] = (key, merge(old, value));
                    }
                    None => {
                        index.insert(key.name.clone(), base_entries.len());
                        base_entries.push((key, value));
                    }
                }
            }
            Node {
                value: Value::Map(base_entries),
                span: overlay.span,
            }
        }
        (_, value) => Node {
            value,
            span: overlay.span,
        },
    }
}

/// `--set protocol.min_samples=50` or `--set shapes.product.M=[1,2]`.
fn apply_override(root: &mut Node, text: &str, budget: &mut Budget) -> Result<(), Diagnostic> {
    let origin = PathBuf::from(format!("--set {text}"));
    let Some((path, value_text)) = text.split_once('=') else {
        return Err(
            Diagnostic::in_file(&origin, format!("`--set {text}` has no `=`"))
                .help("write --set key.path=value, for example --set protocol.min_samples=50"),
        );
    };
    let value = yaml::parse_str(&origin, value_text.to_string(), budget)?;
    let parts: Vec<&str> = path.split('.').collect();
    if parts.iter().any(|p| p.is_empty()) {
        return Err(
            Diagnostic::in_file(&origin, format!("`{path}` is not a key path"))
                .help("separate keys with single dots"),
        );
    }
    let mut node = root;
    for (i, part) in parts.iter().enumerate() {
        let last = i + 1 == parts.len();
        if !matches!(node.value, Value::Map(_)) {
            node.value = Value::Map(Vec::new());
        }
        let Value::Map(entries) = &mut node.value else {
            unreachable!()
        };
        let pos = match entries.iter().position(|(k, _)| k.name == *part) {
            Some(pos) => pos,
            None => {
                let span = value.span;
                entries.push((
                    Key {
                        name: part.to_string(),
                        span,
                    },
                    Node {
                        value: Value::Map(Vec::new()),
                        span,
                    },
                ));
                entries.len() - 1
            }
        };
        if last {
            entries[pos].1 = value.clone();
            return Ok(());
        }
        node = &mut entries[pos].1;
    }
    Ok(())
}
