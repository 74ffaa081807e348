//! User-facing diagnostics: a message tied to a place in a source file.
//!
//! Every error a user can fix by editing a file is a [`Diagnostic`]: it names
//! `file:line:column`, quotes the line, and says what to change. Rendering is
//! plain text (no colour) so messages are stable for snapshot tests and logs.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

/// A loaded source file. Spans point into one of these by [`FileId`].
#[derive(Debug)]
pub struct SourceFile {
    pub path: PathBuf,
    pub text: String,
    /// Whether a diagnostic may quote its lines: a YAML manifest (or a
    /// `--set` value) of plain text. Other files (a shape CSV, a file that
    /// is not a manifest) are only pointed at, never quoted: an error must
    /// not print what a file holds.
    pub quotable: bool,
}

/// The longest part of a line a diagnostic quotes.
const MAX_QUOTED_CHARS: usize = 160;

/// Index into the process-wide source registry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct FileId(u32);

impl FileId {
    /// The registry index, for carrying a span through serde.
    pub fn raw(self) -> u32 {
        self.0
    }

    pub fn from_raw(index: u32) -> FileId {
        FileId(index)
    }
}

fn registry() -> &'static Mutex<Vec<Arc<SourceFile>>> {
    static FILES: OnceLock<Mutex<Vec<Arc<SourceFile>>>> = OnceLock::new();
    FILES.get_or_init(|| Mutex::new(Vec::new()))
}

/// Registers a file's text so diagnostics can quote it later.
pub fn add_source(path: &Path, text: String) -> FileId {
    // By the name of the file itself, not of a link to it.
    let real = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    let manifest = path.to_string_lossy().starts_with("--set ")
        || real.extension().is_some_and(|e| e == "yaml" || e == "yml");
    let plain = !text
        .chars()
        .any(|c| c.is_control() && !matches!(c, '\n' | '\r' | '\t'));
    let mut files = registry().lock().expect("source registry poisoned");
    files.push(Arc::new(SourceFile {
        path: path.to_path_buf(),
        quotable: manifest && plain,
        text,
    }));
    FileId((files.len() - 1) as u32)
}

pub fn source(id: FileId) -> Option<Arc<SourceFile>> {
    registry()
        .lock()
        .expect("source registry poisoned")
        .get(id.0 as usize)
        .cloned()
}

/// A position in a registered file: 1-based line and column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Span {
    pub file: FileId,
    pub line: usize,
    pub col: usize,
}

impl Span {
    pub fn path(&self) -> PathBuf {
        source(self.file)
            .map(|f| f.path.clone())
            .unwrap_or_default()
    }
}

impl fmt::Display for Span {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.path().display(), self.line, self.col)
    }
}

/// An error at a place in a file, with an optional hint on what to change.
#[derive(Debug, Clone, PartialEq)]
pub struct Diagnostic {
    pub span: Option<Span>,
    /// A file without a position (a missing file, a file that is not UTF-8).
    pub path: Option<PathBuf>,
    pub message: String,
    pub help: Option<String>,
}

impl Diagnostic {
    pub fn at(span: Span, message: impl Into<String>) -> Self {
        Diagnostic {
            span: Some(span),
            path: None,
            message: message.into(),
            help: None,
        }
    }

    pub fn in_file(path: &Path, message: impl Into<String>) -> Self {
        Diagnostic {
            span: None,
            path: Some(path.to_path_buf()),
            message: message.into(),
            help: None,
        }
    }

    pub fn help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "error: {}", self.message)?;
        let mut pad = String::from(" ");
        match (self.span, &self.path) {
            (Some(span), _) => {
                writeln!(f, "  --> {span}")?;
                if let Some(file) = source(span.file).filter(|f| f.quotable) {
                    let line = file.text.lines().nth(span.line.saturating_sub(1));
                    if let Some(line) = line.and_then(|l| quoted(l, span.col)) {
                        let number = span.line.to_string();
                        pad = " ".repeat(number.len());
                        writeln!(f, "{pad} |")?;
                        writeln!(f, "{number} | {line}")?;
                        // Columns count characters; tabs are kept so the caret lines up.
                        let lead: String = line
                            .chars()
                            .take(span.col.saturating_sub(1))
                            .map(|c| if c == '\t' { '\t' } else { ' ' })
                            .collect();
                        writeln!(f, "{pad} | {lead}^")?;
                    }
                }
            }
            (None, Some(path)) => writeln!(f, "  --> {}", path.display())?,
            (None, None) => {}
        }
        if let Some(help) = &self.help {
            writeln!(f, "{pad} = help: {help}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Diagnostic {}

/// The start of a line, at most [`MAX_QUOTED_CHARS`]; `None` when the
/// column lies past that (a caret far off to the right helps nobody).
fn quoted(line: &str, col: usize) -> Option<String> {
    if col > MAX_QUOTED_CHARS {
        return None;
    }
    let mut out: String = line.chars().take(MAX_QUOTED_CHARS).collect();
    if line.chars().nth(MAX_QUOTED_CHARS).is_some() {
        out.push_str(" ...");
    }
    Some(out)
}

/// Several diagnostics from one stage; validation reports all it finds.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Diagnostics(pub Vec<Diagnostic>);

impl fmt::Display for Diagnostics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{d}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Diagnostics {}

impl From<Diagnostic> for Diagnostics {
    fn from(d: Diagnostic) -> Self {
        Diagnostics(vec![d])
    }
}

/// "did you mean" for a misspelt name: the closest candidate, if close enough.
pub fn did_you_mean<'a>(
    name: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|c| (strsim::jaro_winkler(name, c), c))
        .filter(|(score, _)| *score > 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, c)| c)
}
